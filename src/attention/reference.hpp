// Reference algorithm (scalar, float or double). Inputs are assumed validated.
#pragma once

#include "relpos/attention.hpp"

namespace relpos::reference {

// out, lse <- attention(q, k, v, pos)
template <class T>
void forward(const AttentionForward<T>& p);

// dq, dk, dv, dpos += gradients of sum(dout * out); needs forward's out and lse.
template <class T>
void backward(const AttentionBackward<T>& p);

}  // namespace relpos::reference
