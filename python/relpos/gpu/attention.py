"""``relpos.gpu.attention``: the Triton kernels behind one autograd function.

The scheme becomes kernel terms (terms.py) through differentiable torch
operations; the kernels then take q, k, v, the query / key features and the
bias parameters, and their backward returns the gradients of all of them, the
bias parameters' as fixed-order sums of per-tile partials (no atomics: the same
bits on every run).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
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


def _launch(call: "_Call") -> Launch:
    q, v, t = call.q, call.v, call.terms
    shaw = t.wk is not None or t.wv is not None
    return launch_for(max(q.shape[3], v.shape[3]), q.device.type == "cuda", q.element_size(), shaw)


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


@dataclass
class _Call:
    """One call's tensors and sizes as the kernels take them (absent inputs: None)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    terms: Terms
    bias_rows: Optional[torch.Tensor]  # (H, Lq + Lk - 1) float32: a table gathered through its buckets
    pad: Optional[torch.Tensor]
    causal: bool
    delta: int
    scale: float

    def pointers(self) -> list[torch.Tensor]:
        """PAD, BIAS_ROWS, P1, P2, QX, KX, WK, WV; q's where an input is absent (never read)."""
        t = self.terms
        return [x if x is not None else self.q for x in (self.pad, self.bias_rows, t.p1, t.p2, t.qx, t.kx, t.wk, t.wv)]

    def strides(self, out_or_dout: torch.Tensor) -> list[int]:
        return [*self.q.stride(), *self.k.stride(), *self.v.stride(), *out_or_dout.stride(),
                *_strides(self.terms.qx, 4), *_strides(self.terms.kx, 2), *_strides(self.pad, 2)]

    def sizes(self) -> list[int]:
        """H, GROUP, Lq, Lk, d, dv, dx, delta, r_min, R, shaw_k, stride_wkh, stride_wvh, xl_clamp."""
        (B, H, Lq, d), Hkv, Lk, dv = self.q.shape, self.k.shape[1], self.k.shape[2], self.v.shape[3]
        t = self.terms

        def head_stride(table):  # a table shared by the heads is read with head stride 0
            return table.stride(0) if table is not None and table.dim() == 3 else 0

        return [H, H // Hkv, Lq, Lk, d, dv, self.features(), self.delta, self.delta - (Lq - 1), Lq + Lk - 1,
                t.shaw_k, head_stride(t.wk), head_stride(t.wv), t.xl_clamp]

    def features(self) -> int:
        """The width of the query / key feature product (qx's columns but the clamp's two)."""
        return self.terms.kx.shape[1] if self.terms.kx is not None else 0

    def switches(self, cfg: Launch) -> dict:
        t = self.terms
        return dict(D=padded(self.q.shape[3]), DV=padded(self.v.shape[3]),
                    DX=padded(max(self.features(), 1)), BM=cfg.block_m, BN=cfg.block_n,
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages, BIAS=t.bias, HAS_X=t.qx is not None,
                    CAUSAL=self.causal, HAS_PAD=self.pad is not None, PRECISION=_precision(self.q),
                    X_PRECISION=_feature_precision(self.q), KEMB=t.wk is not None, VEMB=t.wv is not None,
                    ZERO_BEYOND=t.zero_beyond, X_CLAMP=t.xl_clamp > 0)

    def table_rows(self) -> int:
        """Rows of a Shaw table as the backward's partial sums hold them (a power of two)."""
        return padded(2 * self.terms.shaw_k + 1)


def _forward(call: _Call, out, lse, cfg: Launch):
    B, H, Lq = call.q.shape[:3]
    kernels.attention_forward_kernel[(triton.cdiv(Lq, cfg.block_m), B * H)](
        call.q, call.k, call.v, out, lse, *call.pointers(), *call.strides(out), *call.sizes(),
        call.scale * kernels.LOG2E, **call.switches(cfg))


def _backward(call: _Call, out, lse, dout, cfg: Launch):
    """(dq, dk, dv, dqx, per-head sums of the bias parameters' gradients (H, parts), of the
    Shaw tables' (H, rows, d) and (H, rows, dv))."""
    q, k, v, t = call.q, call.k, call.v, call.terms
    (B, H, Lq, d), Hkv, Lk = q.shape, k.shape[1], k.shape[2]
    dq = torch.zeros(B, H, Lq, d, dtype=q.dtype, device=q.device)
    dk, dvv = torch.zeros_like(k), torch.zeros_like(v)
    dqx = torch.zeros(t.qx.shape, dtype=t.qx.dtype, device=q.device) if t.qx is not None else None
    nb = padded(t.table.shape[-1]) if t.table is not None else 16
    n_parts = {kernels.BIAS_NONE: 1, kernels.BIAS_ROW: nb, kernels.BIAS_ALIBI: 1}.get(t.bias, 2)
    tiles, cp = triton.cdiv(Lq, cfg.block_m), call.table_rows()
    switches = call.switches(cfg)

    def partials(*shape):  # one partial sum per (batch, head, query tile), summed below in a fixed order
        return torch.zeros(B * H, tiles, *shape, dtype=torch.float32, device=q.device)

    parts = partials(n_parts)
    dwk = partials(cp, switches["D"]) if t.wk is not None else None
    dwv = partials(cp, switches["DV"]) if t.wv is not None else None
    if Lq and Lk:
        dout = dout.to(q.dtype)
        delta_rows = _row_dots(dout, out)
        pointers, strides, sizes = call.pointers(), call.strides(dout), call.sizes()
        kernels.attention_backward_kv_kernel[(triton.cdiv(Lk, cfg.block_n), B * Hkv)](
            q, k, v, dout, lse, delta_rows, dk, dvv, *pointers, *strides, *sizes,
            call.scale * kernels.LOG2E, call.scale, **switches)
        pad_p, rows_p, p1_p, p2_p, qx_p, kx_p, wk_p, wv_p = pointers
        kernels.attention_backward_q_kernel[(tiles, B * H)](
            q, k, v, dout, lse, delta_rows, dq, dqx if dqx is not None else dq, parts, pad_p, rows_p,
            t.bucket if t.bucket is not None else q, p1_p, p2_p, qx_p, kx_p, wk_p, wv_p,
            dwk if dwk is not None else parts, dwv if dwv is not None else parts, *strides, *sizes,
            call.scale * kernels.LOG2E, call.scale, n_parts, NB=nb, CP=cp, **switches)

    def per_head(x):  # the same bits on every run
        return x.view(B, H, tiles, *x.shape[2:]).sum(dim=(0, 2)) if x is not None else None

    return dq, dk, dvv, dqx, per_head(parts), per_head(dwk), per_head(dwv)


def _row_dots(dout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """D = rowsum(dout * out) in float32, ``(B, H, Lq)`` contiguous, computed a slice of rows at
    a time: the float32 copies of dout and out and their product, made whole, were three
    times out's size in float32 and the backward's peak memory (above SDPA's whole extra at
    head 64). A slice holds at most _ROW_DOT_ELEMENTS elements."""
    B, H, Lq, dv = out.shape
    rows = torch.empty(B, H, Lq, dtype=torch.float32, device=out.device)
    step = max(1, _ROW_DOT_ELEMENTS // max(1, B * H * dv))
    for i in range(0, Lq, step):
        j = min(Lq, i + step)
        rows[:, :, i:j] = (dout[:, :, i:j].float() * out[:, :, i:j].float()).sum(-1)
    return rows


_ROW_DOT_ELEMENTS = 1 << 22  # 16 MB per float32 temporary


def _table_grad(per_head: Optional[torch.Tensor], table: Optional[torch.Tensor]):
    """A Shaw table's gradient from its per-head sums (rows and width padded): summed over the
    heads for a table they share."""
    if table is None:
        return None
    g = per_head[:, : table.shape[-2], : table.shape[-1]]
    return (g if table.dim() == 3 else g.sum(0)).to(table.dtype)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, qx, kx, p1, p2, table, wk, wv, call):
        B, H, Lq = q.shape[:3]
        Lk = k.shape[2]
        cfg = _launch(call)
        out = torch.empty(B, H, Lq, v.shape[3], dtype=q.dtype, device=q.device)
        lse = torch.empty(B, H, Lq, dtype=torch.float32, device=q.device)
        if Lq and Lk:
            _forward(call, out, lse, cfg)
        elif Lq:
            out.zero_()
            lse.fill_(-math.inf)
        ctx.save_for_backward(out, lse)
        ctx.call, ctx.cfg = call, cfg
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        out, lse = ctx.saved_tensors
        call = ctx.call
        t = call.terms
        dq, dk, dvv, dqx, bias_sums, wk_sums, wv_sums = _backward(call, out, lse, dout, ctx.cfg)
        dp1 = dp2 = dtable = None
        if t.bias == kernels.BIAS_ROW:
            dtable = bias_sums[:, : t.table.shape[-1]].to(t.table.dtype)
        elif t.bias != kernels.BIAS_NONE:
            dp1 = bias_sums[:, 0].to(t.p1.dtype)
            if t.p2 is not None:
                dp2 = bias_sums[:, 1].to(t.p2.dtype)
        return dq, dk, dvv, dqx, None, dp1, dp2, dtable, _table_grad(wk_sums, t.wk), _table_grad(wv_sums, t.wv), None


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
    if key_padding is not None and (key_padding.shape != (B, k.shape[2])
                                    or key_padding.dtype not in (torch.bool, torch.uint8)):
        raise ValueError(f"relpos: key_padding: expected bool or uint8 of shape {(B, k.shape[2])}, "
                         f"got {key_padding.dtype} {tuple(key_padding.shape)}")


def _same_strides_as_grad(x: torch.Tensor) -> torch.Tensor:
    """x itself when a gradient buffer made like it has its strides (the backward writes dk,
    dv with k's and v's strides), else a contiguous copy."""
    return x if torch.empty_like(x, device="meta").stride() == x.stride() else x.contiguous()  # no allocation


def attention(q, k, v, scheme=None, *, causal: bool = False, key_padding=None, q_offset=0, k_offset: int = 0,
              scale: Optional[float] = None, return_lse: bool = False):
    """Attention with relative positions on the GPU kernels: q ``(B, H, Lq, d)``, k
    ``(B, Hkv, Lk, d)``, v ``(B, Hkv, Lk, dv)``, scheme and options as ``relpos.torch.attention``;
    differentiable in q, k, v and every learnable tensor of the scheme. Runs on CUDA tensors;
    on CPU tensors only under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the
    tests check the kernels without a GPU."""
    scheme = NoPosition() if scheme is None else scheme
    _check(q, k, v, key_padding)
    if not hasattr(scheme, "_args"):
        raise ValueError(f"relpos: scheme: expected a relpos scheme (Shaw, T5, ...), got {type(scheme).__name__}")
    scheme._args()  # each option checked by its record, with errors naming it
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
    pad = key_padding.to(torch.uint8) if key_padding is not None else None
    q_, k_, v_ = (_same_strides_as_grad(x) for x in (terms.q, terms.k, v))
    terms = replace(terms, q=q_, k=k_, **{n: _float32(getattr(terms, n)) for n in ("p1", "p2")},
                    **{n: _contiguous(getattr(terms, n), q.dtype) for n in ("wk", "wv")})
    bias_rows = terms.table.float()[:, terms.bucket.long()].contiguous() if terms.table is not None else None
    call = _Call(q_, k_, v_, terms, bias_rows, pad, bool(causal), delta, float(scale))
    out, lse = _Attention.apply(q_, k_, v_, terms.qx, terms.kx, terms.p1, terms.p2, terms.table, terms.wk, terms.wv,
                                call)
    return (out, lse) if return_lse else out


def _float32(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A per-head bias parameter as the kernels read it (autograd passes its gradient back)."""
    return x.float() if x is not None and x.dtype != torch.float32 else x


def _contiguous(x: Optional[torch.Tensor], dtype) -> Optional[torch.Tensor]:
    """A Shaw table in the inputs' dtype with contiguous rows, as the kernels index it."""
    return x.to(dtype).contiguous() if x is not None else None
