"""The launches of the GPU kernels (kernels.py) for one call: pointers, strides, sizes and
switches from the call's tensors, then the forward and the two backward kernels (with
RoPE, rotate_kernel on q and k before them and on dq and dk after the backward's).

What the registered operators (ops.py) run, eagerly and when torch.compile or
torch.export trace them: the kernels are launched through ``torch.library.wrap_triton``,
which records them in a traced graph and launches them directly otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch
import triton
from torch._subclasses.fake_tensor import is_fake
from torch.library import wrap_triton

from . import dropout, kernels, row_kernels
from .config import ROW_KERNELS, Launch, Launches, launch_for, padded, query_programs
from .grid import GRID_AXES, GRID_TABLE, fold_widths
from .terms import Terms


def interpreting() -> bool:
    """Whether the kernels were made for Triton's interpreter (TRITON_INTERPRET=1 when
    kernels.py was imported), which runs them on CPU tensors."""
    return not isinstance(kernels.attention_forward_kernel, triton.runtime.JITFunction)


def precisions(dtype: torch.dtype, device_type: str) -> tuple[str, str]:
    """PRECISION and X_PRECISION, the kernels' products and Transformer-XL's feature product
    (float32 whatever the inputs' type, terms.py), for a call of ``dtype`` on ``device_type``.
    float32 follows torch's TF32 switch for matrix products: TF32 when it is on; when it is off
    (torch's default), TF32 three times (each factor split into a TF32 part and its remainder,
    each product within about 2^-22 of float32's) on the tensor cores, the products SDPA's
    memory-efficient kernel takes for float32 on these cards. Exact float32 products run on the
    CUDA cores, 3.2-6.5x slower forward+backward on an H200 (bench/results/gpu_tiles_float32_*.md).
    Half types multiply exactly on the tensor cores (ieee); the interpreter multiplies half
    inputs as float32 (kernels._dot) and the features exactly."""
    if interpreting():
        return "upcast", "ieee"
    features = "tf32x3" if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    return (features if dtype == torch.float32 and device_type == "cuda" else "ieee"), features


# CUDA's limit on a launch's grid axes 1 and 2 (axis 0 holds 2^31 - 1).
MAX_LAUNCH_AXIS = 65535


def batch_head_axes(n: int) -> tuple[int, int]:
    """Launch axes 1 and 2 for ``n`` (batch x head) programs, which kernels.batch_head numbers
    ``axis 2 index x axis 1 size + axis 1 index``: ``(n, 1)`` where n fits one axis, else the largest
    divisor of n that does and the quotient (every program a batch x head, none past n). Swin's
    windows are batch entries: 512 images of 64 windows x 3 heads are 98,304 programs, (49152, 2)."""
    if n <= MAX_LAUNCH_AXIS:
        return n, 1
    first = next(f for f in range(MAX_LAUNCH_AXIS, 0, -1) if n % f == 0)
    if n // first > MAX_LAUNCH_AXIS:
        raise ValueError(f"relpos: batch x heads = {n} does not split into two GPU launch axes of at most "
                         f"{MAX_LAUNCH_AXIS} (its largest divisor within one is {first}); split the batch")
    return first, n // first


def _strides(x: Optional[torch.Tensor], n: int) -> list[int]:
    return list(x.stride()) if x is not None else [0] * n


@dataclass
class Call:
    """One call's tensors and sizes as the kernels take them (absent inputs: None)."""

    terms: Terms
    v: torch.Tensor
    pad: Optional[torch.Tensor]
    causal: bool
    delta: int
    scale: float
    q_offset: int  # the first query's position (its key's is q_offset + delta)
    dropout_p: float  # 0: no dropout
    dropout_rng: Optional[torch.Tensor]  # with dropout, [seed, offset] int64 on the device
    segments: Optional[torch.Tensor] = None  # (B, Lq + Lk) int64: each query's segment id, then each key's

    @property
    def q(self) -> torch.Tensor:
        return self.terms.q

    @property
    def k(self) -> torch.Tensor:
        return self.terms.k

    def bias_rows(self) -> Optional[torch.Tensor]:
        """(H, Lq + Lk - 1) float32: a bucketed table gathered per distance of the call."""
        t = self.terms
        return t.table.float()[:, t.bucket.long()].contiguous() if t.table is not None else None

    def tables(self) -> list[torch.Tensor]:
        """The call's tables of rows per distance (Shaw's, DeBERTa's)."""
        return [x for x in (self.terms.wk, self.terms.wv, self.terms.wq) if x is not None]

    def launch(self) -> Launches:
        cfgs = launch_for(max(self.q.shape[3], self.v.shape[3]), self.q.device.type == "cuda",
                          self.q.element_size(), bool(self.tables()), features=self.terms.qx is not None,
                          split_float32=self.precisions()[0] == "tf32x3")
        if self.tables():  # a tile pair's BM + BN distances, a power of two
            for cfg in (cfgs.forward, cfgs.backward_kv, cfgs.backward_q):
                if cfg.block_m != cfg.block_n:
                    raise ValueError(
                        f"relpos: tables per distance need square tiles, got {cfg.block_m} x {cfg.block_n}")
        return cfgs

    def precisions(self) -> tuple[str, str]:
        return precisions(self.q.dtype, self.q.device.type)

    def pointers(self, bias_rows: Optional[torch.Tensor]) -> list[torch.Tensor]:
        """PAD, BIAS_ROWS, BUCKET, P1, P2, QX, KX, WK, WV, QB, WQ, ROW_OF, RNG, GT, SEG; q's where an
        input is absent (never read)."""
        t = self.terms
        return [x if x is not None else self.q
                for x in (self.pad, bias_rows, t.bucket, t.p1, t.p2, t.qx, t.kx, t.wk, t.wv, t.qb, t.wq, t.row_of,
                          self.dropout_rng, t.grid, self.segments)]

    def strides(self, out_or_dout: torch.Tensor) -> list[int]:
        return [*self.q.stride(), *self.k.stride(), *self.v.stride(), *out_or_dout.stride(),
                *_strides(self.terms.qx, 4), *_strides(self.terms.kx, 2), *_strides(self.pad, 2)]

    def sizes(self) -> list[int]:
        """H, GROUP, Lq, Lk, d, dv, dx, delta, r_min, R, shaw_k, stride_wkh, stride_wvh, stride_wqh, xl_clamp,
        grid_a, grid_b."""
        (B, H, Lq, d), Hkv, Lk, dv = self.q.shape, self.k.shape[1], self.k.shape[2], self.v.shape[3]
        t = self.terms

        def head_stride(table):  # a table shared by the heads is read with head stride 0
            return table.stride(0) if table is not None and table.dim() == 3 else 0

        return [H, H // Hkv, Lq, Lk, d, dv, self.features(), self.delta, self.delta - (Lq - 1), Lq + Lk - 1,
                t.shaw_k, head_stride(t.wk), head_stride(t.wv), head_stride(t.wq), t.xl_clamp, t.grid_a, t.grid_b]

    def dropout_args(self) -> list:
        """query_pos, key_pos, keep_from, keep_scale: the positions of the first query and key and
        dropout's threshold as int32 bits, and its scale (dropout.py; unread without dropout)."""
        return [dropout.int32_bits(self.q_offset), dropout.int32_bits(self.q_offset + self.delta),
                dropout.threshold(self.dropout_p), dropout.scale(self.dropout_p)]

    def features(self) -> int:
        """The width of the query / key feature product (qx's columns but the clamp's two)."""
        return self.terms.kx.shape[1] if self.terms.kx is not None else 0

    def switches(self, cfg: Launch) -> dict:
        t = self.terms
        products, features = self.precisions()
        return dict(D=padded(self.q.shape[3]), DV=padded(self.v.shape[3]),
                    DX=padded(max(self.features(), 1)), BM=cfg.block_m, BN=cfg.block_n,
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages, BIAS=t.bias, HAS_X=t.qx is not None,
                    CAUSAL=self.causal, HAS_PAD=self.pad is not None, PRECISION=products,
                    X_PRECISION=features, KEMB=t.wk is not None, VEMB=t.wv is not None,
                    QEMB=t.wq is not None, ZERO_BEYOND=t.zero_beyond, ROW_MAP=t.row_of is not None,
                    X_CLAMP=t.xl_clamp > 0, QUERY_BIAS=t.qb is not None,
                    DROPOUT=dropout.mode(self.dropout_p, self.q_offset + self.delta, cfg.block_n),
                    GRID=t.grid_kind, HAS_SEG=self.segments is not None)

    def table_rows(self) -> int:
        """Rows of the call's tables (all have as many), as the backward's partial sums hold them."""
        return self.tables()[0].shape[-2] if self.tables() else 0

    def bias_parts(self) -> int:
        """Partial sums per program of the bias parameters' gradients: one per bucket (padded)
        of a table, per slope, per r1 and r2, per entry of Swin's table."""
        t = self.terms
        if t.bias == kernels.BIAS_ROW:
            return padded(t.table.shape[-1])
        if t.grid_kind == GRID_TABLE:
            return t.grid.shape[-1]
        return {kernels.BIAS_NONE: 1, kernels.BIAS_ALIBI: 1}.get(t.bias, 2)

    def runs_kernels(self) -> bool:
        """False for empty calls, and while torch traces the interpreter's kernels with fake
        tensors (torch.library.wrap_triton hands interpreted kernels back unwrapped, so they
        would run on tensors without memory; their outputs' shapes are all a trace needs).
        Real Triton kernels are always launched: under a trace wrap_triton records them."""
        if not (self.q.shape[2] and self.k.shape[2]):
            return False
        return not (interpreting() and is_fake(self.q))

    def rotated(self) -> "Call":
        """The call as the attention kernels run it: with RoPE, q and k rotated by their
        positions (rotate_kernel) and no rotation left to apply; else the call itself."""
        t = self.terms
        if t.rot_q is None:
            return self
        q, k = _rotate(t.q, t.rot_q, t.partner, t.q.dtype), _rotate(t.k, t.rot_k, t.partner, t.k.dtype)
        return replace(self, terms=replace(t, q=q, k=k, rot_q=None, rot_k=None, partner=None))


def _row_grid(B: int, H: int, L: int) -> tuple[int, int, int]:
    """The launch grid of a row kernel (row_kernels.py) over L rows of B x H heads."""
    return triton.cdiv(L, ROW_KERNELS.block_m), *batch_head_axes(B * H)


def _rotate(x: torch.Tensor, table: torch.Tensor, partner: torch.Tensor, dtype: torch.dtype,
            transpose: bool = False) -> torch.Tensor:
    """x ``(B, H, L, d)`` rotated by RoPE's ``table`` (terms.Terms.rot_q / rot_k), or by its
    transpose (a gradient taken back through the rotation), as a new tensor of ``dtype`` with
    x's strides."""
    y = torch.empty_like(x, dtype=dtype)
    if x.numel() and not (interpreting() and is_fake(x)):
        B, H, L, d = x.shape
        wrap_triton(row_kernels.rotate_kernel)[_row_grid(B, H, L)](
            x, y, table, partner, *x.stride(), *y.stride(), H, L, d, D=padded(d), BR=ROW_KERNELS.block_m,
            TRANSPOSE=transpose, num_warps=ROW_KERNELS.num_warps, num_stages=ROW_KERNELS.num_stages)
    return y


def forward(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """out ``(B, H, Lq, dv)`` and the rows' logsumexp ``(B, H, Lq)`` float32 (-inf where no key)."""
    call = call.rotated()
    B, H, Lq = call.q.shape[:3]
    cfg = call.launch().forward
    out = call.q.new_empty(B, H, Lq, call.v.shape[3])
    lse = call.q.new_empty(B, H, Lq, dtype=torch.float32)
    if not call.k.shape[2]:
        out.zero_()
        lse.fill_(-math.inf)
    if call.runs_kernels():
        wrap_triton(kernels.attention_forward_kernel)[(triton.cdiv(Lq, cfg.block_m), *batch_head_axes(B * H))](
            call.q, call.k, call.v, out, lse, *call.pointers(call.bias_rows()), *call.strides(out), *call.sizes(),
            *call.dropout_args(), call.scale * kernels.LOG2E, **call.switches(cfg))
    return out, lse


def backward(call: Call, out, lse, dout):
    """(dq, dk, dv, dqx, per-head sums of the bias parameters' gradients (H, parts; Swin's table's),
    of the tables' wk (H, rows, D), wv (H, rows, DV), wq (H, rows, D), SAM's gradient of its
    per-row scores (B, H, Lq, kh + kw)); absent ones None. The sums over batch and
    programs run in a fixed order: the same bits on every run. With RoPE the kernels see q
    and k rotated again and write the gradients of the rotated q and k in float32, which
    the rotation's transpose takes back to q's and k's dtype (one rounding, as without it);
    the rotated copies are gone by then."""
    t = call.terms
    if t.rot_q is None:
        return _backward_kernels(call, out, lse, dout, call.q.dtype)
    dq, dk, *rest = _backward_kernels(call.rotated(), out, lse, dout, torch.float32)
    return (_rotate(dq, t.rot_q, t.partner, t.q.dtype, transpose=True),
            _rotate(dk, t.rot_k, t.partner, t.k.dtype, transpose=True), *rest)


def _backward_kernels(call: Call, out, lse, dout, grad_dtype: torch.dtype):
    """backward's kernels on a call without a rotation left, dq and dk made in ``grad_dtype``."""
    q, k, v, t = call.q, call.k, call.v, call.terms
    (B, H, Lq, d), Lk = q.shape, k.shape[2]
    cfgs = call.launch()
    kv, qs = call.switches(cfgs.backward_kv), call.switches(cfgs.backward_q)  # the two kernels' switches
    # programs that own several tiles where a table's partial sums would otherwise be one per tile
    programs = query_programs(triton.cdiv(Lq, qs["BM"]), B * H, bool(call.tables()) or t.grid_kind == GRID_TABLE)
    n_parts, rows = call.bias_parts(), call.table_rows()
    # The kernels write every element of these (rows past Lq or Lk masked off); they are zeros
    # only where the kernels do not run (an empty call).
    runs = call.runs_kernels()
    like = torch.empty_like if runs else torch.zeros_like
    dq = like(q, memory_format=torch.contiguous_format, dtype=grad_dtype)
    dk, dvv = like(k, dtype=grad_dtype), like(v)  # the strides of k and v, as the kernels write them
    dqx = like(t.qx) if t.qx is not None else None

    def partials(table, width):  # a table's partial sums per (batch, head, query program), which the kernel
        # adds to (zeros first) and per_head sums in a fixed order
        return q.new_zeros(B * H, programs, rows, width, dtype=torch.float32) if table is not None else None

    # the bias parameters' or Swin's table's partial sums; a call with neither passes a placeholder, never read
    with_parts = bool(t.bias) or t.grid_kind == GRID_TABLE
    parts = q.new_zeros(*((B * H, programs, n_parts) if with_parts else (1,)), dtype=torch.float32)
    dwk, dwv, dwq = partials(t.wk, qs["D"]), partials(t.wv, qs["DV"]), partials(t.wq, qs["D"])
    dgrid = torch.zeros_like(t.grid) if t.grid_kind == GRID_AXES else None  # SAM's sums of dS by key grid row, column
    gy, gx = fold_widths(t.grid_b, qs["BN"]) if t.grid_kind == GRID_AXES else (16, 0)
    if runs:
        dout, lse = dout.to(q.dtype), lse.contiguous()  # the kernels read lse as (B, H, Lq) rows
        delta_rows = _row_dots(dout, out)
        pointers, strides = call.pointers(call.bias_rows()), call.strides(dout)
        sizes = call.sizes() + call.dropout_args()  # the kernels take dropout's after the sizes
        wrap_triton(kernels.attention_backward_kv_kernel)[(triton.cdiv(Lk, kv["BN"]),
                                                            *batch_head_axes(B * k.shape[1]))](
            q, k, v, dout, lse, delta_rows, dk, dvv, *pointers, *strides, *sizes,
            call.scale * kernels.LOG2E, call.scale, **kv)
        wrap_triton(kernels.attention_backward_q_kernel)[(programs, *batch_head_axes(B * H))](
            q, k, v, dout, lse, delta_rows, dq, dqx if dqx is not None else dq, parts, *pointers,
            *(x if x is not None else parts for x in (dwk, dwv, dwq, dgrid)), *strides, *sizes,
            call.scale * kernels.LOG2E, call.scale, n_parts, rows, NB=max(n_parts, 16) if t.bias else 16, GY=gy, GX=gx,
            **qs)

    def per_head(x, scale=1.0):  # the kernel leaves the tables' dS-weighted sums unscaled
        return x.view(B, H, programs, *x.shape[2:]).sum(dim=(0, 2)) * scale if x is not None else None

    return (dq, dk, dvv, dqx, per_head(parts if with_parts else None), per_head(dwk, call.scale), per_head(dwv),
            per_head(dwq, call.scale), dgrid)


def _row_dots(dout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """D = rowsum(dout * out) in float32, ``(B, H, Lq)`` contiguous (row_kernels.row_dots_kernel)."""
    B, H, Lq, dv = out.shape
    rows = torch.empty(B, H, Lq, dtype=torch.float32, device=out.device)
    wrap_triton(row_kernels.row_dots_kernel)[_row_grid(B, H, Lq)](
        dout, out, rows, *dout.stride(), *out.stride(), H, Lq, dv, DV=padded(dv), BR=ROW_KERNELS.block_m,
        num_warps=ROW_KERNELS.num_warps, num_stages=ROW_KERNELS.num_stages)
    return rows
