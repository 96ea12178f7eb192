"""The GPU kernels that go row by row, with no loop over keys: RoPE's rotation, which
launch.py runs on q and k before the attention kernels (kernels.py) and on their gradients
after them, and the backward's row dots ``D = rowsum(dout * out)``, which both backward
kernels read. Each program takes BR rows of one (batch, head); the batch x head index
continues on launch axis 2 past 65,535 (kernels.batch_head).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .kernels import batch_head


@triton.jit
def _row_program(H, BR: tl.constexpr):
    """The program's (batch x head, batch, head) in int64 and its BR row indices."""
    bh = batch_head()
    return bh, bh // H, bh % H, tl.program_id(0) * BR + tl.arange(0, BR)


@triton.jit(do_not_specialize=["H", "L"])  # no recompile per head count or length
def rotate_kernel(X, Y, ROT, PARTNER, stride_ib, stride_ih, stride_il, stride_id, stride_ob, stride_oh, stride_ol,
                  stride_od, H, L, d, D: tl.constexpr, BR: tl.constexpr, TRANSPOSE: tl.constexpr):
    """RoPE's rotation of a (B, H, L, d) tensor X into Y by row position, BR rows of one
    (batch, head) per program: ``y = x * cos + x[:, partner] * sin`` from the (L, 2, D)
    float32 table ROT (per row its cos, then its sin with the rotation's sign; 1 and 0 past
    the rotated dimensions) and PARTNER (D,) int32 that terms.py makes; with TRANSPOSE the
    rotation's transpose, ``y = x * cos + (x * sin)[:, partner]``, which takes a gradient
    back through it (a column's partner's partner is the column itself). Computed in
    float32 and rounded once to Y's dtype.

    The attention kernels read q and k rotated by this kernel rather than rotating their
    tiles: every key tile of the loop then loaded its partner columns and its tables too,
    and on an H100 (bench/gpu.py) that ran RoPE at 18x plain attention's forward."""
    _, b, h, offs_r = _row_program(H, BR)
    offs_d = tl.arange(0, D)
    partner = tl.load(PARTNER + offs_d)
    mask = (offs_r[:, None] < L) & (offs_d[None, :] < d)
    rows = X + b * stride_ib + h * stride_ih + offs_r[:, None] * stride_il
    x = tl.load(rows + offs_d[None, :] * stride_id, mask=mask, other=0.0).to(tl.float32)
    x_partner = tl.load(rows + partner[None, :] * stride_id, mask=mask & (partner[None, :] < d), other=0.0)
    table = ROT + offs_r.to(tl.int64)[:, None] * (2 * D)
    cos = tl.load(table + offs_d[None, :], mask=mask, other=0.0)
    if TRANSPOSE:
        sin = tl.load(table + D + partner[None, :], mask=mask, other=0.0)
    else:
        sin = tl.load(table + D + offs_d[None, :], mask=mask, other=0.0)
    y = x * cos + x_partner.to(tl.float32) * sin
    tl.store(Y + b * stride_ob + h * stride_oh + offs_r[:, None] * stride_ol + offs_d[None, :] * stride_od,
             y.to(Y.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["H", "L"])
def row_dots_kernel(DO, O, DLT, stride_gb, stride_gh, stride_gl, stride_gd, stride_ob, stride_oh, stride_ol,
                    stride_od, H, L, dv, DV: tl.constexpr, BR: tl.constexpr):
    """``DLT[bh, i] = sum_c DO[b, h, i, c] * O[b, h, i, c]`` in float32 for BR rows of one
    (batch, head): the row dots ``D`` of the backward's ``dS = P (dP - D)``, out and dout
    ``(B, H, L, dv)`` of any strides, DLT ``(B, H, L)`` contiguous float32. One launch in place
    of the float32 copies, product and sum torch made of them (a slice of rows at a time, to
    keep their temporaries below the backward's own peak): no temporary at all, and one
    launch's host time."""
    bh, b, h, offs_r = _row_program(H, BR)
    offs_v = tl.arange(0, DV)
    mask = (offs_r[:, None] < L) & (offs_v[None, :] < dv)
    dout = tl.load(DO + b * stride_gb + h * stride_gh + offs_r[:, None] * stride_gl + offs_v[None, :] * stride_gd,
                   mask=mask, other=0.0)
    out = tl.load(O + b * stride_ob + h * stride_oh + offs_r[:, None] * stride_ol + offs_v[None, :] * stride_od,
                  mask=mask, other=0.0)
    tl.store(DLT + bh * L + offs_r, tl.sum(dout.to(tl.float32) * out.to(tl.float32), 1), mask=offs_r < L)
