#include "relpos/train/trainer.hpp"

#include "relpos/attention.hpp"

#include <charconv>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

namespace relpos::train {

namespace {

// The shortest text that reads back as v: exact, and a resume refused for a
// difference names 0.1, not 0.10000000000000001.
std::string number_text(double v) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

std::map<std::string, std::string> parse_lines(const std::string& text, const char* what) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) throw std::invalid_argument(std::string(what) + ": line without '=': '" + line + "'");
    out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

template <class T>
T parse_number(const std::string& key, const std::string& value) {
  std::istringstream in(value);
  T v{};
  if (!(in >> v) || !in.eof()) throw std::invalid_argument("training config: " + key + ": bad value '" + value + "'");
  return v;
}

nn::Precision parse_precision_value(const std::string& value) {
  try {
    return nn::parse_precision(value);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("training config: ") + e.what());
  }
}

}  // namespace

void TrainConfig::validate() const {
  auto need = [](bool ok, const char* field, const std::string& rule) {
    if (!ok) throw std::invalid_argument(std::string("training config: ") + field + " " + rule);
  };
  need(steps >= 1, "steps", "must be >= 1");
  need(batch >= 1 && batch <= (1 << 20), "batch", "must be in [1, 1048576]");
  need(std::isfinite(lr) && lr > 0, "lr", "must be > 0");
  need(min_lr_ratio >= 0 && min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]");
  need(warmup >= 0, "warmup", "must be >= 0");
  need(weight_decay >= 0 && std::isfinite(weight_decay), "weight_decay", "must be >= 0");
  need(beta1 >= 0 && beta1 < 1, "beta1", "must be in [0, 1)");
  need(beta2 >= 0 && beta2 < 1, "beta2", "must be in [0, 1)");
  need(clip >= 0 && std::isfinite(clip), "clip", "must be >= 0");
  need(xl_memory >= 0 && xl_memory <= kMaxXlMemory, "xl_memory", "must be in [0, " + std::to_string(kMaxXlMemory) + "]");
  need(attention_dropout >= 0 && attention_dropout < 1, "attention_dropout",
       "must be in [0, 1), got " + number_text(attention_dropout));
}

std::string TrainConfig::to_text() const {
  std::ostringstream o;
  o << "steps=" << steps << "\nbatch=" << batch << "\nlr=" << number_text(lr)
    << "\nmin_lr_ratio=" << number_text(min_lr_ratio) << "\nwarmup=" << warmup
    << "\nweight_decay=" << number_text(weight_decay) << "\nbeta1=" << number_text(beta1)
    << "\nbeta2=" << number_text(beta2) << "\nclip=" << number_text(clip) << "\nseed=" << seed
    << "\nprecision=" << nn::to_string(precision) << "\nxl_memory=" << xl_memory
    << "\nattention_dropout=" << number_text(attention_dropout) << "\n";
  return o.str();
}

TrainConfig TrainConfig::from_text(const std::string& text) {
  TrainConfig c;
  for (const auto& [key, value] : parse_lines(text, "training config")) {
    if (key == "steps") c.steps = parse_number<int64_t>(key, value);
    else if (key == "batch") c.batch = parse_number<int64_t>(key, value);
    else if (key == "lr") c.lr = parse_number<double>(key, value);
    else if (key == "min_lr_ratio") c.min_lr_ratio = parse_number<double>(key, value);
    else if (key == "warmup") c.warmup = parse_number<int64_t>(key, value);
    else if (key == "weight_decay") c.weight_decay = parse_number<double>(key, value);
    else if (key == "beta1") c.beta1 = parse_number<double>(key, value);
    else if (key == "beta2") c.beta2 = parse_number<double>(key, value);
    else if (key == "clip") c.clip = parse_number<double>(key, value);
    else if (key == "seed") c.seed = parse_number<uint64_t>(key, value);
    else if (key == "precision") c.precision = parse_precision_value(value);
    else if (key == "xl_memory") c.xl_memory = parse_number<int>(key, value);
    else if (key == "attention_dropout") c.attention_dropout = parse_number<double>(key, value);
    else throw std::invalid_argument("training config: unknown key '" + key + "'");
  }
  c.validate();
  return c;
}

std::string config_difference(const std::string& stored, const std::string& requested) {
  const auto a = parse_lines(stored, "stored config"), b = parse_lines(requested, "requested config");
  for (const auto& [key, value] : a) {
    const auto it = b.find(key);
    if (it == b.end()) return key + ": " + value + " in the checkpoint, absent in the request";
    if (it->second != value) return key + ": " + value + " in the checkpoint, " + it->second + " requested";
  }
  for (const auto& [key, value] : b)
    if (!a.count(key)) return key + ": absent in the checkpoint, " + value + " requested";
  return "";
}

Trainer::Trainer(const nn::ModelConfig& model, const TrainConfig& config, std::span<const uint8_t> train_data,
                 std::string data_source)
    : config_((config.validate(), config)),
      model_(model),
      optimizer_(model_.parameter_table(), int64_t(model_.parameters().size()),
                 AdamWConfig{config.beta1, config.beta2, 1e-8, config.weight_decay}),
      data_(train_data),
      data_source_(std::move(data_source)),
      data_hash_(fnv1a64(train_data)),
      sampler_(train_data, int(config.batch), model.context, config.seed,
               model.position == "xl" ? BatchSampler::Layout::contiguous
                                                     : BatchSampler::Layout::random),
      tokens_(size_t(config.batch) * size_t(model.context + 1)) {
  if (uses_memory()) memory_ = model_.make_cache(int(config_.batch), memory_capacity());
  model_.precision = config_.precision;
}

int Trainer::memory_capacity() const {
  return config_.xl_memory > 0 ? config_.xl_memory : model_.config().context;
}

void Trainer::set_threads(int n) {
  if (n < 0 || n > relpos::kMaxThreads)
    throw std::invalid_argument("relpos: threads: must be in [0, " + std::to_string(relpos::kMaxThreads) + "], got " +
                                std::to_string(n));
  model_.num_threads = n;
  optimizer_.num_threads = n;
}

float Trainer::step() {
  last_lr_ = learning_rate(step_, config_.warmup, config_.steps, config_.lr, config_.min_lr_ratio);
  const bool restarted = sampler_.next(tokens_);
  // The streams begin again: memory of their ends must not leak into their starts.
  if (uses_memory() && restarted) memory_ = model_.make_cache(int(config_.batch), memory_capacity());
  model_.zero_gradients();
  const std::string at_step = " at step " + std::to_string(step_ + 1) + " (try a lower --lr)";
  float loss = 0;
  try {
    loss = model_.forward_backward(tokens_, int(config_.batch), length(), uses_memory() ? &memory_ : nullptr,
                                   {config_.attention_dropout, config_.seed, step_});
  } catch (const ScoresOverflow& e) {  // a diverging run's activations, before its loss is computed
    throw std::runtime_error("the run diverged" + at_step + ": " + e.what());
  }
  if (!std::isfinite(loss)) throw std::runtime_error("the loss is not finite" + at_step);
  last_grad_norm_ = gradient_norm(model_.gradients(), model_.num_threads);
  optimizer_.step(model_.parameters(), model_.gradients(), last_lr_, clip_factor(last_grad_norm_, config_.clip));
  ++step_;
  return loss;
}

Checkpoint Trainer::checkpoint() const {
  Checkpoint c;
  c.model_config = model_.config().to_text();
  c.train_config = config_.to_text();
  c.data_source = data_source_;
  c.data_bytes = int64_t(data_.size());
  c.data_hash = data_hash_;
  c.step = step_;
  const auto params = model_.parameters();
  c.parameters.assign(params.begin(), params.end());
  c.adam_steps = optimizer_.t;
  c.adam_m = optimizer_.m;
  c.adam_v = optimizer_.v;
  c.sampler = sampler_.state();
  c.has_memory = uses_memory();
  if (c.has_memory) c.memory = memory_;
  return c;
}

void Trainer::resume(const Checkpoint& c) {
  const auto refuse = [](const std::string& why) {
    throw std::runtime_error("cannot resume from this checkpoint: " + why);
  };
  if (const std::string d = config_difference(c.model_config, model_.config().to_text()); !d.empty())
    refuse("model configuration differs (" + d + ")");
  // Only the step count may differ: a finished run can be extended.
  TrainConfig stored = TrainConfig::from_text(c.train_config);
  stored.steps = config_.steps;
  if (const std::string d = config_difference(stored.to_text(), config_.to_text()); !d.empty())
    refuse("training configuration differs (" + d + ")");
  if (c.step > config_.steps)
    refuse("it has taken " + std::to_string(c.step) + " steps, more than the " + std::to_string(config_.steps) +
           " requested");
  if (c.data_bytes != int64_t(data_.size()) || c.data_hash != data_hash_)
    refuse("it was trained on other data (" + std::to_string(c.data_bytes) + " training bytes from '" +
           c.data_source + "', now " + std::to_string(data_.size()) + " bytes from '" + data_source_ + "')");
  if (c.parameters.size() != model_.parameters().size()) refuse("parameter count differs");
  if (c.step < 0 || c.adam_steps != c.step) refuse("inconsistent step counts");
  if (c.has_memory != uses_memory()) refuse("Transformer-XL memory present in only one of checkpoint and model");
  if (c.has_memory) {
    const nn::KVCache fresh = model_.make_cache(int(config_.batch), memory_capacity());
    bool same = c.memory.batch == fresh.batch && c.memory.capacity == fresh.capacity &&
                c.memory.keys.size() == fresh.keys.size() && c.memory.values.size() == fresh.values.size() &&
                c.memory.length >= 0 && c.memory.length <= c.memory.capacity;
    for (size_t l = 0; same && l < fresh.keys.size(); ++l)
      same = c.memory.keys[l].size() == fresh.keys[l].size() && c.memory.values[l].size() == fresh.values[l].size();
    if (!same) refuse("its Transformer-XL memory does not fit the model");
  }
  sampler_.restore(c.sampler);
  std::copy(c.parameters.begin(), c.parameters.end(), model_.parameters().begin());
  optimizer_.t = c.adam_steps;
  optimizer_.m = c.adam_m;
  optimizer_.v = c.adam_v;
  if (c.has_memory) memory_ = c.memory;
  step_ = c.step;
}

}  // namespace relpos::train
