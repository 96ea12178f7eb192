// The fused streaming kernel (algorithm fused): every scheme and mask, no
// (L, L) buffer. Inputs are assumed validated.
#pragma once

#include "relpos/attention.hpp"

namespace relpos::fused {

template <class T>
void forward(const AttentionForward<T>& p);
template <class T>
void backward(const AttentionBackward<T>& p);

}  // namespace relpos::fused
