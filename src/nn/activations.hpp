// The activations of one forward pass and the scratch of its backward, carved
// from one contiguous buffer that grows to the largest (batch, length, memory)
// seen and is then reused: a training loop allocates once.
#pragma once

#include <cstdint>
#include <vector>

#include "attention_layer.hpp"

namespace relpos::nn {

template <class T>
struct LayerActivations {
  T *input, *ln1_out, *ln1_mean, *ln1_rstd, *qkv, *keys, *values, *attn, *lse;
  T *mid, *ln2_out, *ln2_mean, *ln2_rstd, *hidden, *activated;  // mid = input + attention branch
};

template <class T>
struct Activations {
  std::vector<LayerActivations<T>> layers;
  T *stream_out, *final_out, *final_mean, *final_rstd, *logits, *row_weight;
  // Backward scratch.
  T *d_stream, *d_norm, *d_attn, *d_qkv, *d_keys, *d_values, *d_hidden, *d_activated, *d_logits;
  T* d_branch;  // bfloat16: a branch's output gradient rounded (the stream's stays float32)
  std::vector<int32_t> tokens, positions;  // embedding rows of the inputs and of their absolute positions

  // Points every field into `buffer` (grown when needed) for the given sizes;
  // the backward scratch only when `backward` (evaluation at long lengths
  // then needs about half the memory), d_branch only when `rounded_branches`.
  void plan(const AttentionShape& s, int64_t num_layers, int64_t ffn, int64_t vocabulary, bool backward,
            bool rounded_branches, std::vector<T>& buffer) {
    const int64_t n = s.batch * s.length, w = s.width(), bh = s.batch * s.heads, nb = backward ? n : 0;
    const int64_t key_rows = s.memory > 0 ? bh * s.keys() * s.head_dim : 0;
    std::vector<T**> slots;
    std::vector<int64_t> sizes;
    auto take = [&](T*& field, int64_t size) {
      slots.push_back(&field);
      sizes.push_back(size);
    };
    layers.resize(num_layers);
    for (LayerActivations<T>& a : layers) {
      take(a.input, n * w), take(a.ln1_out, n * w), take(a.ln1_mean, n), take(a.ln1_rstd, n);
      take(a.qkv, 3 * n * w), take(a.keys, key_rows), take(a.values, key_rows), take(a.attn, n * w);
      take(a.lse, bh * s.length), take(a.mid, n * w), take(a.ln2_out, n * w), take(a.ln2_mean, n);
      take(a.ln2_rstd, n), take(a.hidden, n * ffn), take(a.activated, n * ffn);
    }
    take(stream_out, n * w), take(final_out, n * w), take(final_mean, n), take(final_rstd, n);
    take(logits, n * vocabulary), take(row_weight, n);
    const int64_t d_key_rows = backward ? key_rows : 0;
    take(d_stream, nb * w), take(d_norm, nb * w), take(d_attn, nb * w), take(d_qkv, 3 * nb * w);
    take(d_keys, d_key_rows), take(d_values, d_key_rows), take(d_hidden, nb * ffn), take(d_activated, nb * ffn);
    take(d_logits, nb * vocabulary), take(d_branch, rounded_branches ? nb * w : 0);
    int64_t total = 0;
    for (int64_t size : sizes) total += size;
    if (static_cast<int64_t>(buffer.size()) < total) buffer.assign(total, T(0));
    T* at = buffer.data();
    for (std::size_t i = 0; i < slots.size(); ++i) {
      *slots[i] = sizes[i] > 0 ? at : nullptr;
      at += sizes[i];
    }
    tokens.resize(n);
    positions.resize(n);
  }
};

}  // namespace relpos::nn
