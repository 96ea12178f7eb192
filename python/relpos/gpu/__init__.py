"""relpos on NVIDIA GPUs: fused relative-position attention in Triton, forward and
backward, with deterministic gradients of every positional parameter.

``relpos.gpu.attention(q, k, v, scheme, ...)`` takes ``relpos.torch.attention``'s
arguments. It needs torch and Triton, never the compiled CPU extension: this
package imports relpos.schemes (NumPy) and its own modules only.
"""
from .attention import attention

__all__ = ["attention"]
