// AdamW with decoupled weight decay (Loshchilov & Hutter), the learning-rate
// schedule (linear warmup, then cosine decay) and global-norm gradient
// clipping, over the model's flat parameter and gradient buffers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "relpos/nn/model.hpp"

namespace relpos::train {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.99, eps = 1e-8;
  double weight_decay = 0.1;  // applied only where the parameter table says weight_decay
};

// The PyTorch torch.optim.AdamW update, per element, step t = 1, 2, ...:
//   p -= lr * wd * p                      (decayed slices only, before the moments)
//   m  = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// with g = gradient_scale * gradient (clipping folded into the same pass).
// Element-wise (vectorised on every SIMD target with the same roundings), so
// the result depends neither on the number of threads nor on the CPU.
class AdamW {
 public:
  AdamW(const std::vector<nn::ParameterInfo>& table, int64_t size, AdamWConfig config = {});
  void step(std::span<float> parameters, std::span<const float> gradients, double lr, float gradient_scale = 1.0f);

  const std::vector<uint8_t>& decay_mask() const { return decay_; }
  int64_t t = 0;             // steps taken
  std::vector<float> m, v;   // first and second moments
  int num_threads = 0;       // OpenMP threads; 0 = all

 private:
  struct Piece {
    int64_t offset, size;
    bool decays;
  };
  AdamWConfig config_;
  std::vector<uint8_t> decay_;  // 1 where weight decay applies
  std::vector<Piece> pieces_;   // the buffer in runs of equal decay, each at most 8192 elements
};

// Learning rate at `step` (0-based): linear warmup from peak/warmup to peak
// over `warmup` steps, then cosine decay from peak to min_ratio * peak at
// step total - 1 (and min_ratio * peak beyond).
double learning_rate(int64_t step, int64_t warmup, int64_t total, double peak, double min_ratio = 0.1);

// The global L2 norm of the gradients. The sum of squares is taken over fixed
// blocks in double and added in block order, so the result does not depend on
// the number of threads.
double gradient_norm(std::span<const float> gradients, int num_threads = 0);

// The factor that brings a gradient of norm `norm` to at most max_norm
// (torch.nn.utils.clip_grad_norm_'s max_norm / (norm + 1e-6)); 1 when
// max_norm <= 0 or the norm is below it. AdamW::step applies it.
float clip_factor(double norm, double max_norm);

}  // namespace relpos::train
