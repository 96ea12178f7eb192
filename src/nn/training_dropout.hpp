// The attention dropout of one layer of a training call: TrainingDropout
// (relpos/nn/model.hpp) turned into the attention API's AttentionDropout.
//
// Every call of a run must draw its own masks, and a resumed run the same
// ones as an uninterrupted run: so the masks are a pure function of the run's
// seed, the step, the layer and the batch row, and of nothing a resume or a
// thread count could change. The attention API keys a mask by a 64-bit seed,
// a 32-bit offset and the batch row (relpos/dropout.hpp). Layer l of step s
// is call n = s * layers + l of the run; its offset is n mod 2^32 and its key
// is derived from the run's seed and n's bits above those 32, so a run keeps
// one key for its first 2^32 calls and never repeats a (key, offset) pair.
// The key goes through splitmix64's output function (with a constant of its
// own) rather than being the seed itself: the seed also starts the batch
// sampler's splitmix64 stream, and the dropout key should not be one of its
// words.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "relpos/dropout.hpp"
#include "relpos/nn/model.hpp"

namespace relpos::nn {

// Throws std::invalid_argument naming the field for a p outside [0, 1) or a
// negative step.
inline void check_training_dropout(const TrainingDropout& d) {
  if (!(d.p >= 0 && d.p < 1))
    throw std::invalid_argument("dropout.p: must lie in [0, 1), got " + std::to_string(d.p));
  if (d.step < 0) throw std::invalid_argument("dropout.step: must be >= 0, got " + std::to_string(d.step));
}

// splitmix64's output function (Steele, Lea and Flood 2014): a bijection of
// 64-bit words whose outputs for consecutive inputs look independent.
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// "dropout" in ASCII: sets the dropout keys apart from other words drawn from the same seed.
inline constexpr uint64_t kDropoutKeyDomain = 0x64726f706f7574ull;

// The AttentionDropout of layer `layer` (of `layers`) in the pass over the
// rows first_row.. of the call's batch.
inline AttentionDropout layer_dropout(const TrainingDropout& d, int layers, int layer, int64_t first_row) {
  const uint64_t call = uint64_t(d.step) * uint64_t(layers) + uint64_t(layer);
  AttentionDropout out;
  out.p = d.p;
  out.seed = splitmix64_mix((d.seed ^ kDropoutKeyDomain) + (call >> 32) * 0x9E3779B97F4A7C15ull);
  out.offset = uint32_t(call);
  out.batch_offset = first_row;
  return out;
}

}  // namespace relpos::nn
