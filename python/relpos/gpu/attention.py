"""``relpos.gpu.attention``: the Triton kernels behind one autograd function.

The scheme becomes kernel terms (terms.py) through differentiable torch
operations; the kernels then take q, k, v, the query / key features and the
bias parameters, and their backward returns the gradients of all of them, the
bias parameters' as fixed-order sums of per-tile partials (no atomics: the same
bits on every run).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton

from relpos.schemes import NoPosition, T5

from . import kernels
from .config import Launch, launch_for, padded
from .terms import Terms, terms_of

__all__ = ["attention"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _interpreting() -> bool:
    """Whether the kernels were made for Triton's interpreter (TRITON_INTERPRET=1 when
    kernels.py was imported), which runs them on CPU tensors."""
    return not isinstance(kernels.attention_forward_kernel, triton.runtime.JITFunction)


def _launch(q: torch.Tensor, v: torch.Tensor) -> Launch:
    return launch_for(max(q.shape[3], v.shape[3]), q.device.type == "cuda", q.element_size())


def _precision(q: torch.Tensor) -> str:
    """float32 follows torch's TF32 switch for matrix products, as torch's own kernels do;
    the interpreter multiplies half inputs as float32 (kernels._dot)."""
    if _interpreting():
        return "upcast"
    if q.dtype == torch.float32 and q.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


def _feature_precision(q: torch.Tensor) -> str:
    """The query / key features stay float32 (terms.py); on a GPU their product runs in TF32
    unless float32 calls have TF32 switched off."""
    if _interpreting() or (q.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32):
        return "ieee"
    return "tf32"


def _strides(x: Optional[torch.Tensor], n: int) -> list[int]:
    return list(x.stride()) if x is not None else [0] * n


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, qx, kx, p1, p2, table, bucket, pad, causal, delta, scale, bias):
        B, H, Lq, d = q.shape
        Hkv, Lk, dv = k.shape[1], k.shape[2], v.shape[3]
        dx = qx.shape[3] if qx is not None else 0
        cfg = _launch(q, v)
        out = torch.empty(B, H, Lq, dv, dtype=q.dtype, device=q.device)
        lse = torch.empty(B, H, Lq, dtype=torch.float32, device=q.device)
        R = Lq + Lk - 1
        bias_rows = table.float()[:, bucket.long()].contiguous() if table is not None else None
        meta = dict(H=H, GROUP=H // Hkv, Lq=Lq, Lk=Lk, d=d, dv=dv, dx=dx, delta=delta, r_min=delta - (Lq - 1), R=R)
        if Lq and Lk:
            attention_forward_kernel_launch(q, k, v, out, lse, pad, bias_rows, p1, p2, qx, kx, meta,
                                            scale, bias, causal, cfg)
        elif Lq:
            out.zero_()
            lse.fill_(-math.inf)
        ctx.save_for_backward(q, k, v, out, lse, qx, kx, p1, p2, table, bucket, pad, bias_rows)
        ctx.options = (causal, delta, scale, bias, meta, cfg)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, qx, kx, p1, p2, table, bucket, pad, bias_rows = ctx.saved_tensors
        causal, delta, scale, bias, meta, cfg = ctx.options
        B, H, Lq, d = q.shape
        dq = torch.zeros(B, H, Lq, d, dtype=q.dtype, device=q.device)
        dk, dvv = torch.zeros_like(k), torch.zeros_like(v)
        dqx = torch.zeros(qx.shape, dtype=qx.dtype, device=qx.device) if qx is not None else None
        nb = padded(table.shape[-1]) if table is not None else 16
        n_parts = {kernels.BIAS_NONE: 1, kernels.BIAS_ROW: nb, kernels.BIAS_ALIBI: 1}.get(bias, 2)
        tiles = triton.cdiv(Lq, cfg.block_m)
        parts = torch.zeros(B * H, tiles, n_parts, dtype=torch.float32, device=q.device)
        if Lq and meta["Lk"]:
            dout = dout.to(q.dtype)
            delta_rows = (dout.float() * out.float()).sum(-1).contiguous()
            attention_backward_launch(q, k, v, dout, lse, delta_rows, dq, dk, dvv, dqx, parts, pad, bias_rows,
                                      bucket, p1, p2, qx, kx, meta, scale, bias, causal, cfg, nb, n_parts)
        per_head = parts.view(B, H, tiles, n_parts).sum(dim=(0, 2))  # a fixed order: the same bits every run
        dp1 = dp2 = dtable = None
        if bias == kernels.BIAS_ROW:
            dtable = per_head[:, : table.shape[-1]].to(table.dtype)
        elif bias != kernels.BIAS_NONE:
            dp1 = per_head[:, 0].to(p1.dtype)
            if p2 is not None:
                dp2 = per_head[:, 1].to(p2.dtype)
        return dq, dk, dvv, dqx, None, dp1, dp2, dtable, None, None, None, None, None, None


def _common(q, k, v, out_or_do, pad, bias_rows, p1, p2, qx, kx, meta):
    """Pointers (q's where an input is absent: the constexpr switches never read it), the
    strides every kernel takes and the sizes, in the kernels' order."""
    dummy = q
    strides = [*q.stride(), *k.stride(), *v.stride(), *out_or_do.stride(), *_strides(qx, 4), *_strides(kx, 2),
               *_strides(pad, 2)]
    ptrs = [pad if pad is not None else dummy, bias_rows if bias_rows is not None else dummy,
            p1 if p1 is not None else dummy, p2 if p2 is not None else dummy,
            qx if qx is not None else dummy, kx if kx is not None else dummy]
    sizes = [meta[n] for n in ("H", "GROUP", "Lq", "Lk", "d", "dv", "dx", "delta", "r_min", "R")]
    return ptrs, strides, sizes


def _switches(q, v, qx, bias, causal, pad, cfg: Launch):
    return dict(D=padded(q.shape[3]), DV=padded(v.shape[3]), DX=padded(qx.shape[3] if qx is not None else 1),
                BM=cfg.block_m, BN=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages, BIAS=bias,
                HAS_X=qx is not None, CAUSAL=bool(causal), HAS_PAD=pad is not None,
                PRECISION=_precision(q), X_PRECISION=_feature_precision(q))


def attention_forward_kernel_launch(q, k, v, out, lse, pad, bias_rows, p1, p2, qx, kx, meta, scale, bias,
                                    causal, cfg):
    B, H, Lq = q.shape[:3]
    ptrs, strides, sizes = _common(q, k, v, out, pad, bias_rows, p1, p2, qx, kx, meta)
    pad_p, rows_p, p1_p, p2_p, qx_p, kx_p = ptrs
    grid = (triton.cdiv(Lq, cfg.block_m), B * H)
    kernels.attention_forward_kernel[grid](q, k, v, out, lse, pad_p, rows_p, p1_p, p2_p, qx_p, kx_p, *strides, *sizes,
                                           scale * kernels.LOG2E, **_switches(q, v, qx, bias, causal, pad, cfg))


def attention_backward_launch(q, k, v, dout, lse, delta_rows, dq, dk, dvv, dqx, parts, pad, bias_rows, bucket, p1,
                              p2, qx, kx, meta, scale, bias, causal, cfg, nb, n_parts):
    B, H, Lq = q.shape[:3]
    Hkv, Lk = k.shape[1], k.shape[2]
    ptrs, strides, sizes = _common(q, k, v, dout, pad, bias_rows, p1, p2, qx, kx, meta)
    pad_p, rows_p, p1_p, p2_p, qx_p, kx_p = ptrs
    switches = _switches(q, v, qx, bias, causal, pad, cfg)
    kernels.attention_backward_kv_kernel[(triton.cdiv(Lk, cfg.block_n), B * Hkv)](
        q, k, v, dout, lse, delta_rows, dk, dvv, pad_p, rows_p, p1_p, p2_p, qx_p, kx_p, *strides, *sizes,
        scale * kernels.LOG2E, scale, **switches)
    kernels.attention_backward_q_kernel[(triton.cdiv(Lq, cfg.block_m), B * H)](
        q, k, v, dout, lse, delta_rows, dq, dqx if dqx is not None else dq, parts, pad_p, rows_p,
        bucket if bucket is not None else q, p1_p, p2_p, qx_p, kx_p, *strides, *sizes,
        scale * kernels.LOG2E, scale, n_parts, NB=nb, **switches)


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
    if key_padding is not None and (key_padding.shape != (B, k.shape[2]) or key_padding.dtype not in (torch.bool, torch.uint8)):
        raise ValueError(f"relpos: key_padding: expected bool or uint8 of shape {(B, k.shape[2])}, "
                         f"got {key_padding.dtype} {tuple(key_padding.shape)}")


def _same_strides_as_grad(x: torch.Tensor) -> torch.Tensor:
    """x itself when a gradient buffer made like it has its strides (the backward writes dk,
    dv with k's and v's strides), else a contiguous copy."""
    return x if torch.empty_like(x).stride() == x.stride() else x.contiguous()


def attention(q, k, v, scheme=None, *, causal: bool = False, key_padding=None, q_offset=0, k_offset: int = 0,
              scale: Optional[float] = None, return_lse: bool = False):
    """Attention with relative positions on the GPU kernels: q ``(B, H, Lq, d)``, k
    ``(B, Hkv, Lk, d)``, v ``(B, Hkv, Lk, dv)``, scheme and options as ``relpos.torch.attention``;
    differentiable in q, k, v and every learnable tensor of the scheme. Runs on CUDA tensors;
    on CPU tensors only under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the
    tests check the kernels without a GPU."""
    scheme = NoPosition() if scheme is None else scheme
    _check(q, k, v, key_padding)
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(f"relpos: q: relpos.gpu runs CUDA tensors (CPU tensors under TRITON_INTERPRET=1), "
                         f"got {q.device}")
    Lq, Lk = q.shape[2], k.shape[2]
    if q_offset == "end":
        q_offset = k_offset + Lk - Lq
    delta = int(k_offset) - int(q_offset)
    if scale is None:
        scale = 1.0 if isinstance(scheme, T5) else 1.0 / math.sqrt(q.shape[3])
    terms: Terms = terms_of(scheme, q, k, int(q_offset), int(k_offset))
    bias_dtype = torch.float32
    p1 = terms.p1.to(bias_dtype) if terms.p1 is not None and terms.p1.dtype != bias_dtype else terms.p1
    p2 = terms.p2.to(bias_dtype) if terms.p2 is not None and terms.p2.dtype != bias_dtype else terms.p2
    pad = key_padding.to(torch.uint8) if key_padding is not None else None
    out, lse = _Attention.apply(_same_strides_as_grad(terms.q), _same_strides_as_grad(terms.k),
                                _same_strides_as_grad(v), terms.qx, terms.kx, p1, p2, terms.table, terms.bucket, pad,
                                bool(causal), delta, float(scale), terms.bias)
    return (out, lse) if return_lse else out
