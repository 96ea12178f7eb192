"""relpos on NVIDIA GPUs: fused relative-position attention in Triton, forward and
backward, with deterministic gradients of every positional parameter.

``relpos.gpu.attention(q, k, v, scheme, ...)`` takes ``relpos.torch.attention``'s
arguments (which sends CUDA tensors here). It needs torch and Triton, never the
compiled CPU extension: its modules import relpos.schemes (NumPy) and each other
only. Without Triton installed this package still imports (relpos.torch imports
it), and ``attention`` refuses with a message saying what to install.
"""
from __future__ import annotations

import importlib.util

__all__ = ["attention", "gradients", "AVAILABLE"]

# Whether Triton is installed: the kernels need it; CPU users of relpos.torch do not.
AVAILABLE = importlib.util.find_spec("triton") is not None

if AVAILABLE:
    from .attention import attention, gradients
else:
    def attention(q, k, v, scheme=None, **options):
        raise ValueError("relpos: relpos.gpu needs Triton for CUDA tensors (pip install triton); "
                         "CPU tensors run the C++ kernels")

    gradients = attention
