// The fused streaming kernel (algorithm fused): every scheme and mask, no
// (L, L) buffer. Inputs are assumed validated.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "relpos/attention.hpp"
#include "tiles.hpp"

namespace relpos::fused {

template <class T>
void forward(const AttentionForward<T>& p);
template <class T>
void backward(const AttentionBackward<T>& p);

// A call stored in a half type S: twin is its float32 twin (every option,
// shape and stride of the call, positional parameters and their gradients in
// float32, no tensor data; src/attention/half_storage.cpp), data the call.
// Rows are widened as each head is loaded and results rounded once as stored.
template <class S>
void forward_stored(const AttentionForward<compute_t<S>>& twin, const AttentionForward<S>& data);
template <class S>
void backward_stored(const AttentionBackward<compute_t<S>>& twin, const AttentionBackward<S>& data);

// Groups each head's key tiles are split into by the backward (1 = the head
// runs whole on one thread); each group holds its own query-side gradients.
template <class T>
int64_t backward_key_groups(const AttentionForward<T>& p);

// The keys [begin, end) of key group `group` of `groups` of a head of lk keys:
// whole key tiles, as evenly as they go.
inline std::pair<int64_t, int64_t> group_keys(int64_t lk, int64_t group, int64_t groups) {
  const int64_t keys = tiles::kBackwardKeys, count = (lk + keys - 1) / keys;
  return {group * count / groups * keys, std::min(lk, (group + 1) * count / groups * keys)};
}

}  // namespace relpos::fused
