"""``attention``: differentiable relpos attention on torch tensors, as one call of the
registered operator ``torch.ops.relpos.attention_forward`` (``relpos.torch.ops``; an eager
call that nothing traces runs its body without the operator's dispatch: ``ops.forward``).

The operator runs the library's forward (fused where available) and saves ``out``
and the row logsumexp; its autograd formula, the operator
``relpos::attention_backward``, returns gradients for q, k, v and every learnable
tensor of the scheme (Shaw wk/wv, T5 table, ALiBi slopes if given,
Transformer-XL u/v/w_r). Being an operator with fake implementations, it runs
under ``torch.compile(fullgraph=True)``, ``torch.export``, ``torch.jit.trace``
and ``torch.vmap``. Tensors reach the core in place (DLPack), so strided views
such as ``(B, L, H, d)`` projections seen as ``(B, H, L, d)`` are not copied.

Attention dropout (``dropout_p``) draws each call's ``[seed, offset]`` from torch's
generator of q's device unless given (``relpos._autograd.dropout_of``); the op's autograd
saves it, and its backward draws the same mask again (docs/design.md, "Attention dropout").
"""
from __future__ import annotations

from typing import Optional

import torch

from relpos import gpu
from relpos._autograd import dropout_of
from relpos._calls import heads_first, resolve_q_offset
from relpos.schemes import flag, record_of
from relpos.torch.ops import encode, forward

__all__ = ["attention"]


def _on_gpu(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, algorithm, dropout_p, dropout_rng,
            segments):
    """CUDA tensors run relpos.gpu's Triton kernels (one fused algorithm; ``threads`` is a CPU
    setting and has no effect there)."""
    if algorithm not in ("auto", "fused"):
        raise ValueError(f"relpos: algorithm: CUDA tensors run the fused Triton kernels only, got {algorithm!r}")
    with_segments = {} if segments[0] is None else {"segments": segments}
    return gpu.attention(q, k, v, scheme, causal=causal, key_padding=key_padding, q_offset=q_offset,
                         k_offset=k_offset, scale=scale, dropout_p=dropout_p, dropout_rng=dropout_rng,
                         return_lse=True, **with_segments)


def segments_of(segments, Lq: int, Lk: int, device) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``segments`` (one (B, L) tensor of integer ids for queries and keys, Lq == Lk, or a pair
    (q_segments, k_segments)) as the (q, k) integer tensors on ``device``; (None, None) for None."""
    if segments is None:
        return None, None
    if isinstance(segments, (tuple, list)):
        if len(segments) != 2:
            raise ValueError("relpos: segments: expected a tensor of ids or a pair (q_segments, k_segments), "
                             f"got a sequence of {len(segments)}")
        pair = tuple(segments)
    elif Lq != Lk:
        raise ValueError(f"relpos: segments: one tensor of ids serves Lq == Lk only (got Lq={Lq}, Lk={Lk}); "
                         "give a pair (q_segments, k_segments)")
    else:
        pair = (segments, segments)
    ids = []
    for name, x in zip(("q_segments", "k_segments"), pair):
        if not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise ValueError(f"relpos: {name}: expected a tensor of integer segment ids, got "
                             f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.device != device:
            raise ValueError(f"relpos: {name}: on device {x.device}, expected {device} like q")
        ids.append(x)  # as given: the op's body converts them for the C++ kernels (range checked there)
    return ids[0], ids[1]


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scheme=None,
    *,
    causal: bool = False,
    key_padding: Optional[torch.Tensor] = None,
    q_offset: int = 0,
    k_offset: int = 0,
    scale: Optional[float] = None,
    algorithm: str = "auto",
    threads: Optional[int] = None,
    return_lse: bool = False,
    layout: str = "bhld",
    dropout_p: float = 0.0,
    dropout_rng: Optional[torch.Tensor] = None,
    segments=None,
):
    """Differentiable ``relpos.forward``: q ``(B, H, Lq, d)``, k ``(B, Hkv, Lk, d)``,
    v ``(B, Hkv, Lk, dv)`` -> out ``(B, H, Lq, dv)``; with ``layout="blhd"`` each
    is ``(B, L, heads, .)`` instead and read in place (out: a transposed view).
    ``scheme`` is a relpos scheme record (``relpos.Shaw``, ``T5``, ...) whose
    arrays are torch tensors; those that require grad receive gradients. Options
    as in ``relpos.forward`` (``q_offset="end"``: the queries are the last key
    positions); ``threads`` defaults to ``torch.get_num_threads()``.
    ``return_lse=True`` returns ``(out, lse)``, the row logsumexp ``(B, H, Lq)``
    as a constant (no gradient flows through it), e.g. to merge attention over
    key chunks. CUDA tensors run the Triton kernels of ``relpos.gpu`` (``algorithm``
    "auto" or "fused"); CPU tensors the C++ kernels.

    ``dropout_p`` in [0, 1): attention dropout, as ``scaled_dot_product_attention``'s (applied
    whatever the caller's training mode: a module passes 0 in eval): the probabilities after
    the softmax dropped, the kept ones scaled by ``1 / (1 - dropout_p)``, lse the softmax's, the
    backward through the same mask. Its mask is keyed by the batch row, query head and the
    absolute query and key positions (docs/design.md, "Attention dropout"), drawn from
    ``dropout_rng``: an int64 tensor ``[seed, offset]`` on q's device, by default drawn per call
    from torch's generator of that device (``torch.manual_seed`` repeats a run). 0 draws nothing
    and is the call without dropout, bit for bit.

    ``segments``: integer ids ``(B, L)`` of the queries' and keys' segments (Lq == Lk), or a pair
    ``(q_segments, k_segments)`` on q's device; a query sees the keys of its own segment only
    (packed documents; Swin's shifted windows)."""
    scheme, return_lse = record_of(scheme), flag(return_lse, "return_lse")
    for arg, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"relpos: {arg}: expected a 4-dimensional torch tensor, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    q, k, v = (heads_first(x, layout) for x in (q, k, v))
    dropout_p, dropout_rng = dropout_of(dropout_p, dropout_rng, q.device)
    q_segments, k_segments = segments_of(segments, q.shape[2], k.shape[2], q.device)
    if q.device.type == "cuda":
        out, lse = _on_gpu(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, algorithm, dropout_p,
                           dropout_rng, (q_segments, k_segments))
        out = heads_first(out, layout)
        return (out, lse.detach()) if return_lse else out
    q_offset = resolve_q_offset(q_offset, q.shape[2], k.shape[2], k_offset)
    name, params, ints, floats = encode(scheme, causal, q_offset, k_offset, scale, algorithm, threads)
    out, lse = forward(q, k, v, key_padding, params, name, ints, floats, dropout_rng, dropout_p, q_segments,
                       k_segments)
    out = heads_first(out, layout)
    return (out, lse.detach()) if return_lse else out
