#include "extrapolation.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "fits_memory.hpp"
#include "model_memory.hpp"

namespace relpos::cli {

namespace {

size_t capped(size_t bytes, const EvalSettings& s) {
  return s.max_bytes > 0 && int64_t(bytes) > s.max_bytes ? size_t(s.max_bytes) : bytes;
}

// The sliding windows' stride at evaluation length `length`.
int64_t stride_at(const EvalSettings& s, int64_t length) {
  return s.stride > 0 ? std::min(s.stride, length) : std::max<int64_t>(1, length / 2);
}

// What evaluate_lengths holds at once at the multiple that needs most: the
// model, and for evaluate_windows the tokens of a pass (`batch` rows of a
// window and one byte) and the activations of a pass's rows (no more than
// the windows there are); for Transformer-XL's memory evaluation the same
// over `batch` streams of segments, with their key/value cache.
double evaluation_bytes(double bytes, const EvalSettings& s, const nn::ModelConfig& c) {
  const double batch = double(s.batch), segment = double(c.context);
  double most = 0;
  for (int64_t multiple : s.multiples) {
    const double length = double(multiple) * segment;
    double windows = std::floor((bytes - 1) / length);  // non-overlapping: windows of length + 1 share a byte
    if (s.sliding)
      windows = std::max(windows, 1 + std::floor((bytes - 1 - length) / double(stride_at(s, int64_t(length)))));
    double need = batch * (length + 1) + model_bytes(c, std::min(batch, std::max(windows, 1.0)), length, false);
    if (c.position == "xl")
      need = std::max(need, batch * (segment + 1) + cache_bytes(c, batch, length - segment) +
                                model_bytes(c, batch, segment, false));
    most = std::max(most, need);
  }
  return most;
}

}  // namespace

void check_evaluation_fits(size_t validation_bytes, const EvalSettings& s, const nn::ModelConfig& config) {
  const size_t bytes = capped(validation_bytes, s);
  const int64_t multiple = *std::max_element(s.multiples.begin(), s.multiples.end()),
                longest = multiple * int64_t(config.context);
  if (int64_t(bytes) < longest + 1)
    throw std::invalid_argument("the validation data (the last 10% of the data" +
                                std::string(bytes < validation_bytes ? ", capped by the byte limit" : "") + ") has " +
                                std::to_string(bytes) + " bytes, fewer than the longest evaluation window + 1 = " +
                                std::to_string(longest + 1) + ": use more data or shorter lengths");
  if (longest > std::numeric_limits<int>::max())
    throw std::invalid_argument("the longest evaluation window, " + std::to_string(longest) +
                                " bytes, is longer than a model reads at once (2147483647): use shorter lengths");
  check_fits_memory(evaluation_bytes(double(bytes), s, config),
                    {{"windows per pass", s.batch}, {"--multiples", multiple}, {"training length", config.context},
                     {"width", config.width}, {"layers", config.layers}});
}

std::vector<LengthScore> evaluate_lengths(nn::Model& model, std::span<const uint8_t> validation,
                                          const EvalSettings& s, const std::function<void(size_t)>& on_done) {
  const int64_t train_length = model.config().context;
  check_evaluation_fits(validation.size(), s, model.config());
  const auto data = validation.first(capped(validation.size(), s));
  const bool xl = model.config().position == "xl";
  std::vector<LengthScore> out;
  for (size_t i = 0; i < s.multiples.size(); ++i) {
    LengthScore r;
    r.multiple = s.multiples[i];
    r.length = r.multiple * train_length;
    const int length = int(r.length), batch = int(s.batch);
    r.windows = train::evaluate_windows(model, data, length, train::nonoverlapping_windows(int64_t(data.size()), length),
                                        batch);
    if (s.sliding) {
      r.stride = stride_at(s, r.length);
      r.sliding = train::evaluate_windows(model, data, length,
                                          train::sliding_windows(int64_t(data.size()), length, int(r.stride)), batch);
    }
    if (xl) {
      r.has_memory = true;
      r.memory = train::evaluate_with_memory(model, data, int(train_length), int((r.multiple - 1) * train_length), batch);
    }
    out.push_back(r);
    if (on_done) on_done(i);
  }
  return out;
}

namespace {
Json score_json(const train::Score& s) { return {{"bits_per_byte", s.bits_per_byte}, {"bytes_scored", s.bytes_scored}}; }
}  // namespace

Json scores_json(const std::vector<LengthScore>& scores) {
  Json rows = Json::array();
  for (const LengthScore& r : scores) {
    Json row = {{"multiple", r.multiple}, {"length", r.length}, {"windows", score_json(r.windows)}};
    if (r.stride > 0) row["sliding"] = score_json(r.sliding), row["stride"] = r.stride;
    if (r.has_memory) row["memory"] = score_json(r.memory), row["memory_length"] = r.length - r.length / r.multiple;
    rows.push_back(row);
  }
  return rows;
}

train::Corpus corpus_from_source(const std::string& source) {
  const std::string prefix = "fortunes:";
  if (source.rfind(prefix, 0) == 0) return train::load_default_corpus(source.substr(prefix.size()));
  if (source.empty()) throw std::runtime_error("the checkpoint does not name its data: pass --data FILE");
  return train::load_file(source);
}

}  // namespace relpos::cli
