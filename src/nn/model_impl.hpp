// The transformer behind relpos::nn::Model, templated on the number type so
// that tests check its gradients by central differences in double. The public
// Model is ModelImpl<float> behind a pimpl.
//
// Block l (pre-LayerNorm, GPT-2 style):
//   mid    = input + out_proj(attention(qkv_proj(ln1(input))))
//   output = mid + down(gelu(up(ln2(mid))))
// then final_ln and the output head, tied to the byte embedding:
//   logits = final_ln(stream) E^T.
// The first block's input is embed_scale() * E[byte] plus the absolute
// position embedding, if any.
// Tying follows GPT-2 / nanoGPT; for 256 bytes it saves a (256, width) matrix
// and gives the rare bytes of a small corpus an output row trained by their
// inputs as well.
//
// Precision::bfloat16 is mixed-precision training: every tensor that a GEMM
// or the attention reads is held at bfloat16 precision — the matrices and
// positional tables (rounded from the float32 parameters at each forward),
// the LayerNorm outputs, q/k/v, the attention output, GELU's output, and in
// the backward the output gradients those GEMMs and the attention read.
// GEMMs and the attention accumulate in float32 and write float32 (bias added
// in float32 before any rounding); the residual stream, LayerNorm, GELU's
// input, the logits, the cross-entropy, the softmax statistics and every
// parameter gradient stay float32, as do the parameters and the optimizer.
// The values are rounded in float32 buffers: the numbers are those of bf16
// storage with float32 accumulation. Where the CPU has bfloat16 products
// (AVX512-BF16, AMX) the GEMMs run them (layer_gemm); elsewhere float32 GEMMs
// multiply the same values: the same exact products, summed in another order.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "activations.hpp"
#include "attention_layer.hpp"
#include "cross_entropy.hpp"
#include "embedding.hpp"
#include "gelu.hpp"
#include "layer_norm.hpp"
#include "linear.hpp"
#include "parameter_layout.hpp"
#include "../backend/convert.hpp"
#include "../backend/signals.hpp"
#include "relpos/attention.hpp"
#include "relpos/position.hpp"
#include "residual.hpp"

namespace relpos::nn {

// KVCache with keys and values of any number type (the public KVCache is the
// float one; the double model of the tests uses KVCacheOf<double>).
template <class T>
struct KVCacheOf {
  int batch = 0, capacity = 0, length = 0;
  int64_t position = 0;
  std::vector<std::vector<T>> keys, values;
};

// Sets OpenMP's thread count for the GEMM library inside a call, restoring it after.
class OmpThreadsScope {
 public:
  explicit OmpThreadsScope(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~OmpThreadsScope() { omp_set_num_threads(saved_); }
  OmpThreadsScope(const OmpThreadsScope&) = delete;
  OmpThreadsScope& operator=(const OmpThreadsScope&) = delete;

 private:
  int saved_;
};

// Calls taking a cache accept KVCache or KVCacheOf<T> (any type with batch,
// capacity, length, position, keys and values as in KVCache, holding T).
template <class T>
class ModelImpl {
 public:
  explicit ModelImpl(const ModelConfig& config) : config_((config.validate(), config)), layout_(config) {
    params_.assign(layout_.total, T(0));
    grads_.assign(layout_.total, T(0));
    layout_.initialise(config.seed, params_.data());
    position_scheme(config_, scheme_options_);
  }

  const ModelConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  std::vector<T>& parameters() { return params_; }
  const std::vector<T>& parameters() const { return params_; }
  std::vector<T>& gradients() { return grads_; }
  int num_threads = 0;
  Precision precision = Precision::float32;

  // tokens (batch, length + 1): mean cross-entropy of tokens[:, first_scored + 1:]
  // given the preceding ones. With `backward`, gradients are added into
  // gradients(). `memory` gets this segment's keys and values.
  template <class Cache>
  double loss(const uint8_t* tokens, int batch, int length, Cache* memory, int first_scored, bool backward) {
    check_tokens(batch, length, "length");
    if (first_scored < 0 || first_scored >= length)
      throw std::invalid_argument("first_scored: must lie in [0, length), got " + std::to_string(first_scored));
    const AsyncSignalsHeld signals;  // the GEMMs' JIT kernels must not host a signal handler
    OmpThreadsScope scope(threads());
    forward(tokens, length + 1, batch, length, memory, backward);
    const int64_t n = int64_t(batch) * length;
    const T weight = T(1) / static_cast<T>(int64_t(batch) * (length - first_scored));
    targets_.resize(n);
    for (int64_t r = 0; r < n; ++r) {
      act_.row_weight[r] = r % length >= first_scored ? weight : T(0);
      targets_[r] = tokens[(r / length) * (length + 1) + r % length + 1];
    }
    const double value = cross_entropy_forward(act_.logits, targets_.data(), act_.row_weight, n, kVocabulary);
    if (backward) backward_pass(targets_.data());
    if (memory) append_to_cache(*memory);
    return value;
  }

  // Logits (batch, length, 256) of tokens (batch, length) after `cache`'s
  // positions (none when null), appending their keys and values to it.
  template <class Cache>
  const T* logits(const uint8_t* tokens, int batch, int length, Cache* cache) {
    check_tokens(batch, length, "count");
    const AsyncSignalsHeld signals;
    OmpThreadsScope scope(threads());
    forward(tokens, length, batch, length, cache, false);
    if (cache) append_to_cache(*cache);
    return act_.logits;
  }

  template <class Cache>
  Cache make_cache(int batch, int capacity) const {
    if (batch < 1) throw std::invalid_argument("batch: must be >= 1, got " + std::to_string(batch));
    if (capacity < 1) throw std::invalid_argument("capacity: must be >= 1, got " + std::to_string(capacity));
    Cache cache;
    cache.batch = batch;
    cache.capacity = capacity;
    const int64_t size = int64_t(batch) * config_.heads * capacity * head_dim();
    cache.keys.assign(config_.layers, {});
    cache.values.assign(config_.layers, {});
    for (int l = 0; l < config_.layers; ++l) {
      cache.keys[l].assign(size, T(0));
      cache.values[l].assign(size, T(0));
    }
    return cache;
  }

 private:
  int64_t head_dim() const { return config_.width / config_.heads; }
  int threads() const {
    if (num_threads < 0 || num_threads > kMaxThreads)
      throw std::invalid_argument("relpos: num_threads: must be in [0, " + std::to_string(kMaxThreads) + "], got " +
                                  std::to_string(num_threads));
    return num_threads > 0 ? num_threads : omp_get_max_threads();
  }
  const T* param(int64_t offset) const { return params_.data() + offset; }
  // A matrix or positional table as GEMMs and the attention read it.
  const T* operand(int64_t offset) const { return (bf16() ? operands_ : params_).data() + offset; }
  bool bf16() const { return precision == Precision::bfloat16; }
  // Rounds `count` values that a GEMM or the attention reads next to the
  // precision's storage (nothing in float32).
  void store(T* x, int64_t count) const {
    if (!bf16()) return;
    constexpr int64_t kBlock = 4096;
    for_each_row(threads(), (count + kBlock - 1) / kBlock, kBlock, [&](int64_t b) {
      convert::round_to_bf16(x + b * kBlock, std::min(kBlock, count - b * kBlock));
    });
  }
  // `x` as a GEMM reads it: itself in float32, else a rounded copy in `copy`.
  const T* stored_copy(const T* x, T* copy, int64_t count) const {
    if (!bf16()) return x;
    std::copy_n(x, count, copy);
    store(copy, count);
    return copy;
  }
  T* grad(int64_t offset) { return grads_.data() + offset; }

  static void check_tokens(int batch, int length, const char* length_name) {
    if (batch < 1) throw std::invalid_argument("batch: must be >= 1, got " + std::to_string(batch));
    if (length < 1)
      throw std::invalid_argument(std::string(length_name) + ": must be >= 1, got " + std::to_string(length));
  }

  template <class Cache>
  void check_cache(const Cache& c, int batch) const {
    const int64_t size = int64_t(c.batch) * config_.heads * c.capacity * head_dim();
    if (c.batch != batch)
      throw std::invalid_argument("cache: holds batch " + std::to_string(c.batch) + ", call has batch " +
                                  std::to_string(batch));
    if (c.capacity < 1 || c.length < 0 || c.length > c.capacity || c.position < c.length ||
        c.position > kMaxPosition)
      throw std::invalid_argument("cache: inconsistent capacity/length/position (make it with make_cache)");
    if (static_cast<int>(c.keys.size()) != config_.layers || static_cast<int>(c.values.size()) != config_.layers)
      throw std::invalid_argument("cache: needs one key and one value buffer per layer");
    for (int l = 0; l < config_.layers; ++l)
      if (static_cast<int64_t>(c.keys[l].size()) != size || static_cast<int64_t>(c.values[l].size()) != size)
        throw std::invalid_argument("cache: buffers of layer " + std::to_string(l) + " have the wrong size");
  }

  // The position scheme's parameters for layer l: its options, and its
  // tensors as the attention reads them (rounded in bfloat16; a bounded
  // tensor clamped to its bounds, in a copy).
  PositionParams<T> position_params(int l) const {
    PositionParams<T> p = scheme_options_;
    for_each_model_tensor(layout_.position_tensors, p, [&](std::size_t i, auto& view) {
      const ModelTensor& t = layout_.position_tensors[i];
      const T* data = operand(layout_.layers[l].position[i]);
      if (t.bounded()) {
        std::vector<T>& clamped = clamped_[l * layout_.position_tensors.size() + i];
        clamped.resize(t.size());
        for (std::size_t n = 0; n < clamped.size(); ++n)
          clamped[n] = std::clamp(data[n], T(t.floor), T(t.ceiling));
        data = clamped.data();
      }
      t.bind(view, data);
    });
    return p;
  }

  PositionGrads<T> position_grads(int l) {
    PositionGrads<T> g;
    PositionParams<T> unused;
    for_each_model_tensor(
        layout_.position_tensors, unused,
        [&](std::size_t i, auto&, auto& grad_view) {
          layout_.position_tensors[i].bind(grad_view, grad(layout_.layers[l].position[i]));
        },
        g);
    return g;
  }

  // A bounded tensor gets no gradient where it lies outside its bounds.
  void clamp_position_grads() {
    for (std::size_t i = 0; i < layout_.position_tensors.size(); ++i) {
      const ModelTensor& t = layout_.position_tensors[i];
      if (!t.bounded()) continue;
      for (int l = 0; l < (t.shared ? 1 : config_.layers); ++l) {
        const int64_t offset = layout_.layers[l].position[i];
        for (int64_t n = 0; n < t.size(); ++n)
          if (param(offset)[n] < T(t.floor) || param(offset)[n] > T(t.ceiling)) grad(offset)[n] = T(0);
      }
    }
  }

  AttentionLayerArgs<T> attention_args(int l) const {
    AttentionLayerArgs<T> a;
    const LayerActivations<T>& act = act_.layers[l];
    a.shape = shape_;
    a.qkv = act.qkv, a.keys = act.keys, a.values = act.values, a.out = act.attn, a.lse = act.lse;
    a.q_offset = first_position_;
    a.k_offset = first_position_ - shape_.memory;
    a.pos = position_params(l);
    a.threads = threads();
    return a;
  }

  T* layer_output(int l) { return l + 1 < config_.layers ? act_.layers[l + 1].input : act_.stream_out; }

  // Factor on the byte embedding at the input: sqrt(width) under sinusoidal
  // positions (the Transformer paper, fairseq's embed_scale), so that bytes
  // initialised at std 0.02 are not drowned by a sinusoid of amplitude 1; 1
  // for every other kind. The tied output head uses the unscaled matrix.
  T embed_scale() const {
    return config_.position == "sinusoidal" ? static_cast<T>(std::sqrt(double(config_.width))) : T(1);
  }

  // Input embeddings: embed_scale() * bytes plus, for the absolute kinds, the
  // embedding of the absolute position first_position_ + i.
  void embed(const uint8_t* tokens, int64_t token_stride) {
    const int64_t b_count = shape_.batch, len = shape_.length, w = config_.width, n = b_count * len;
    for (int64_t r = 0; r < n; ++r) {
      act_.tokens[r] = tokens[(r / len) * token_stride + r % len];
      const int64_t pos = first_position_ + r % len;
      act_.positions[r] = static_cast<int32_t>(std::min<int64_t>(pos, config_.context - 1));
    }
    T* x = act_.layers[0].input;
    embedding_forward(param(layout_.embedding), w, act_.tokens.data(), n, x, false, threads(), embed_scale());
    if (config_.position == "learned")
      embedding_forward(param(layout_.learned_positions), w, act_.positions.data(), n, x, true, threads());
    if (config_.position == "sinusoidal") {
      std::vector<T> row(w);
      for (int64_t i = 0; i < len; ++i) {
        sinusoid<T>(static_cast<double>(first_position_ + i), w, row.data());
        for (int64_t b = 0; b < b_count; ++b)
          for (int64_t c = 0; c < w; ++c) x[(b * len + i) * w + c] += row[c];
      }
    }
  }

  // Activations of tokens (batch, length) at row stride token_stride after
  // the cache's positions; logits last. `backward`: also plan its scratch.
  template <class Cache>
  void forward(const uint8_t* tokens, int64_t token_stride, int batch, int length, Cache* cache, bool backward) {
    if (cache) check_cache(*cache, batch);
    shape_ = {batch, length, cache ? cache->length : 0, config_.heads, head_dim()};
    first_position_ = cache ? cache->position : 0;
    if (first_position_ + length > kMaxPosition) throw std::invalid_argument("cache: position beyond 2^40");
    act_.plan(shape_, config_.layers, config_.ffn, kVocabulary, backward, bf16(), buffer_);
    const int64_t n = int64_t(batch) * length, w = config_.width, f = config_.ffn, nt = threads();
    if (bf16()) {
      operands_ = params_;
      store(operands_.data(), int64_t(operands_.size()));
    }
    embed(tokens, token_stride);
    for (int l = 0; l < config_.layers; ++l) {
      const LayerOffsets& o = layout_.layers[l];
      LayerActivations<T>& a = act_.layers[l];
      layer_norm_forward(a.input, param(o.ln1_weight), param(o.ln1_bias), n, w, a.ln1_out, a.ln1_mean, a.ln1_rstd, nt);
      store(a.ln1_out, n * w);
      linear_forward(a.ln1_out, operand(o.qkv_weight), param(o.qkv_bias), n, w, 3 * w, a.qkv, nt, bf16());
      store(a.qkv, 3 * n * w);
      if (shape_.memory > 0) fill_keys(*cache, l);
      attention_layer_forward(attention_args(l));
      store(a.attn, n * w);
      linear_forward(a.attn, operand(o.out_weight), param(o.out_bias), n, w, w, a.mid, nt, bf16());
      residual_forward(a.input, a.mid, n, w, nt);
      layer_norm_forward(a.mid, param(o.ln2_weight), param(o.ln2_bias), n, w, a.ln2_out, a.ln2_mean, a.ln2_rstd, nt);
      store(a.ln2_out, n * w);
      linear_forward(a.ln2_out, operand(o.up_weight), param(o.up_bias), n, w, f, a.hidden, nt, bf16());
      gelu_forward(a.hidden, a.activated, n, f, nt);
      store(a.activated, n * f);
      T* out = layer_output(l);
      linear_forward(a.activated, operand(o.down_weight), param(o.down_bias), n, f, w, out, nt, bf16());
      residual_forward(a.mid, out, n, w, nt);
    }
    layer_norm_forward(act_.stream_out, param(layout_.final_weight), param(layout_.final_bias), n, w, act_.final_out,
                       act_.final_mean, act_.final_rstd, nt);
    store(act_.final_out, n * w);
    layer_gemm(bf16(), Trans::no, Trans::yes, n, kVocabulary, w, T(1), act_.final_out, w, operand(layout_.embedding),
               w, T(0), act_.logits, kVocabulary);
  }

  void backward_pass(const uint8_t* targets) {
    const int64_t n = shape_.batch * shape_.length, w = config_.width, f = config_.ffn, nt = threads();
    const int64_t v = kVocabulary;
    cross_entropy_backward(act_.logits, targets, act_.row_weight, n, v, act_.d_logits, nt);
    store(act_.d_logits, n * v);
    // Tied head: logits = final_out E^T.
    layer_gemm(bf16(), Trans::yes, Trans::no, v, w, n, T(1), act_.d_logits, v, act_.final_out, w, T(1),
               grad(layout_.embedding), w);
    layer_gemm(bf16(), Trans::no, Trans::no, n, w, v, T(1), act_.d_logits, v, operand(layout_.embedding), w, T(0),
               act_.d_norm, w);
    // The gradient of the residual stream, one buffer for every depth: each
    // block's branches read it as their output's gradient, then their
    // LayerNorms add their input's gradient into it (the skip connection's 1).
    T* dx = act_.d_stream;
    std::fill_n(dx, n * w, T(0));
    layer_norm_backward(act_.d_norm, act_.stream_out, param(layout_.final_weight), act_.final_mean, act_.final_rstd, n,
                        w, dx, grad(layout_.final_weight), grad(layout_.final_bias), nt);
    for (int l = config_.layers - 1; l >= 0; --l) {
      const LayerOffsets& o = layout_.layers[l];
      const LayerActivations<T>& a = act_.layers[l];
      // Feed-forward branch; dx is d(output of block l).
      linear_backward(stored_copy(dx, act_.d_branch, n * w), a.activated, operand(o.down_weight), n, f, w,
                      act_.d_activated, grad(o.down_weight), grad(o.down_bias), bf16());
      gelu_backward(a.hidden, act_.d_activated, act_.d_hidden, n, f, nt);
      store(act_.d_hidden, n * f);
      linear_backward(act_.d_hidden, a.ln2_out, operand(o.up_weight), n, w, f, act_.d_norm, grad(o.up_weight),
                      grad(o.up_bias), bf16());
      layer_norm_backward(act_.d_norm, a.mid, param(o.ln2_weight), a.ln2_mean, a.ln2_rstd, n, w, dx,
                          grad(o.ln2_weight), grad(o.ln2_bias), nt);
      // Attention branch; dx is now d(mid).
      linear_backward(stored_copy(dx, act_.d_branch, n * w), a.attn, operand(o.out_weight), n, w, w, act_.d_attn,
                      grad(o.out_weight), grad(o.out_bias), bf16());
      store(act_.d_attn, n * w);
      std::fill_n(act_.d_qkv, 3 * n * w, T(0));  // the attention adds its gradients
      attention_layer_backward(attention_args(l), act_.d_attn, act_.d_qkv, act_.d_keys, act_.d_values,
                               position_grads(l));
      store(act_.d_qkv, 3 * n * w);
      linear_backward(act_.d_qkv, a.ln1_out, operand(o.qkv_weight), n, w, 3 * w, act_.d_norm, grad(o.qkv_weight),
                      grad(o.qkv_bias), bf16());
      layer_norm_backward(act_.d_norm, a.input, param(o.ln1_weight), a.ln1_mean, a.ln1_rstd, n, w, dx,
                          grad(o.ln1_weight), grad(o.ln1_bias), nt);
    }
    clamp_position_grads();
    embedding_backward(dx, w, act_.tokens.data(), n, grad(layout_.embedding), embed_scale());
    if (config_.position == "learned")
      embedding_backward(dx, w, act_.positions.data(), n, grad(layout_.learned_positions));
  }

  // keys/values of layer l = [the cache's held rows; this call's rows].
  template <class Cache>
  void fill_keys(const Cache& cache, int l) {
    LayerActivations<T>& a = act_.layers[l];
    const int64_t rows = shape_.memory * shape_.head_dim, bh = shape_.batch * shape_.heads;
    const int64_t cap = int64_t(cache.capacity) * shape_.head_dim, keys = shape_.keys() * shape_.head_dim;
    for (int64_t i = 0; i < bh; ++i) {
      std::copy_n(cache.keys[l].data() + i * cap, rows, a.keys + i * keys);
      std::copy_n(cache.values[l].data() + i * cap, rows, a.values + i * keys);
    }
    copy_current_keys(a.qkv, shape_, 1, a.keys);
    copy_current_keys(a.qkv, shape_, 2, a.values);
    // A cache filled by a float32 call holds float32 keys.
    store(a.keys, bh * keys);
    store(a.values, bh * keys);
  }

  // Appends this call's keys and values, keeping the most recent `capacity`
  // positions (the oldest slide out); position advances by the call's length.
  template <class Cache>
  void append_to_cache(Cache& cache) {
    const int64_t len = shape_.length, dh = shape_.head_dim, cap = cache.capacity;
    const int64_t take_new = std::min(len, cap);
    const int64_t keep_old = std::min<int64_t>(cache.length, cap - take_new);
    const int64_t drop_old = cache.length - keep_old;
    for (int l = 0; l < config_.layers; ++l) {
      const View4<const T> k = qkv_part<const T>(act_.layers[l].qkv, shape_, 1);
      const View4<const T> v = qkv_part<const T>(act_.layers[l].qkv, shape_, 2);
      for (int64_t b = 0; b < shape_.batch; ++b)
        for (int64_t h = 0; h < shape_.heads; ++h) {
          T* keys = cache.keys[l].data() + (b * shape_.heads + h) * cap * dh;
          T* values = cache.values[l].data() + (b * shape_.heads + h) * cap * dh;
          std::copy(keys + drop_old * dh, keys + cache.length * dh, keys);
          std::copy(values + drop_old * dh, values + cache.length * dh, values);
          for (int64_t i = 0; i < take_new; ++i) {
            std::copy_n(&k(b, h, len - take_new + i, 0), dh, keys + (keep_old + i) * dh);
            std::copy_n(&v(b, h, len - take_new + i, 0), dh, values + (keep_old + i) * dh);
          }
        }
    }
    cache.length = static_cast<int>(keep_old + take_new);
    cache.position += len;
  }

  ModelConfig config_;
  ParameterLayout layout_;
  std::vector<T> params_, grads_, buffer_;
  std::vector<T> operands_;  // bfloat16: params_ rounded, as GEMMs and the attention read them
  PositionParams<T> scheme_options_;  // the position scheme's id and options; its tensors bound per layer
  // Per (layer, bounded position tensor): the tensor as the attention reads it.
  mutable std::vector<std::vector<T>> clamped_ = std::vector<std::vector<T>>(config_.layers * layout_.position_tensors.size());
  Activations<T> act_;
  AttentionShape shape_;
  int64_t first_position_ = 0;
  std::vector<uint8_t> targets_;
};

}  // namespace relpos::nn
