// Calls stored in bfloat16 or float16 (relpos/half.hpp): every algorithm
// serves them by computing in float32 on a batch chunk at a time. Inputs are
// assumed validated.
#pragma once

#include "relpos/attention.hpp"

namespace relpos::half_storage {

// Float32 copies of a chunk of batch rows stay below this many bytes (or one
// batch row when a row is larger): big enough that small-batch calls run in
// one chunk, with the algorithm's threads over all their heads.
inline constexpr double kChunkBytes = 64.0 * 1024 * 1024;

// budget: the chunk limit (tests lower it to run several chunks).
template <class S>
void forward(const AttentionForward<S>& p, double budget = kChunkBytes);
template <class S>
void backward(const AttentionBackward<S>& p, double budget = kChunkBytes);

// The float32 forward of one chunk, by the algorithm the call chose
// (dispatch.cpp); the half call around it validated the arguments and checks
// the scores once, for every chunk.
void forward_chunk(const AttentionForward<float>& p);

// Bytes of the float32 copies one chunk of batch rows holds (forward and
// backward), for the scratch estimate.
template <class S>
double chunk_bytes(const AttentionForward<S>& p);

}  // namespace relpos::half_storage
