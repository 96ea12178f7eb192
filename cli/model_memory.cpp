#include "model_memory.hpp"

#include "../src/nn/parameter_layout.hpp"

namespace relpos::cli {

double model_bytes(const nn::ModelConfig& c, double rows, double length, bool training) {
  const double w = c.width, f = c.ffn;
  // Per token and layer: the layer's input, its two LayerNorm outputs, q, k
  // and v, the attention's output, the residual sum, the feed-forward hidden
  // row, LayerNorm statistics and lse per head; per token: the final stream
  // and its LayerNorm output and the logits.
  const double kept = double(c.layers) * (8 * w + f + 4 + double(c.heads)) + 2 * w + double(nn::kVocabulary);
  // The backward's per-token scratch: the stream's, LayerNorm's, attention's
  // and q, k, v's gradients, a hidden row's and the logits'.
  const double backward = training ? 6 * w + f + double(nn::kVocabulary) : 0;
  const double parameters = double(nn::ParameterLayout(c).total) * (training ? 4 : 1);
  return double(sizeof(float)) * (parameters + rows * length * (kept + backward));
}

double cache_bytes(const nn::ModelConfig& c, double rows, double capacity) {
  return double(sizeof(float)) * 2 * double(c.layers) * rows * capacity * double(c.width);  // keys and values
}

}  // namespace relpos::cli
