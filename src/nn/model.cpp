// relpos::nn::Model: the float ModelImpl behind the public interface, plus
// the argument checks of the span-taking calls.
#include "relpos/nn/model.hpp"

#include <stdexcept>
#include <string>

#include "model_impl.hpp"

namespace relpos::nn {

struct Model::Impl {
  explicit Impl(const ModelConfig& config) : model(config) {}
  ModelImpl<float> model;
};

namespace {

void check_span(const char* name, std::size_t have, int64_t want) {
  if (static_cast<int64_t>(have) != want)
    throw std::invalid_argument(std::string(name) + ": expected " + std::to_string(want) + " elements, got " +
                                std::to_string(have));
}

void check_dims(int batch, int length, const char* length_name) {
  if (batch < 1) throw std::invalid_argument("batch: must be >= 1, got " + std::to_string(batch));
  if (length < 1)
    throw std::invalid_argument(std::string(length_name) + ": must be >= 1, got " + std::to_string(length));
}

}  // namespace

Model::Model(const ModelConfig& config) : impl_(std::make_unique<Impl>(config)) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

const ModelConfig& Model::config() const { return impl_->model.config(); }
std::span<float> Model::parameters() { return impl_->model.parameters(); }
std::span<const float> Model::parameters() const { return impl_->model.parameters(); }
std::span<float> Model::gradients() { return impl_->model.gradients(); }
const std::vector<ParameterInfo>& Model::parameter_table() const { return impl_->model.layout().table; }
void Model::zero_gradients() { std::fill(impl_->model.gradients().begin(), impl_->model.gradients().end(), 0.0f); }

float Model::forward_backward(std::span<const uint8_t> tokens, int batch, int length, KVCache* memory,
                              const TrainingDropout& dropout) {
  check_dims(batch, length, "length");
  check_span("tokens", tokens.size(), int64_t(batch) * (length + 1));
  impl_->model.num_threads = num_threads;
  impl_->model.precision = precision;
  return static_cast<float>(impl_->model.loss(tokens.data(), batch, length, memory, 0, true, dropout));
}

float Model::loss(std::span<const uint8_t> tokens, int batch, int length, KVCache* memory, int first_scored) {
  check_dims(batch, length, "length");
  check_span("tokens", tokens.size(), int64_t(batch) * (length + 1));
  impl_->model.num_threads = num_threads;
  impl_->model.precision = precision;
  return static_cast<float>(impl_->model.loss(tokens.data(), batch, length, memory, first_scored, false));
}

KVCache Model::make_cache(int batch, int capacity) const {
  return impl_->model.make_cache<KVCache>(batch, capacity);
}

void Model::decode(std::span<const uint8_t> tokens, int batch, int count, KVCache& cache, std::span<float> logits) {
  check_dims(batch, count, "count");
  check_span("tokens", tokens.size(), int64_t(batch) * count);
  check_span("logits", logits.size(), int64_t(batch) * kVocabulary);
  impl_->model.num_threads = num_threads;
  impl_->model.precision = precision;
  const float* all = impl_->model.logits(tokens.data(), batch, count, &cache);
  for (int b = 0; b < batch; ++b)
    std::copy_n(all + (int64_t(b) * count + count - 1) * kVocabulary, kVocabulary, logits.data() + b * kVocabulary);
}

void Model::logits(std::span<const uint8_t> tokens, int batch, int length, std::span<float> out) {
  check_dims(batch, length, "length");
  check_span("tokens", tokens.size(), int64_t(batch) * length);
  check_span("out", out.size(), int64_t(batch) * length * kVocabulary);
  impl_->model.num_threads = num_threads;
  impl_->model.precision = precision;
  const float* all = impl_->model.logits(tokens.data(), batch, length, static_cast<KVCache*>(nullptr));
  std::copy_n(all, out.size(), out.data());
}

}  // namespace relpos::nn
