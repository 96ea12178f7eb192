"""``relpos.gpu.attention``: relative-position attention on the Triton kernels.

The scheme becomes kernel terms (terms.py) through differentiable torch operations;
``relpos::gpu_attention_forward`` (ops.py: the registered operator where a trace sees the
call, its body through an autograd.Function where none does) then runs the kernels on q,
k, v, the query / key features and the bias parameters, and its gradient,
``relpos::gpu_attention_backward``, returns the gradients of all of them,
the positional parameters' as fixed-order sums of per-program partials (no atomics:
the same bits on every run).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

import torch

from relpos._autograd import dropout_of
from relpos.schemes import DeBERTa, T5, dropout_probability, flag, record_of

from . import ops
from .launch import batch_head_axes, interpreting
from .terms import Terms, terms_of

__all__ = ["attention", "gradients"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Elements of one batch entry of q, k, v or out above which the kernels' int32 offsets within
# it would wrap (the batch and head offsets are int64).
_MAX_BATCH_ENTRY = (1 << 31) - 1


def _check(q, k, v, key_padding):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"relpos: {name}: expected a 4-dimensional torch tensor")
        if x.dtype not in _DTYPES:
            raise ValueError(f"relpos: {name}: dtype {x.dtype} has no GPU kernel (float32, bfloat16, float16)")
        if x.dtype != q.dtype or x.device != q.device:
            raise ValueError(f"relpos: {name}: expected q's dtype and device ({q.dtype}, {q.device}), "
                             f"got {x.dtype}, {x.device}")
    B, H, Lq, d = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[2] != v.shape[2] or k.shape[3] != d or v.shape[1] != k.shape[1]:
        raise ValueError(f"relpos: k, v: shapes {tuple(k.shape)}, {tuple(v.shape)} do not match q {tuple(q.shape)} "
                         "((B, Hkv, Lk, d) and (B, Hkv, Lk, dv))")
    if k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(f"relpos: k: its {k.shape[1]} heads must divide q's {H}")
    batch_head_axes(B * H)  # the launches' programs per (batch, head), refused by name where they cannot fit
    for name, x in (("q", q), ("k", k), ("v", v)):
        span = 1 + sum((n - 1) * step for n, step in zip(x.shape[1:], x.stride()[1:]))
        if x.numel() and max(span, H * Lq * v.shape[3]) > _MAX_BATCH_ENTRY:
            raise ValueError(f"relpos: {name}: one batch entry spans {span} elements of memory (out's "
                             f"{H * Lq * v.shape[3]}); the GPU kernels address at most 2^31 - 1 within one "
                             "(split the heads or the sequence into calls)")
    if key_padding is not None and (key_padding.shape != (B, k.shape[2])
                                    or key_padding.dtype not in (torch.bool, torch.uint8)):
        raise ValueError(f"relpos: key_padding: expected bool or uint8 of shape {(B, k.shape[2])}, "
                         f"got {key_padding.dtype} {tuple(key_padding.shape)}")
    if key_padding is not None and key_padding.device != q.device:
        raise ValueError(f"relpos: key_padding: on device {key_padding.device}, expected {q.device} like q")


def _same_strides_as_grad(x: torch.Tensor) -> torch.Tensor:
    """x itself when a gradient buffer made like it has its strides (the backward writes dk,
    dv with k's and v's strides), else a contiguous copy."""
    return x if torch.empty_like(x, device="meta").stride() == x.stride() else x.contiguous()  # no allocation


def attention(q, k, v, scheme=None, *, causal: bool = False, key_padding=None, q_offset=0, k_offset: int = 0,
              scale: Optional[float] = None, dropout_p: float = 0.0, dropout_rng: Optional[torch.Tensor] = None,
              return_lse: bool = False, segments=None):
    """Attention with relative positions on the GPU kernels: q ``(B, H, Lq, d)``, k
    ``(B, Hkv, Lk, d)``, v ``(B, Hkv, Lk, dv)``, scheme and options as ``relpos.torch.attention``;
    differentiable in q, k, v and every learnable tensor of the scheme. Runs on CUDA tensors;
    on CPU tensors only under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the
    tests check the kernels without a GPU.

    ``dropout_p`` in [0, 1): attention dropout after the softmax (docs/design.md, "Attention
    dropout"; ``lse`` stays the softmax's), its mask drawn in the kernels from ``dropout_rng``,
    an int64 tensor ``[seed, offset]`` on q's device (relpos._autograd.draw_dropout_rng's; one
    is drawn from torch's generator of the device when None). The kernels read it on the
    device, and the backward draws the same mask from it.

    ``segments`` (packed documents; Swin's shifted windows): integer ids on q's device, one
    ``(B, L)`` tensor for queries and keys (Lq == Lk) or a pair ``(q_segments (B, Lq), k_segments
    (B, Lk))``; a query sees only the keys of its own segment (docs/design.md, "Segments"). The
    ids are read by the kernels as they are, never checked on the host."""
    inputs = _op_inputs(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, dropout_p, dropout_rng,
                        segments)
    out, lse = ops.forward(*inputs)
    return (out, lse) if flag(return_lse, "return_lse") else out


def gradients(q, k, v, out, lse, dout, scheme=None, *, causal: bool = False, key_padding=None, q_offset=0,
              k_offset: int = 0, scale: Optional[float] = None, dropout_p: float = 0.0,
              dropout_rng: Optional[torch.Tensor] = None, segments=None) -> dict:
    """The gradients of one call given the output rows ``out`` and their logsumexp ``lse``
    of a larger one, named as ``relpos.backward`` names them: ``"q"``, ``"k"``, ``"v"`` and
    each learnable tensor the scheme holds (``"t5_table"``, ``"shaw_wk"``, ...). With out and
    lse merged over every key chunk, the sum over the chunks' calls is the whole call's gradient
    (ring attention's backward, relpos.torch.context_parallel). With dropout, ``dropout_rng`` is
    the forward's (its mask is drawn again: entries are keyed by global positions, so a key
    chunk's call draws its part of the whole call's mask); ``segments`` the call's own ids."""
    if dropout_probability(dropout_p) and dropout_rng is None:
        raise ValueError("relpos: dropout_rng: the gradients of a call with dropout need its forward's "
                         "dropout_rng (the mask is drawn again from it)")
    scheme = record_of(scheme)
    with torch.enable_grad():
        leaves = {"q": q.detach().requires_grad_(), "k": k.detach().requires_grad_(),
                  "v": v.detach().requires_grad_()}
        fields = {f: getattr(scheme, f) for f in scheme._tensors if getattr(scheme, f) is not None}
        tensors = {f: t.detach().requires_grad_() for f, t in fields.items()}
        leaves.update({f"{scheme.name}_{f}": t for f, t in tensors.items()})
        record = replace(scheme, **tensors)
        inputs = _op_inputs(leaves["q"], leaves["k"], leaves["v"], record, causal, key_padding, q_offset, k_offset,
                            scale, dropout_p, dropout_rng, segments)
        with torch.no_grad():  # the gradients themselves build no graph
            grads = ops.backward(*inputs[:3], out, lse, dout, *inputs[3:])
        reached = [(x, g) for x, g in zip(inputs, ops.input_gradients(inputs, grads))
                   if g is not None and x.requires_grad]
        torch.autograd.backward([x for x, _ in reached], [g for _, g in reached])
    return {name: x.grad if x.grad is not None else torch.zeros_like(x) for name, x in leaves.items()}


def _segments(segments, q, k) -> Optional[torch.Tensor]:
    """``segments`` (one (B, L) tensor of integer ids, Lq == Lk, or a pair (q_segments,
    k_segments)) as the kernels read them: ``(B, Lq + Lk)`` int64, each query's id then each
    key's (the ids as given, whatever their integer type); None for None."""
    if segments is None:
        return None
    (B, _, Lq, _), Lk = q.shape, k.shape[2]
    if isinstance(segments, (tuple, list)):
        if len(segments) != 2:
            raise ValueError("relpos: segments: expected a tensor of ids or a pair (q_segments, k_segments), "
                             f"got a sequence of {len(segments)}")
    elif Lq != Lk:
        raise ValueError(f"relpos: segments: one tensor of ids serves Lq == Lk only (got Lq={Lq}, Lk={Lk}); "
                         "give a pair (q_segments, k_segments)")
    else:
        segments = (segments, segments)
    for name, x, L in zip(("q_segments", "k_segments"), segments, (Lq, Lk)):
        if not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise ValueError(f"relpos: {name}: expected a tensor of integer segment ids, got "
                             f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
        if tuple(x.shape) != (B, L):
            raise ValueError(f"relpos: {name}: expected shape {(B, L)}, got {tuple(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"relpos: {name}: on device {x.device}, expected {q.device} like q")
    return torch.cat([x.to(torch.int64) for x in segments], 1).contiguous()


def _op_inputs(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, dropout_p, dropout_rng,
               segments=None) -> tuple:
    """The arguments of relpos::gpu_attention_forward for a call, its inputs checked: the
    scheme's terms made from q, k and its tensors by differentiable torch operations."""
    scheme = record_of(scheme)
    causal = flag(causal, "causal")
    _check(q, k, v, key_padding)
    segments = _segments(segments, q, k)
    dropout_p, dropout_rng = dropout_of(dropout_p, dropout_rng, q.device)
    scheme._args()  # each option checked by its record, with errors naming it
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(f"relpos: q: relpos.gpu runs CUDA tensors (CPU tensors under TRITON_INTERPRET=1), "
                         f"got {q.device}")
    Lq, Lk = q.shape[2], k.shape[2]
    if q_offset == "end":
        q_offset = k_offset + Lk - Lq
    delta = int(k_offset) - int(q_offset)
    if scale is None:
        scale = _default_scale(scheme, q.shape[3])
    terms: Terms = terms_of(scheme, q, k, int(q_offset), int(k_offset), v.shape[3])
    pad = key_padding.to(torch.uint8) if key_padding is not None else None
    q_, k_, v_ = (_same_strides_as_grad(x) for x in (terms.q, terms.k, v))
    terms = replace(terms, q=q_, k=k_, **{n: _float32(getattr(terms, n)) for n in ("p1", "p2", "qb")},
                    **{n: _contiguous(getattr(terms, n), q.dtype) for n in ("wk", "wv", "wq")})
    return (q_, k_, v_, pad, terms.table, terms.bucket, terms.p1, terms.p2, terms.qx, terms.kx, terms.wk, terms.wv,
            terms.wq, terms.row_of, terms.rot_q, terms.rot_k, terms.partner, terms.qb, terms.grid, segments,
            dropout_rng, ops.call_options(terms, causal, delta, int(q_offset)), float(scale), dropout_p)


def _default_scale(scheme, d: int) -> float:
    """The scheme's default scale: T5's 1, DeBERTa's ``1 / sqrt(d (1 + tables))``, else ``1 / sqrt(d)``."""
    if isinstance(scheme, T5):
        return 1.0
    if isinstance(scheme, DeBERTa):
        return 1.0 / math.sqrt(d * (1 + sum(t is not None for t in (scheme.c2p, scheme.p2c))))
    return 1.0 / math.sqrt(d)


def _float32(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A per-head parameter as the kernels read it, float32 with contiguous rows (autograd
    passes its gradient back)."""
    return x.float().contiguous() if x is not None else None


def _contiguous(x: Optional[torch.Tensor], dtype) -> Optional[torch.Tensor]:
    """A table of rows per distance in the inputs' dtype with contiguous rows, as the kernels index
    it: ``(rows, width)`` shared by the heads (also when given as ``(1, rows, width)``) or
    ``(H, rows, width)``."""
    if x is None:
        return None
    return (x[0] if x.dim() == 3 and x.shape[0] == 1 else x).to(dtype).contiguous()
