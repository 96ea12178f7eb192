// Causal multi-head self-attention over the fused qkv projection, with
// optional cached keys/values in front (Transformer-XL memory, decoding).
//
// The projection output qkv (batch, length, 3, heads, head_dim) is handed to
// relpos::attention_forward as strided (batch, heads, length, head_dim) views,
// and the output is written straight into (batch, length, heads, head_dim),
// the layout the output projection reads: no transposes. With a memory of m
// positions the keys and values are [memory; current] in separate contiguous
// buffers (batch, heads, m + length, head_dim) that the caller fills.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "relpos/attention.hpp"

namespace relpos::nn {

struct AttentionShape {
  int64_t batch = 0, length = 0, memory = 0, heads = 0, head_dim = 0;
  int64_t width() const { return heads * head_dim; }
  int64_t keys() const { return memory + length; }
};

// One of the three (batch, heads, length, head_dim) views into qkv; part 0 = q, 1 = k, 2 = v.
template <class T>
View4<T> qkv_part(T* qkv, const AttentionShape& s, int part) {
  const int64_t token = 3 * s.width();
  return {qkv + part * s.width(), {s.batch, s.heads, s.length, s.head_dim}, {s.length * token, s.head_dim, token, 1}};
}

// A (batch, heads, keys, head_dim) contiguous key or value buffer.
template <class T>
View4<T> key_buffer(T* data, const AttentionShape& s) {
  return View4<T>::contiguous(data, {s.batch, s.heads, s.keys(), s.head_dim});
}

// Copies the current keys (part 1) or values (part 2) of qkv behind the
// memory rows already in `buffer`.
template <class T>
void copy_current_keys(const T* qkv, const AttentionShape& s, int part, T* buffer) {
  const View4<const T> from = qkv_part(qkv, s, part);
  const View4<T> to = key_buffer(buffer, s);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.length; ++i)
        std::copy_n(&from(b, h, i, 0), s.head_dim, &to(b, h, s.memory + i, 0));
}

template <class T>
struct AttentionLayerArgs {
  AttentionShape shape;
  T* qkv = nullptr;                      // (batch, length, 3 * width)
  T* keys = nullptr, *values = nullptr;  // (batch, heads, keys, head_dim) when memory > 0
  T* out = nullptr;                      // (batch, length, width)
  T* lse = nullptr;                      // (batch, heads, length)
  int64_t q_offset = 0, k_offset = 0;    // absolute positions of the first query and key
  PositionParams<T> pos;
  AttentionDropout dropout;  // training only; the backward draws the forward's mask again from it
  int threads = 1;

  AttentionForward<T> forward_params() const {
    const AttentionShape& s = shape;
    AttentionForward<T> p;
    p.q = qkv_part<const T>(qkv, s, 0);
    p.k = s.memory > 0 ? key_buffer<const T>(keys, s) : qkv_part<const T>(qkv, s, 1);
    p.v = s.memory > 0 ? key_buffer<const T>(values, s) : qkv_part<const T>(qkv, s, 2);
    p.out = {out, {s.batch, s.heads, s.length, s.head_dim}, {s.length * s.width(), s.head_dim, s.width(), 1}};
    p.lse = View3<T>::contiguous(lse, {s.batch, s.heads, s.length});
    p.causal = true;
    p.q_offset = q_offset;
    p.k_offset = k_offset;
    p.pos = pos;
    p.dropout = dropout;
    // 1 / sqrt(d) for every position kind (the model's T5 layers included,
    // whose checkpoints were trained with it), not the T5 scheme's default 1.
    p.scale = 1.0 / std::sqrt(double(s.head_dim));
    p.num_threads = threads;
    return p;
  }
};

// Writes out and lse.
template <class T>
void attention_layer_forward(const AttentionLayerArgs<T>& a) {
  attention_forward(a.forward_params());
}

// dout (batch, length, width); adds dqkv (batch, length, 3 * width) and the
// positional gradients in dpos. The memory gets no gradient: the call asks
// for the current keys' only (key_grads_from), straight into dqkv.
template <class T>
void attention_layer_backward(const AttentionLayerArgs<T>& a, const T* dout, T* dqkv, const PositionGrads<T>& dpos) {
  const AttentionShape& s = a.shape;
  AttentionBackward<T> p;
  static_cast<AttentionForward<T>&>(p) = a.forward_params();
  p.dout = {dout, {s.batch, s.heads, s.length, s.head_dim}, {s.length * s.width(), s.head_dim, s.width(), 1}};
  p.dq = qkv_part(dqkv, s, 0);
  p.dk = qkv_part(dqkv, s, 1);
  p.dv = qkv_part(dqkv, s, 2);
  p.key_grads_from = s.memory;
  p.dpos = dpos;
  attention_backward(p);
}

}  // namespace relpos::nn
