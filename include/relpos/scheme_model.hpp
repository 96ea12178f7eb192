// What a position scheme needs to know of relpos's byte-level model
// (relpos/nn/model.hpp) to be trained in it: the model's shape and the
// schemes' model options. A scheme (src/schemes/) declares its options as
// members of this struct and reads it to check a configuration and to shape
// its learnable tensors; nn::ModelConfig extends it with the rest of the
// model, so the attention layer never depends on the model.
#pragma once

namespace relpos {

struct SchemeModelConfig {
  int width = 128;   // model dimension; heads * head_dim
  int heads = 4;
  int context = 64;  // training length; size of the learned absolute table
  // The schemes' options (src/schemes/<scheme>.hpp, `model_options`).
  int shaw_k = 16;             // Shaw clipping distance (tables per layer, shared by heads, K and V)
  int t5_buckets = 32;         // T5 (causal buckets, one table shared by all layers, as in T5)
  int t5_max_distance = 128;
  double rope_base = 10000.0;  // RoPE over the whole head dimension, half-split
  // DeBERTa (c2p and p2c tables per layer, shared by heads), DeBERTa-v3's
  // proportions (max_relative_positions its training length, twice its
  // buckets) at the demo's training length 32: every distance the model sees
  // past it reads the table's trained edge rows.
  int deberta_buckets = 16;
  int deberta_max_distance = 32;
};

}  // namespace relpos
