"""Positions on a grid and segments in the GPU kernels (docs/design.md, section 1, "Positions on a
grid (SAM, Swin)" and "Segments"): the kernels' ``GRID`` and ``HAS_SEG`` switches.

``GRID_AXES`` (SAM's decomposed tables): terms.py computes, by differentiable torch operations,
each query row's scores against both tables gathered by the key grid's rows and columns,
``GT (B, H, Lq, kh + kw)`` float32: ``GT[i, a] = q_i . rel_h[rel(y_i, a)]`` for key grid row
``a``, then ``GT[i, kh + c] = q_i . rel_w[rel(x_i, c)]`` for key grid column ``c``. The logit of
``(i, j)`` gains ``GT[i, j // kw] + GT[i, kh + j % kw]``, read per pair from the query's row (L1
and L2 hold it); the dq kernel sums dS into the same shape, ``DG (B, H, Lq, kh + kw)``: per key
tile, dS's sums by the tile's key grid rows (a 0/1 product ``(BN, GY)``, dS taken as dq's
product takes it) and by its key grid columns (the dS tile itself, float32, when the grid is at
least a tile wide, whose keys then have distinct columns; a 0/1 product ``(BN, GX)`` otherwise),
added to the program's own rows of DG (int32 offsets within a head's rows: fewer registers than
int64 pointers, which spilled 948 bytes per thread in the dq kernel, bfloat16, head 64, sm_90,
against 56). torch's autograd takes DG back to q, rel_h and rel_w through the products that made
GT.

``GRID_TABLE`` (Swin's bias per head and offset pair): the logit gains ``GT[h, n]``, ``n = (y_i - y_j
+ wh - 1)(2 ww - 1) + x_i - x_j + ww - 1``, computed from the cells. With ``P(c) = (c // ww)(2 ww
- 1) + c % ww`` (a cell's place on the grid of offsets) ``n = P(i) - P(j) + P(wh ww - 1)``, so a
tile pair reaches the entries between its first query against its last key and its last query
against its first key. The dq kernel adds dS's sums per entry to the program's partial sums
(PARTS, one row of table entries per program, summed per head by launch.py in a fixed order):
32 entries at a time, each query row's key for each entry gathered from the tile (a query reads
an entry through at most one key).

``HAS_SEG``: ``SEG (B, Lq + Lk)`` int64, each query's segment id then each key's; a pair whose
ids differ is masked like a padded key.

No atomics: a program adds only to its own rows of DG and its own partial sums, one tile after
the other (a barrier between: the next tile's loads may be other threads' addresses).
"""
from __future__ import annotations

import triton
import triton.language as tl

# The kernels' GRID switch.
GRID_NONE, GRID_AXES, GRID_TABLE = range(3)


def fold_widths(kw: int, block_n: int) -> tuple[int, int]:
    """GY and GX of the dq kernel for a key grid ``kw`` wide and tiles of ``block_n`` keys: GY the
    key grid rows a tile may span, from its first key's (0/1 product width, at least 16); GX the
    columns' 0/1 product width where a tile's keys wrap onto shared columns (kw < block_n), 0
    where their columns are distinct (dS added as it is)."""
    gy = max(16, triton.next_power_of_2(min(block_n, (block_n - 1) // kw + 2)))
    return gy, (0 if kw >= block_n else max(16, triton.next_power_of_2(kw)))


@triton.jit
def _cell(i, width):
    """Cell ``i`` of a grid ``width`` wide as its place on the grid of offsets (2 width - 1 wide)."""
    return (i // width) * (2 * width - 1) + i % width


@triton.jit
def grid_bias(GT, bh, h, offs_m, offs_n, Lq, Lk, ga, gb, GRID: tl.constexpr):
    """``(BM, BN)`` float32, natural units: the grid term of query rows ``offs_m`` against keys
    ``offs_n`` of batch x head ``bh`` (head ``h``); ``ga, gb`` are kh, kw (SAM) or wh, ww (Swin)."""
    ok = (offs_m[:, None] < Lq) & (offs_n[None, :] < Lk)
    if GRID == 1:
        base, rows = GT + bh * Lq * (ga + gb), offs_m[:, None] * (ga + gb)  # int32 offsets in the head's rows
        value = (tl.load(base + (rows + (offs_n // gb)[None, :]), mask=ok, other=0.0)
                 + tl.load(base + (rows + ga + (offs_n % gb)[None, :]), mask=ok, other=0.0))
    else:
        n = _cell(offs_m, gb)[:, None] - _cell(offs_n, gb)[None, :] + _cell(ga * gb - 1, gb)
        value = tl.load(GT + h * ((2 * ga - 1) * (2 * gb - 1)) + n, mask=ok, other=0.0)
    return value


@triton.jit
def same_segment(ok, SEG, b, offs_m, offs_n, Lq, Lk, HAS_SEG: tl.constexpr):
    """``ok`` and, with HAS_SEG, whether each pair's query and key share a segment."""
    if HAS_SEG:
        ids = SEG + b * (Lq + Lk)
        q_ids = tl.load(ids + offs_m, mask=offs_m < Lq, other=0)
        k_ids = tl.load(ids + Lq + offs_n, mask=offs_n < Lk, other=0)
        ok = ok & (q_ids[:, None] == k_ids[None, :])
    return ok


@triton.jit
def _sum_by(ds, onehot, like, PRECISION: tl.constexpr):
    """``ds @ onehot`` for a 0/1 matrix: dS's column sums that each output column takes, dS taken as
    dq's product takes it (rounded to ``like``'s half type; float32 in PRECISION), the 0/1 factor
    exact in each, the sums float32. With float32 dS split for TF32 three times the dq kernel
    spilled 700 bytes more per thread (bfloat16, head 64, sm_90)."""
    if PRECISION == "upcast":
        out = tl.dot(ds.to(like.dtype).to(tl.float32), onehot.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(ds.to(like.dtype), onehot.to(like.dtype), input_precision=PRECISION)
    return out


@triton.jit
def _add(at, x, mask):
    tl.store(at, tl.load(at, mask=mask, other=0.0) + x, mask=mask)


@triton.jit
def grid_grads(ds, like, DG, parts, bh, m_start, n_start, offs_m, offs_n, Lq, Lk, ga, gb, PRECISION: tl.constexpr,
               GRID: tl.constexpr, GY: tl.constexpr, GX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Adds one tile pair's dS (natural units) to the grid term's gradient: with GRID_AXES to the
    query rows' sums in DG, with GRID_TABLE to the program's partial sums ``parts`` per entry."""
    if GRID == 1:
        base = DG + bh * Lq * (ga + gb)  # this head's rows; offsets in them int32
        rows = offs_m * (ga + gb)
        live = offs_m[:, None] < Lq
        y0 = n_start // gb  # the tile's first key grid row; its keys' rows are y0 + [0, GY)
        cols = tl.arange(0, GY)
        by_row = _sum_by(ds, (offs_n // gb - y0)[:, None] == cols[None, :], like, PRECISION)
        _add(base + rows[:, None] + (y0 + cols)[None, :], by_row, live & (y0 + cols < ga)[None, :])
        if GX == 0:  # a grid at least a tile wide: the tile's keys have distinct columns
            _add(base + (rows[:, None] + ga + (offs_n % gb)[None, :]), ds, live & (offs_n < Lk)[None, :])
        else:
            cols = tl.arange(0, GX)
            by_col = _sum_by(ds, (offs_n % gb)[:, None] == cols[None, :], like, PRECISION)
            _add(base + (rows[:, None] + ga + cols[None, :]), by_col, live & (cols < gb)[None, :])
        tl.debug_barrier()  # the next tile's loads of these rows may be other threads'
    elif GRID == 2:
        last = _cell(ga * gb - 1, gb)
        lo = _cell(m_start, gb) - _cell(tl.minimum(n_start + BN, Lk) - 1, gb) + last
        hi = _cell(tl.minimum(m_start + BM, Lq) - 1, gb) - _cell(n_start, gb) + last
        yq, xq = offs_m // gb, offs_m % gb
        for first in range(lo, hi + 1, 32):
            n = first + tl.arange(0, 32)
            yk = yq[:, None] + ga - 1 - (n // (2 * gb - 1))[None, :]  # the key each query reads entry n through
            xk = xq[:, None] + gb - 1 - (n % (2 * gb - 1))[None, :]
            j = yk * gb + xk - n_start
            hit = (yk >= 0) & (yk < ga) & (xk >= 0) & (xk < gb) & (j >= 0) & (j < BN)
            picked = tl.where(hit, tl.gather(ds, tl.minimum(tl.maximum(j, 0), BN - 1), axis=1), 0.0)
            _add(parts + n, tl.sum(picked, 0), n <= hi)  # the chunks' entries are disjoint: no barrier between
        tl.debug_barrier()  # the next tile's loads of these entries may be other threads'
