#include "relpos/train/optimizer.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

#include "../backend/simd.hpp"

namespace relpos::train {

namespace {
int threads_or_all(int n) { return n > 0 ? n : omp_get_max_threads(); }
}  // namespace

AdamW::AdamW(const std::vector<nn::ParameterInfo>& table, int64_t size, AdamWConfig config)
    : m(size_t(size), 0.f), v(size_t(size), 0.f), config_(config), decay_(size_t(size), 0) {
  if (!(config.beta1 >= 0 && config.beta1 < 1 && config.beta2 >= 0 && config.beta2 < 1 && config.eps > 0 &&
        config.weight_decay >= 0))
    throw std::invalid_argument("AdamW: need 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0");
  for (const nn::ParameterInfo& p : table) {
    if (p.offset < 0 || p.size < 0 || p.offset + p.size > size)
      throw std::invalid_argument("AdamW: parameter '" + p.name + "' lies outside the buffer");
    if (p.weight_decay) std::fill_n(decay_.begin() + p.offset, p.size, uint8_t(1));
  }
  // Runs of equal decay, cut into pieces small enough to share among threads.
  constexpr int64_t kPiece = 8192;
  for (int64_t begin = 0; begin < size;) {
    int64_t end = begin + 1;
    while (end < size && end - begin < kPiece && decay_[size_t(end)] == decay_[size_t(begin)]) ++end;
    pieces_.push_back({begin, end - begin, decay_[size_t(begin)] != 0});
    begin = end;
  }
}

void AdamW::step(std::span<float> parameters, std::span<const float> gradients, double lr, float gradient_scale) {
  if (parameters.size() != m.size() || gradients.size() != m.size())
    throw std::invalid_argument("AdamW::step: buffers of " + std::to_string(parameters.size()) + " / " +
                                std::to_string(gradients.size()) + " floats, expected " + std::to_string(m.size()));
  ++t;
  simd::AdamwStep s;
  s.beta1 = float(config_.beta1), s.beta2 = float(config_.beta2);
  s.step_size = float(lr / (1 - std::pow(config_.beta1, double(t))));
  s.v_correction = float(1 / std::sqrt(1 - std::pow(config_.beta2, double(t))));
  s.eps = float(config_.eps);
  s.gradient_scale = gradient_scale;
  const float decay = float(1 - lr * config_.weight_decay);
  const int64_t pieces = int64_t(pieces_.size());
#pragma omp parallel for num_threads(threads_or_all(num_threads)) schedule(static) if (m.size() > 32768)
  for (int64_t i = 0; i < pieces; ++i) {
    const Piece& piece = pieces_[size_t(i)];
    simd::AdamwStep local = s;
    local.decay = piece.decays ? decay : 1.0f;  // p * 1 is p: no decay
    const int64_t at = piece.offset;
    simd::adamw_update(parameters.data() + at, gradients.data() + at, m.data() + at, v.data() + at, piece.size, local);
  }
}

double learning_rate(int64_t step, int64_t warmup, int64_t total, double peak, double min_ratio) {
  if (warmup > 0 && step < warmup) return peak * double(step + 1) / double(warmup);
  const int64_t decay_steps = total - 1 - warmup;
  if (decay_steps <= 0) return peak;
  const double progress = std::min(1.0, double(step - warmup) / double(decay_steps));
  return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + std::cos(std::numbers::pi * progress)));
}

double gradient_norm(std::span<const float> gradients, int num_threads) {
  constexpr int64_t kBlock = 4096;
  const int64_t n = int64_t(gradients.size()), blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(size_t(blocks), 0.0);
  const float* g = gradients.data();
#pragma omp parallel for num_threads(threads_or_all(num_threads)) schedule(static) if (blocks > 8)
  for (int64_t b = 0; b < blocks; ++b) {
    partial[size_t(b)] = simd::sum_of_squares(g + b * kBlock, std::min(n, (b + 1) * kBlock) - b * kBlock);
  }
  double total = 0;
  for (double s : partial) total += s;
  return std::sqrt(total);
}

float clip_factor(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? float(max_norm / (norm + 1e-6)) : 1.0f;
}

}  // namespace relpos::train
