// What a byte-level model (relpos::nn) holds, in bytes, from its
// configuration alone, for check_fits_memory (fits_memory.hpp) before the
// model or its data exist. Lower bounds, from the largest buffers of src/nn
// (the parameters of parameter_layout.hpp, the activations of
// activations.hpp, the key/value cache): a size they refuse cannot fit; one
// they pass may still need somewhat more.
#pragma once

#include "relpos/nn/model.hpp"

namespace relpos::cli {

// The parameters (in training also their gradients and AdamW's two moments)
// and what a forward over `rows` sequences of `length` bytes keeps (in
// training also its backward's scratch).
double model_bytes(const nn::ModelConfig& config, double rows, double length, bool training);

// A key/value cache of `rows` x `capacity` positions (Model::make_cache).
double cache_bytes(const nn::ModelConfig& config, double rows, double capacity);

}  // namespace relpos::cli
