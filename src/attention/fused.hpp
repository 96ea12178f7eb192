// The fused streaming kernel (algorithm fused): every scheme and mask, no
// (L, L) buffer. Inputs are assumed validated.
#pragma once

#include "relpos/attention.hpp"

namespace relpos::fused {

template <class T>
void forward(const AttentionForward<T>& p);
template <class T>
void backward(const AttentionBackward<T>& p);

// Groups each head's key tiles are split into by the backward (1 = the head
// runs whole on one thread); each group holds its own query-side gradients.
template <class T>
int64_t backward_key_groups(const AttentionForward<T>& p);

}  // namespace relpos::fused
