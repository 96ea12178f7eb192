// One forward (and backward) pass of the model over a batch of sequences: the
// activations it keeps and the gradient buffer it adds into. A training step
// splits its batch into micro-batches, one pass each (see ModelImpl); passes
// only read the ModelState, so they may run on several threads at once.
//
// Precision::bfloat16 is mixed-precision training: every tensor that a GEMM
// or the attention reads is held at bfloat16 precision — the matrices and
// positional tables (rounded from the float32 parameters by ModelState), the
// LayerNorm outputs, q/k/v, the attention output, GELU's output, and in the
// backward the output gradients those GEMMs and the attention read. GEMMs and
// the attention accumulate in float32 and write float32 (bias added in
// float32 before any rounding); the residual stream, LayerNorm, GELU's input,
// the logits, the cross-entropy, the softmax statistics and every parameter
// gradient stay float32, as do the parameters and the optimizer. The values
// are rounded in float32 buffers: the numbers are those of bf16 storage with
// float32 accumulation. Where the CPU has bfloat16 products (AVX512-BF16,
// AMX) the GEMMs run them (layer_gemm); elsewhere float32 GEMMs multiply the
// same values: the same exact products, summed in another order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "activations.hpp"
#include "attention_layer.hpp"
#include "cross_entropy.hpp"
#include "embedding.hpp"
#include "gelu.hpp"
#include "layer_norm.hpp"
#include "linear.hpp"
#include "model_state.hpp"
#include "relpos/attention.hpp"
#include "relpos/position.hpp"
#include "training_dropout.hpp"

namespace relpos::nn {

template <class T>
class MicroBatchPass {
 public:
  explicit MicroBatchPass(const ModelState<T>& model) : m_(model) {}

  int threads = 1;            // for its GEMMs' caller, attention and elementwise layers
  T* gradients = nullptr;     // where backward() adds the parameter gradients

  // Activations of tokens (batch, length) at row stride token_stride, rows
  // first_row.. of the call's batch (and of the cache's), after the cache's
  // positions; logits last. `backward`: also plan its scratch. `dropout`:
  // the call's attention dropout, the backward drawing the same masks.
  template <class Cache>
  void forward(const uint8_t* tokens, int64_t token_stride, int batch, int length, const Cache* cache,
               int first_row, bool backward, const TrainingDropout& dropout = {}) {
    shape_ = {batch, length, cache ? cache->length : 0, m_.config.heads, head_dim()};
    first_position_ = cache ? cache->position : 0;
    first_row_ = first_row;
    dropout_ = dropout;
    act_.plan(shape_, m_.config.layers, m_.config.ffn, kVocabulary, backward, m_.bf16(), m_.narrow_operands(), buffer_,
              narrow_buffer_);
    const int64_t n = int64_t(batch) * length, w = m_.config.width, f = m_.config.ffn, nt = threads;
    embed(tokens, token_stride);
    for (int l = 0; l < m_.config.layers; ++l) {
      const LayerOffsets& o = m_.layout.layers[l];
      LayerActivations<T>& a = act_.layers[l];
      layer_norm_forward(a.input, m_.param(o.ln1_weight), m_.param(o.ln1_bias), n, w, a.ln1_out, a.ln1_mean, a.ln1_rstd, nt);
      // Each GEMM's epilogue finishes a row while it is in cache: q, k and v
      // rounded for the attention; the residual sums; GELU with its slope
      // (kept for the backward) and its output made ready for the next GEMM.
      linear_forward(gemm_input(a.ln1_out, a.ln1_narrow, n * w), m_.matrix(o.qkv_weight), m_.param(o.qkv_bias), n, w,
                     3 * w, a.qkv, nt, m_.bf16(), [&](int64_t, T* row) { ready_row(row, nullptr, 3 * w); });
      if (shape_.memory > 0) fill_keys(*cache, l);
      attention_layer_forward(attention_args(l));
      linear_forward(gemm_input(a.attn, a.attn_narrow, n * w), m_.matrix(o.out_weight), m_.param(o.out_bias), n, w, w,
                     a.mid, nt, m_.bf16(), [&](int64_t r, T* row) { add_row(row, a.input + r * w, w); });
      layer_norm_forward(a.mid, m_.param(o.ln2_weight), m_.param(o.ln2_bias), n, w, a.ln2_out, a.ln2_mean, a.ln2_rstd, nt);
      linear_forward(gemm_input(a.ln2_out, a.ln2_narrow, n * w), m_.matrix(o.up_weight), m_.param(o.up_bias), n, w, f,
                     a.gelu_slope, nt, m_.bf16(), [&](int64_t r, T* row) {
                       bfloat16* narrow = a.activated_narrow ? a.activated_narrow + r * f : nullptr;
                       T* activated = narrow ? scratch_row(f) : a.activated + r * f;
                       gelu_row(row, activated, backward ? row : nullptr, f);
                       ready_row(activated, narrow, f);
                     });
      linear_forward({a.activated, a.activated_narrow}, m_.matrix(o.down_weight), m_.param(o.down_bias), n, f, w,
                     layer_output(l), nt, m_.bf16(), [&](int64_t r, T* row) { add_row(row, a.mid + r * w, w); });
    }
    layer_norm_forward(act_.stream_out, m_.param(m_.layout.final_weight), m_.param(m_.layout.final_bias), n, w, act_.final_out,
                       act_.final_mean, act_.final_rstd, nt);
    layer_gemm(m_.bf16(), Trans::no, Trans::yes, n, kVocabulary, w, T(1),
               gemm_input(act_.final_out, act_.final_narrow, n * w), w, m_.matrix(m_.layout.embedding), w, T(0),
               act_.logits, kVocabulary);
  }

  // sum over rows of weight * cross-entropy of the logits against tokens
  // (row stride length + 1, the target of position i at i + 1), rows
  // before first_scored of each sequence unscored.
  double loss(const uint8_t* tokens, T weight, int first_scored) {
    const int64_t n = shape_.batch * shape_.length, len = shape_.length;
    targets_.resize(n);
    for (int64_t r = 0; r < n; ++r) {
      act_.row_weight[r] = r % len >= first_scored ? weight : T(0);
      targets_[r] = tokens[(r / len) * (len + 1) + r % len + 1];
    }
    return cross_entropy_forward(act_.logits, targets_.data(), act_.row_weight, n, kVocabulary);
  }

  const T* logits() const { return act_.logits; }

  // Adds the gradients of loss() into `gradients`.
  void backward() {
    const uint8_t* targets = targets_.data();
    const int64_t n = shape_.batch * shape_.length, w = m_.config.width, f = m_.config.ffn, nt = threads;
    const int64_t v = kVocabulary;
    cross_entropy_backward(act_.logits, targets, act_.row_weight, n, v, act_.d_logits, nt);
    const GemmOperand<T> d_logits = gemm_input(act_.d_logits, act_.d_logits_narrow, n * v);
    // Tied head: logits = final_out E^T.
    layer_gemm(m_.bf16(), Trans::yes, Trans::no, v, w, n, T(1), d_logits, v, {act_.final_out, act_.final_narrow}, w,
               T(1), grad(m_.layout.embedding), w);
    layer_gemm(m_.bf16(), Trans::no, Trans::no, n, w, v, T(1), d_logits, v, m_.matrix(m_.layout.embedding), w, T(0),
               act_.d_norm, w);
    // The gradient of the residual stream, one buffer for every depth: each
    // block's branches read it as their output's gradient, then their
    // LayerNorms add their input's gradient into it (the skip connection's 1).
    T* dx = act_.d_stream;
    std::fill_n(dx, n * w, T(0));
    layer_norm_backward(act_.d_norm, act_.stream_out, m_.param(m_.layout.final_weight), act_.final_mean, act_.final_rstd, n,
                        w, dx, grad(m_.layout.final_weight), grad(m_.layout.final_bias), nt);
    for (int l = m_.config.layers - 1; l >= 0; --l) {
      const LayerOffsets& o = m_.layout.layers[l];
      const LayerActivations<T>& a = act_.layers[l];
      // Feed-forward branch; dx is d(output of block l).
      linear_backward(branch_gradient(dx), {a.activated, a.activated_narrow}, m_.matrix(o.down_weight), n, f, w,
                      act_.d_activated, grad(o.down_weight), grad(o.down_bias), m_.bf16());
      for_each_row(nt, n, f, [&](int64_t r) {
        bfloat16* narrow = act_.d_hidden_narrow ? act_.d_hidden_narrow + r * f : nullptr;
        T* row = narrow ? scratch_row(f) : act_.d_hidden + r * f;
        gelu_backward_row(a.gelu_slope + r * f, act_.d_activated + r * f, row, f);
        ready_row(row, narrow, f);
      });
      linear_backward({act_.d_hidden, act_.d_hidden_narrow}, {a.ln2_out, a.ln2_narrow}, m_.matrix(o.up_weight), n, w,
                      f, act_.d_norm, grad(o.up_weight), grad(o.up_bias), m_.bf16());
      layer_norm_backward(act_.d_norm, a.mid, m_.param(o.ln2_weight), a.ln2_mean, a.ln2_rstd, n, w, dx,
                          grad(o.ln2_weight), grad(o.ln2_bias), nt);
      // Attention branch; dx is now d(mid).
      linear_backward(branch_gradient(dx), {a.attn, a.attn_narrow}, m_.matrix(o.out_weight), n, w, w, act_.d_attn,
                      grad(o.out_weight), grad(o.out_bias), m_.bf16());
      store(act_.d_attn, n * w);
      std::fill_n(act_.d_qkv, 3 * n * w, T(0));  // the attention adds its gradients
      attention_layer_backward(attention_args(l), act_.d_attn, act_.d_qkv, position_grads(l));
      linear_backward(gemm_input(act_.d_qkv, act_.d_qkv_narrow, 3 * n * w), {a.ln1_out, a.ln1_narrow},
                      m_.matrix(o.qkv_weight), n, w, 3 * w, act_.d_norm, grad(o.qkv_weight), grad(o.qkv_bias),
                      m_.bf16());
      layer_norm_backward(act_.d_norm, a.input, m_.param(o.ln1_weight), a.ln1_mean, a.ln1_rstd, n, w, dx,
                          grad(o.ln1_weight), grad(o.ln1_bias), nt);
    }
    embedding_backward(dx, w, act_.tokens.data(), n, grad(m_.layout.embedding), embed_scale());
    if (m_.config.position == "learned")
      embedding_backward(dx, w, act_.positions.data(), n, grad(m_.layout.learned_positions));
  }

  // Writes this pass's keys and values into its rows of the cache, keeping
  // the most recent `capacity` positions (the oldest slide out); the caller
  // then sets the cache's length and position (advanced by the length).
  template <class Cache>
  void write_to_cache(Cache& cache) const {
    const int64_t len = shape_.length, dh = shape_.head_dim, cap = cache.capacity;
    const int64_t take_new = std::min(len, cap);
    const int64_t keep_old = std::min<int64_t>(cache.length, cap - take_new);
    const int64_t drop_old = cache.length - keep_old;
    for (int l = 0; l < m_.config.layers; ++l) {
      const View4<const T> k = qkv_part<const T>(act_.layers[l].qkv, shape_, 1);
      const View4<const T> v = qkv_part<const T>(act_.layers[l].qkv, shape_, 2);
      for (int64_t b = 0; b < shape_.batch; ++b)
        for (int64_t h = 0; h < shape_.heads; ++h) {
          const int64_t slice = (first_row_ + b) * shape_.heads + h;
          T* keys = cache.keys[l].data() + slice * cap * dh;
          T* values = cache.values[l].data() + slice * cap * dh;
          std::copy(keys + drop_old * dh, keys + cache.length * dh, keys);
          std::copy(values + drop_old * dh, values + cache.length * dh, values);
          for (int64_t i = 0; i < take_new; ++i) {
            std::copy_n(&k(b, h, len - take_new + i, 0), dh, keys + (keep_old + i) * dh);
            std::copy_n(&v(b, h, len - take_new + i, 0), dh, values + (keep_old + i) * dh);
          }
        }
    }
  }

 private:
  int64_t head_dim() const { return m_.config.width / m_.config.heads; }
  void store(T* x, int64_t count) const { m_.store(x, count, threads); }
  // `count` values the GEMMs read next, as they read them: narrowed into
  // `narrow` where it is given (narrow_operands(); x keeps its float32
  // values), else rounded in place to the precision's storage.
  GemmOperand<T> gemm_input(T* x, bfloat16* narrow, int64_t count) const {
    if (narrow) return narrowed(x, narrow, count);
    store(x, count);
    return {x};
  }
  // A branch's output gradient as its GEMMs read it: the stream's gradient dx
  // itself in float32, else narrowed or rounded in a copy (dx stays float32).
  GemmOperand<T> branch_gradient(const T* dx) const {
    const int64_t count = shape_.batch * shape_.length * m_.config.width;
    if (!m_.bf16()) return {dx};
    if (act_.d_branch_narrow) return narrowed(dx, act_.d_branch_narrow, count);
    std::copy_n(dx, count, act_.d_branch);
    store(act_.d_branch, count);
    return {act_.d_branch};
  }
  // One row of such values, made ready where it is written.
  void ready_row(T* x, bfloat16* narrow, int64_t count) const {
    if (narrow)
      convert::row(x, 1, narrow, 1, count);
    else if (m_.bf16())
      convert::round_to_bf16(x, count);
  }
  // A row of values that GEMMs read only in bfloat16 (GELU's output and its
  // gradient): computed here, in cache, then narrowed; this thread's.
  static T* scratch_row(int64_t count) {
    thread_local std::vector<T> row;
    if (static_cast<int64_t>(row.size()) < count) row.resize(count);
    return row.data();
  }
  GemmOperand<T> narrowed(const T* x, bfloat16* narrow, int64_t count) const {
    for_each_block(threads, count, kElementBlock,
                   [&](int64_t begin, int64_t size) { convert::row(x + begin, 1, narrow + begin, 1, size); });
    return {x, narrow};
  }
  T* grad(int64_t offset) { return gradients + offset; }

  // keys/values of layer l = [the cache's held rows; this call's rows].
  template <class Cache>
  void fill_keys(const Cache& cache, int l) {
    LayerActivations<T>& a = act_.layers[l];
    const int64_t rows = shape_.memory * shape_.head_dim, bh = shape_.batch * shape_.heads;
    const int64_t cap = int64_t(cache.capacity) * shape_.head_dim, keys = shape_.keys() * shape_.head_dim;
    const int64_t first = int64_t(first_row_) * shape_.heads;
    for (int64_t i = 0; i < bh; ++i) {
      std::copy_n(cache.keys[l].data() + (first + i) * cap, rows, a.keys + i * keys);
      std::copy_n(cache.values[l].data() + (first + i) * cap, rows, a.values + i * keys);
    }
    copy_current_keys(a.qkv, shape_, 1, a.keys);
    copy_current_keys(a.qkv, shape_, 2, a.values);
    // A cache filled by a float32 call holds float32 keys.
    store(a.keys, bh * keys);
    store(a.values, bh * keys);
  }

  PositionGrads<T> position_grads(int l) {
    PositionGrads<T> g;
    PositionParams<T> unused;
    for_each_model_tensor(
        m_.layout.position_tensors, unused,
        [&](std::size_t i, auto&, auto& grad_view) {
          m_.layout.position_tensors[i].bind(grad_view, grad(m_.layout.layers[l].position[i]));
        },
        g);
    return g;
  }

  AttentionLayerArgs<T> attention_args(int l) const {
    AttentionLayerArgs<T> a;
    const LayerActivations<T>& act = act_.layers[l];
    a.shape = shape_;
    a.qkv = act.qkv, a.keys = act.keys, a.values = act.values, a.out = act.attn, a.lse = act.lse;
    a.q_offset = first_position_;
    a.k_offset = first_position_ - shape_.memory;
    a.pos = m_.position_params(l);
    a.dropout = layer_dropout(dropout_, m_.config.layers, l, first_row_);
    a.threads = threads;
    return a;
  }

  T* layer_output(int l) { return l + 1 < m_.config.layers ? act_.layers[l + 1].input : act_.stream_out; }

  // Factor on the byte embedding at the input: sqrt(width) under sinusoidal
  // positions (the Transformer paper, fairseq's embed_scale), so that bytes
  // initialised at std 0.02 are not drowned by a sinusoid of amplitude 1; 1
  // for every other kind. The tied output head uses the unscaled matrix.
  T embed_scale() const {
    return m_.config.position == "sinusoidal" ? static_cast<T>(std::sqrt(double(m_.config.width))) : T(1);
  }

  // Input embeddings: embed_scale() * bytes plus, for the absolute kinds, the
  // embedding of the absolute position first_position_ + i.
  void embed(const uint8_t* tokens, int64_t token_stride) {
    const int64_t b_count = shape_.batch, len = shape_.length, w = m_.config.width, n = b_count * len;
    for (int64_t r = 0; r < n; ++r) {
      act_.tokens[r] = tokens[(r / len) * token_stride + r % len];
      const int64_t pos = first_position_ + r % len;
      act_.positions[r] = static_cast<int32_t>(std::min<int64_t>(pos, m_.config.context - 1));
    }
    T* x = act_.layers[0].input;
    embedding_forward(m_.param(m_.layout.embedding), w, act_.tokens.data(), n, x, false, threads, embed_scale());
    if (m_.config.position == "learned")
      embedding_forward(m_.param(m_.layout.learned_positions), w, act_.positions.data(), n, x, true, threads);
    if (m_.config.position == "sinusoidal") {
      std::vector<T> row(w);
      for (int64_t i = 0; i < len; ++i) {
        sinusoid<T>(static_cast<double>(first_position_ + i), w, row.data());
        for (int64_t b = 0; b < b_count; ++b)
          for (int64_t c = 0; c < w; ++c) x[(b * len + i) * w + c] += row[c];
      }
    }
  }

  const ModelState<T>& m_;
  Activations<T> act_;
  std::vector<T> buffer_;  // act_'s storage
  std::vector<bfloat16> narrow_buffer_;  // act_'s bfloat16 fields' storage
  AttentionShape shape_;
  int64_t first_position_ = 0;
  int first_row_ = 0;
  TrainingDropout dropout_;
  std::vector<uint8_t> targets_;
};

}  // namespace relpos::nn
