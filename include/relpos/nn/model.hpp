// A decoder-only byte-level transformer (vocabulary 256, pre-LayerNorm blocks)
// whose attention runs through relpos with any position scheme. It exists to
// show how each scheme extrapolates: train at a short length, evaluate long.
//
// Block l (pre-LayerNorm): x += attn(ln1(x)); x += ffn(ln2(x)), ffn = down(gelu(up)),
// GELU in its exact erf form; then final_ln and an output head tied to the byte
// embedding (logits = final_ln(x) E^T, as GPT-2: for 256 bytes it saves a matrix
// and trains the output row of a rare byte through its input use as well).
// Attention is causal, scale 1/sqrt(head_dim), through relpos::attention_*.
//
// Parameters and gradients each live in one contiguous float buffer (the
// optimizer and checkpoints see flat spans); `parameter_table()` names the
// slices in order: "embedding.weight", "positions.learned", the scheme's
// tensors shared by all layers ("t5.table", "xl.u", "xl.v"), then per layer l
// (counted from 0) "layer<l>.ln1.weight", ..., "layer<l>.attn.qkv.bias", the
// scheme's per-layer tensors ("layer<l>.attn.shaw.wk", "layer<l>.attn.xl.w_r"),
// "layer<l>.attn.out.weight", ..., "layer<l>.ffn.down.bias", and last
// "final_ln.weight", "final_ln.bias". Activations of a forward pass are kept
// in one buffer sized for the largest (batch, length, memory) seen, so a
// training loop allocates once. Initialisation: normal(0, 0.02) from
// config.seed by the model's own generator (splitmix64 + Box-Muller, no
// standard-library distribution), the residual output projections (attn.out,
// ffn.down) scaled by 1/sqrt(2 layers), biases 0, LayerNorm gains 1, a
// scheme's tensors as its file says.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "relpos/scheme_model.hpp"

namespace relpos::nn {

// Where position information enters the model, by name. `sinusoidal` and
// `learned` are absolute embeddings added to the byte embeddings (sinusoidal
// in relpos's [sin..., cos...] order; the learned table has `context` rows and
// positions >= context all use its last row, so evaluation beyond the
// training length runs and shows how that fares). Under `sinusoidal` the byte
// embeddings are multiplied by sqrt(width) before the sinusoid is added (the
// Transformer paper's and fairseq's embed_scale; the gradient into the
// embedding from the input side carries the same factor, the tied output head
// uses the unscaled matrix): initialised at std 0.02, unscaled bytes would be
// drowned 50:1 by a sinusoid of amplitude 1. The other kinds keep the unscaled
// embedding, as GPT-2 does: `learned` positions are trained at the embedding's
// own scale, and `none` and the attention schemes add nothing to the bytes
// that could drown them. Every other kind is a scheme of the attention
// library by its name (shaw, t5, alibi, rope, xl, kerple, ...), applied in
// every layer; the scheme's own file says which of its tensors the model
// trains, with which options, shapes and initialisation (docs/trainer.md
// lists them): a new scheme of the library is a new kind of model.
using PositionKind = std::string;
PositionKind parse_position_kind(const std::string& name);  // the name if a kind's; throws std::invalid_argument
std::vector<PositionKind> all_position_kinds();             // none, sinusoidal, learned, then the schemes in registry order
std::string position_kind_names();                          // "none, sinusoidal, ...": every kind's name

// The arithmetic of a model's forward and backward. bfloat16 is mixed
// precision: the tensors that GEMMs and the attention read (weights, their
// input activations, q/k/v and the gradients flowing into them) are rounded
// to bfloat16; accumulation, the residual stream, LayerNorm, the loss, the
// parameters and their gradients stay float32.
enum class Precision { float32, bfloat16 };
const char* to_string(Precision precision);
Precision parse_precision(const std::string& name);  // "float32", "bfloat16" or "bf16"; throws std::invalid_argument

// The model's configuration: its shape and the position schemes' options
// (width, heads, context and those, from SchemeModelConfig) and the rest.
struct ModelConfig : SchemeModelConfig {
  int layers = 2;
  int ffn = 512;  // hidden width of the GELU feed-forward block
  PositionKind position = "alibi";
  uint64_t seed = 1;  // parameter initialisation

  void validate() const;        // throws std::invalid_argument naming the field
  std::string to_text() const;  // "key=value" lines; round-trips through from_text
  static ModelConfig from_text(const std::string& text);  // throws on unknown keys or bad values
};

// Attention dropout in one training call (docs/trainer.md, "Attention
// dropout"): every attention layer drops each probability with chance p
// (inverted dropout, relpos/dropout.hpp, drawn again by the backward, never
// stored). The masks are a pure function of (seed, step, layer, the row in
// the call's batch): a run's calls draw distinct masks, a resumed run the
// same ones, and the split into micro-batches changes none of them
// (src/nn/training_dropout.hpp derives the attention API's seed and offset).
struct TrainingDropout {
  double p = 0;       // in [0, 1); 0: no dropout (the call's exact path)
  uint64_t seed = 0;  // the run's
  int64_t step = 0;   // >= 0; each step its own masks
};

struct ParameterInfo {
  std::string name;            // e.g. "layer1.attn.qkv.weight"
  int64_t offset = 0, size = 0; // in floats, into parameters()/gradients()
  std::vector<int64_t> shape;
  bool weight_decay = false;   // matrices decay; biases, norms and position tables do not
};

// Per-layer cached keys and values of earlier positions, for Transformer-XL
// memory (training and evaluation) and for incremental decoding (sampling).
// Holds up to `capacity` positions per layer and batch row; no gradient flows
// into it. Keys are stored after the projection and before any rotation: a
// call attends to [held; current] with the current queries at absolute
// positions position.. and the held keys at position - length.., so RoPE,
// absolute embeddings and relative schemes all see true positions. Appending
// keeps the most recent `capacity` positions (the oldest slide out). Rows
// 0..length-1 of each (batch, head) slice are held, oldest first.
struct KVCache {
  int batch = 0, capacity = 0, length = 0;  // length = positions currently held
  int64_t position = 0;                     // absolute position of the next token
  std::vector<std::vector<float>> keys, values;  // per layer: (batch, heads, capacity, head_dim)
};

class Model {
 public:
  explicit Model(const ModelConfig& config);  // validates, then initialises from config.seed
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  const ModelConfig& config() const;
  std::span<float> parameters();
  std::span<const float> parameters() const;
  std::span<float> gradients();
  const std::vector<ParameterInfo>& parameter_table() const;
  void zero_gradients();

  // tokens: (batch, length + 1) bytes, row-major. Predicts tokens[:, 1:] from
  // tokens[:, :-1]; returns the mean cross-entropy in nats per predicted byte.
  // `memory` (Transformer-XL, may be null) supplies earlier keys/values and is
  // updated with this segment's, keeping the most recent `capacity` positions.
  // `dropout`: the training step's attention dropout (none by default).
  float forward_backward(std::span<const uint8_t> tokens, int batch, int length, KVCache* memory = nullptr,
                         const TrainingDropout& dropout = {});
  // The same loss without gradients and without dropout (evaluation).
  // `first_scored` skips the first positions of every row from the mean
  // (sliding-window evaluation scores only the tail); it must lie in
  // [0, length). `memory` is used and updated as above.
  float loss(std::span<const uint8_t> tokens, int batch, int length, KVCache* memory = nullptr,
             int first_scored = 0);

  // Incremental decoding: logits (batch, 256) of the next byte after feeding
  // `tokens` (batch, count), appending their keys and values to `cache`.
  // make_cache: empty cache (position 0) for `batch` rows, capacity >= 1.
  KVCache make_cache(int batch, int capacity) const;
  void decode(std::span<const uint8_t> tokens, int batch, int count, KVCache& cache, std::span<float> logits);
  // Logits (batch, length, 256) of a full forward pass, no cache (tests compare it with decode).
  void logits(std::span<const uint8_t> tokens, int batch, int length, std::span<float> out);

  // OpenMP threads for GEMMs (set for the duration of a call), attention and
  // the elementwise layers; 0 = omp_get_max_threads().
  int num_threads = 0;
  // The arithmetic of every call (see Precision); parameters stay float32.
  Precision precision = Precision::float32;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace relpos::nn
