"""What the registered attention operators of relpos.torch (C++ kernels) and relpos.gpu
(Triton kernels) share in their autograd registration: the backward operator is not itself
differentiable, and says so when a second backward reaches it; and which calls may skip the
registered operators (``traced``): their Python dispatch costs host time that a short call
feels (on the CPU, 7-17 of a small decode step's 75 us and about 150 us of a small
forward+backward, docs/torch.md; on a GPU 0.4-0.7 ms per forward, more than its kernel at
L = 2048, docs/benchmarks.md), so eager calls run the operators' bodies through a
``torch.autograd.Function`` instead. And how both draw attention dropout's seed and offset."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from relpos.schemes import dropout_probability

# Tensor types an eager call passes: plain tensors and parameters (a table given as a
# parameter reaches the kernels as itself). Any other (fake, functional, a user's subclass)
# is a trace's or a framework's, which needs the registered ops.
EAGER_TYPES = (Tensor, torch.nn.Parameter)


def traced(inputs) -> bool:
    """Whether anything but plain eager execution sees this call: torch.compile, torch.jit.trace,
    a dispatch mode (torch.export, make_fx, fake tensors), a functorch transform (vmap, grad),
    or an input that is not a plain tensor. Those get the registered ops, which they know how
    to trace."""
    if torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None:
        return True
    if _get_current_dispatch_mode() is not None:
        return True
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return True
    return any(isinstance(x, Tensor) and type(x) not in EAGER_TYPES for x in inputs)


def no_double_backward(ctx, *grads):
    raise RuntimeError("relpos: attention has no double backward: a gradient of its gradient "
                       "(create_graph=True, then a second backward) is not supported")


def setup_nothing(ctx, inputs, output):
    """The backward operator's setup_context: no_double_backward needs nothing saved."""


def draw_dropout_rng(device, generator=None) -> Tensor:
    """Attention dropout's ``[seed, offset]`` for one call of relpos.torch or relpos.gpu: an int64
    tensor of two elements on ``device``, drawn by ``torch.randint`` from ``generator`` (torch's
    default generator of that device when None), so that ``torch.manual_seed`` repeats a run,
    the draw stays on the device (no host synchronisation, nothing host-side for CUDA graphs) and
    torch.compile traces it as a random op of its own. The kernels take the seed as the 64-bit
    word the int64 holds and the offset as its low 32 bits (docs/design.md, "Attention dropout")."""
    return torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, device=device, generator=generator)


def check_dropout_rng(dropout_rng, device) -> None:
    """A caller's ``dropout_rng`` checked by name: None, or an int64 tensor ``[seed, offset]`` of
    two elements on q's ``device``."""
    if dropout_rng is not None and (not isinstance(dropout_rng, Tensor) or dropout_rng.dtype != torch.int64
                                    or dropout_rng.numel() != 2 or dropout_rng.device != device):
        what = (f"{dropout_rng.dtype} of shape {tuple(dropout_rng.shape)} on {dropout_rng.device}"
                if isinstance(dropout_rng, Tensor) else type(dropout_rng).__name__)
        raise ValueError(f"relpos: dropout_rng: expected an int64 tensor [seed, offset] on q's device ({device}), "
                         f"got {what}")


def dropout_of(dropout_p, dropout_rng, device) -> tuple[float, Optional[Tensor]]:
    """A call's ``(dropout_p, dropout_rng)`` as relpos.torch's and relpos.gpu's ops take them,
    checked by name: p in [0, 1); the rng the caller gave or one drawn from torch's generator of
    the device (``draw_dropout_rng``: ``torch.manual_seed`` repeats it, and under torch.compile it
    is a random op of the graph). p = 0 draws nothing and gives None: the call without dropout,
    bit for bit, its generator untouched."""
    p = dropout_probability(dropout_p)
    check_dropout_rng(dropout_rng, device)
    if not p:
        return 0.0, None
    return p, (draw_dropout_rng(device) if dropout_rng is None else dropout_rng.reshape(2).contiguous())


def dropout_seed_offset(rng: Tensor) -> tuple[int, int]:
    """``(seed, offset)`` as relpos.forward takes them, from a ``draw_dropout_rng`` tensor (read on
    the host: the C++ kernels' calls, on CPU tensors)."""
    seed, offset = (int(x) for x in rng.tolist())
    return seed % 2**64, offset % 2**32
