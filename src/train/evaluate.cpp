#include "relpos/train/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace relpos::train {

namespace {

void check_fits(int64_t bytes, int length, const char* what) {
  if (length < 1) throw std::invalid_argument(std::string(what) + ": length must be >= 1");
  if (bytes < int64_t(length) + 1)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(bytes) +
                                " bytes are fewer than one window of length + 1 = " + std::to_string(length + 1));
}

double bits(double nats_sum, int64_t count) { return nats_sum / std::numbers::ln2 / double(count); }

}  // namespace

std::vector<Window> nonoverlapping_windows(int64_t bytes, int length) {
  check_fits(bytes, length, "non-overlapping windows");
  std::vector<Window> out;
  for (int64_t start = 0; start + length + 1 <= bytes; start += length) out.push_back({start, 0});
  return out;
}

std::vector<Window> sliding_windows(int64_t bytes, int length, int stride) {
  check_fits(bytes, length, "sliding windows");
  if (stride < 1 || stride > length)
    throw std::invalid_argument("sliding windows: stride must be in [1, length = " + std::to_string(length) +
                                "], got " + std::to_string(stride));
  std::vector<Window> out{{0, 0}};
  for (int64_t start = stride; start + length + 1 <= bytes; start += stride) out.push_back({start, length - stride});
  return out;
}

Score evaluate_windows(nn::Model& model, std::span<const uint8_t> data, int length, const std::vector<Window>& windows,
                       int batch) {
  if (windows.empty()) throw std::invalid_argument("evaluate_windows: no windows");
  if (batch < 1) throw std::invalid_argument("evaluate_windows: batch must be >= 1");
  const size_t row = size_t(length) + 1;
  std::vector<uint8_t> tokens(size_t(batch) * row);
  double nats = 0;
  int64_t scored = 0;
  for (size_t i = 0; i < windows.size();) {
    // One pass takes consecutive windows that score from the same index.
    int rows = 0;
    const int first = windows[i].first_scored;
    if (first < 0 || first >= length) throw std::invalid_argument("evaluate_windows: first_scored out of range");
    for (; rows < batch && i < windows.size() && windows[i].first_scored == first; ++rows, ++i) {
      const Window& w = windows[i];
      if (w.start < 0 || w.start + int64_t(row) > int64_t(data.size()))
        throw std::invalid_argument("evaluate_windows: window at " + std::to_string(w.start) + " runs past the data");
      std::copy_n(data.begin() + w.start, row, tokens.begin() + int64_t(size_t(rows) * row));
    }
    const int64_t count = int64_t(rows) * (length - first);
    nats += double(model.loss(std::span(tokens).first(size_t(rows) * row), rows, length, nullptr, first)) * double(count);
    scored += count;
  }
  return {bits(nats, scored), scored};
}

Score evaluate_with_memory(nn::Model& model, std::span<const uint8_t> data, int segment, int memory, int batch) {
  if (batch < 1 || memory < 0) throw std::invalid_argument("evaluate_with_memory: batch >= 1 and memory >= 0 needed");
  const int64_t stream = int64_t(data.size()) / batch;
  check_fits(stream, segment, "memory evaluation (bytes per stream)");
  const int64_t segments = (stream - 1) / segment;
  const size_t row = size_t(segment) + 1;
  std::vector<uint8_t> tokens(size_t(batch) * row);
  nn::KVCache cache;
  if (memory > 0) cache = model.make_cache(batch, memory);
  double nats = 0;
  for (int64_t s = 0; s < segments; ++s) {
    for (int b = 0; b < batch; ++b)
      std::copy_n(data.begin() + b * stream + s * segment, row, tokens.begin() + int64_t(size_t(b) * row));
    nats += double(model.loss(tokens, batch, segment, memory > 0 ? &cache : nullptr)) * double(batch) * segment;
  }
  const int64_t scored = segments * batch * segment;
  return {bits(nats, scored), scored};
}

}  // namespace relpos::train
