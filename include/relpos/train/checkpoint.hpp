// Training checkpoints: everything needed to continue a run exactly.
//
// File layout (little-endian):
//   8 bytes  magic "RELPOSCK"
//   u32      format version (kCheckpointVersion)
//   u32      0 (reserved)
//   u64      payload size in bytes
//   u64      FNV-1a 64 of the payload
//   payload  model config text, training config text, data source, data size
//            and hash, step, parameters, AdamW step and moments, sampler
//            state, Transformer-XL memory (if any)
// Strings are a u64 length then bytes; float arrays a u64 count then floats.
// Writes go to a temporary file in the same folder, are fsynced, renamed over
// the target and the folder fsynced, so a crash leaves the old file or the new
// one, never a mix.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "relpos/nn/model.hpp"
#include "relpos/train/data.hpp"

namespace relpos::train {

inline constexpr uint32_t kCheckpointVersion = 1;

struct Checkpoint {
  std::string model_config, train_config;  // ModelConfig::to_text, TrainConfig::to_text
  std::string data_source;                 // where the training bytes came from (informative)
  int64_t data_bytes = 0;                  // size and FNV-1a 64 of the training split
  uint64_t data_hash = 0;
  int64_t step = 0;  // optimizer steps taken
  std::vector<float> parameters;
  int64_t adam_steps = 0;
  std::vector<float> adam_m, adam_v;
  SamplerState sampler;
  bool has_memory = false;  // Transformer-XL memory carried between segments
  nn::KVCache memory;
};

// Throws std::runtime_error naming the file on any I/O error; the file at
// `path` is then unchanged.
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// Throws std::runtime_error naming the file and the problem: missing,
// not a checkpoint (magic), unsupported version, truncated, checksum
// mismatch, malformed payload.
Checkpoint load_checkpoint(const std::string& path);

// A model with the configuration and parameters of a checkpoint (for eval and
// sample), computing in the precision it was trained in.
nn::Model model_from_checkpoint(const Checkpoint& checkpoint);

}  // namespace relpos::train
