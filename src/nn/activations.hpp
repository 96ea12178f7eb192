// The activations of one forward pass and the scratch of its backward, carved
// from one contiguous buffer that grows to the largest (batch, length, memory)
// seen and is then reused: a training loop allocates once.
#pragma once

#include <cstdint>
#include <vector>

#include "attention_layer.hpp"
#include "relpos/half.hpp"

namespace relpos::nn {

template <class T>
struct LayerActivations {
  T *input, *ln1_out, *ln1_mean, *ln1_rstd, *qkv, *keys, *values, *attn, *lse;
  T *mid, *ln2_out, *ln2_mean, *ln2_rstd;  // mid = input + attention branch
  // The up-projection's output, GELU's input; in a training forward GELU's
  // epilogue replaces each row by GELU's slope there, all the backward needs.
  T *gelu_slope, *activated;
  // The GEMMs' inputs in bfloat16 where they read bfloat16 (else null);
  // GELU's output then only there (activated null).
  bfloat16 *ln1_narrow, *attn_narrow, *ln2_narrow, *activated_narrow;
};

// Fields of one element type and their sizes, then pointed into one buffer.
template <class E>
class Slots {
 public:
  void take(E*& field, int64_t size) {
    fields_.push_back(&field);
    sizes_.push_back(size);
  }
  void place(std::vector<E>& buffer) const {
    int64_t total = 0;
    for (int64_t size : sizes_) total += size;
    if (static_cast<int64_t>(buffer.size()) < total) buffer.assign(total, E());
    E* at = buffer.data();
    for (std::size_t i = 0; i < fields_.size(); ++i) {
      *fields_[i] = sizes_[i] > 0 ? at : nullptr;
      at += sizes_[i];
    }
  }

 private:
  std::vector<E**> fields_;
  std::vector<int64_t> sizes_;
};

template <class T>
struct Activations {
  std::vector<LayerActivations<T>> layers;
  T *stream_out, *final_out, *final_mean, *final_rstd, *logits, *row_weight;
  // Backward scratch.
  T *d_stream, *d_norm, *d_attn, *d_qkv, *d_hidden, *d_activated, *d_logits;
  T* d_branch;  // bfloat16 in float32 storage: a branch's output gradient rounded (the stream's stays float32)
  // The GEMMs' inputs in bfloat16 where they read bfloat16 (else null);
  // d_branch_narrow replaces d_branch there, d_hidden_narrow d_hidden.
  bfloat16 *final_narrow, *d_logits_narrow, *d_branch_narrow, *d_hidden_narrow, *d_qkv_narrow;
  std::vector<int32_t> tokens, positions;  // embedding rows of the inputs and of their absolute positions

  // Points every field into `buffer` and `narrow_buffer` (grown when needed)
  // for the given sizes; the backward scratch only when `backward`
  // (evaluation at long lengths then needs about half the memory); d_branch
  // only when `rounded_branches`, the bfloat16 fields only when `narrow`.
  void plan(const AttentionShape& s, int64_t num_layers, int64_t ffn, int64_t vocabulary, bool backward,
            bool rounded_branches, bool narrow, std::vector<T>& buffer, std::vector<bfloat16>& narrow_buffer) {
    const int64_t n = s.batch * s.length, w = s.width(), bh = s.batch * s.heads, nb = backward ? n : 0;
    const int64_t key_rows = s.memory > 0 ? bh * s.keys() * s.head_dim : 0;
    Slots<T> slots;
    Slots<bfloat16> narrow_slots;
    const int64_t nn = narrow ? n : 0, nnb = narrow ? nb : 0;
    layers.resize(num_layers);
    for (LayerActivations<T>& a : layers) {
      slots.take(a.input, n * w), slots.take(a.ln1_out, n * w), slots.take(a.ln1_mean, n);
      slots.take(a.ln1_rstd, n), slots.take(a.qkv, 3 * n * w), slots.take(a.keys, key_rows);
      slots.take(a.values, key_rows), slots.take(a.attn, n * w), slots.take(a.lse, bh * s.length);
      slots.take(a.mid, n * w), slots.take(a.ln2_out, n * w), slots.take(a.ln2_mean, n);
      slots.take(a.ln2_rstd, n), slots.take(a.gelu_slope, n * ffn), slots.take(a.activated, narrow ? 0 : n * ffn);
      narrow_slots.take(a.ln1_narrow, nn * w), narrow_slots.take(a.attn_narrow, nn * w);
      narrow_slots.take(a.ln2_narrow, nn * w), narrow_slots.take(a.activated_narrow, nn * ffn);
    }
    slots.take(stream_out, n * w), slots.take(final_out, n * w), slots.take(final_mean, n);
    slots.take(final_rstd, n), slots.take(logits, n * vocabulary), slots.take(row_weight, n);
    slots.take(d_stream, nb * w), slots.take(d_norm, nb * w), slots.take(d_attn, nb * w);
    slots.take(d_qkv, 3 * nb * w);
    slots.take(d_hidden, narrow ? 0 : nb * ffn), slots.take(d_activated, nb * ffn), slots.take(d_logits, nb * vocabulary);
    slots.take(d_branch, rounded_branches && !narrow ? nb * w : 0);
    narrow_slots.take(final_narrow, nn * w), narrow_slots.take(d_logits_narrow, nnb * vocabulary);
    narrow_slots.take(d_branch_narrow, nnb * w), narrow_slots.take(d_hidden_narrow, nnb * ffn);
    narrow_slots.take(d_qkv_narrow, 3 * nnb * w);
    slots.place(buffer);
    narrow_slots.place(narrow_buffer);
    tokens.resize(n);
    positions.resize(n);
  }
};

}  // namespace relpos::nn
