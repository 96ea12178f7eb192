"""What the registered attention operators of relpos.torch (C++ kernels) and relpos.gpu
(Triton kernels) share in their autograd registration: the backward operator is not itself
differentiable, and says so when a second backward reaches it."""
from __future__ import annotations


def no_double_backward(ctx, *grads):
    raise RuntimeError("relpos: attention has no double backward: a gradient of its gradient "
                       "(create_graph=True, then a second backward) is not supported")


def setup_nothing(ctx, inputs, output):
    """The backward operator's setup_context: no_double_backward needs nothing saved."""
