"""Triton kernels of relpos's GPU path: one forward and a two-kernel backward
(FlashAttention-2's order), specialised by ``tl.constexpr`` switches for the
kinds of term a call has, never by scheme (the kernels that go row by row, RoPE's
rotation and the backward's row dots, are in row_kernels.py). Their terms:

- a bias per (head, distance) ``BIAS``: a row of values per head read by the
  distance (``BIAS_ROW``: T5's table gathered through its buckets), or one made
  in the kernel from per-head parameters (ALiBi's slope, KERPLE's r1 and r2);
- an extra dot product ``HAS_X``: float32 query features ``qx (B, H, Lq, dx)``
  read against float32 key features ``kx (Lk, dx)`` shared by heads, inside the
  scale (the form Transformer-XL's sinusoidal term takes, ``relpos.gpu.terms``),
  multiplied with ``X_PRECISION`` (TF32 on a GPU: sines and cosines rounded to
  bfloat16 would cost more accuracy than the content term loses);
- tables of rows per distance: a key embedding read by the query (``KEMB``: Shaw's
  key table, DeBERTa's c2p), a value embedding (``VEMB``: Shaw's) and a query
  embedding read by the key (``QEMB``: DeBERTa's p2c), rows ``clip(r, -k, k) + k``
  (Shaw's; zero beyond +-k with ``ZERO_BEYOND``) or a per-distance map of the call
  (``ROW_MAP``: DeBERTa's buckets), computed per tile: the query (key) tile times the
  rows of the tile's BM + BN - 1 distances, and P's sums per distance times the value
  rows, each a product of the tile laid out by distance (``tl.gather``), never an
  L x L x d tensor;
- a bias added to every query row of a head ``QUERY_BIAS`` (Transformer-XL's u), read
  as one more float32 product per key, ``u . k``;
- causal cut and key padding; grouped-query heads (query head ``h`` reads key
  head ``h // GROUP``).
- attention dropout ``DROPOUT`` (dropout.py: how the mask is drawn): the forward
  multiplies P by the tile's ``z = keep / (1 - p)`` after the softmax has taken its
  sums, the backward takes dV and the value table's gradient from ``P z`` and
  ``dS = P (z dP - D)``; the mask, drawn again per tile, is never stored.
- positions on a grid ``GRID`` (grid.py): SAM's tables per axis as each query row's scores by key
  grid row and column, Swin's bias per (head, offset pair) from the cells; segments ``HAS_SEG``
  (a mask per pair beside key padding).

Semantics are the library's (docs/design.md, section 1): query row ``i`` at
``q_offset + i``, key row ``j`` at ``k_offset + j``, distance
``r = (k_offset + j) - (q_offset + i)`` (``delta = k_offset - q_offset``);
``logits = scale * (q . k + qx . kx) + bias(r)``; a fully masked row gives zeros
and ``lse = -inf``.

Determinism: no atomics anywhere. The backward's key-tile programs own their dk,
dv rows; its query-tile programs own their dq rows and write the gradient of
every positional parameter as a partial sum per (batch, head, query program),
which the caller reduces in a fixed order.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .dropout import dropped, multipliers, seed_offset
from .grid import grid_bias, grid_grads, same_segment
from .tile_ranges import causal_key_end, query_tile, unmasked_key_end

# Kinds of bias per (head, distance); the int travels as a tl.constexpr.
BIAS_NONE, BIAS_ROW, BIAS_ALIBI, BIAS_KERPLE_LOG, BIAS_KERPLE_POWER = range(5)

LOG2E = 1.4426950408889634

# Integer arguments the kernels widen to int64 (.to needs a tensor): never specialised by
# Triton's launcher into a constant, as it would when one equals 1. H (the query heads) is
# not specialised either: it enters no address's alignment, and its divisibility by 16 would
# otherwise make a separate compile of every kernel for H = 16 after H = 4 (bench/gpu.py's
# correctness step and its timings: about 3 kernels x 16 specialisations of compile time).
_INT64_ARGS = ["delta", "r_min"]
# Dropout's positions and threshold (int32 bits, dropout.py) vary per call and enter no address.
_UNSPECIALISED = [*_INT64_ARGS, "H", "query_pos", "key_pos", "keep_from"]
LN2 = 0.6931471805599453


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    """a @ b accumulated in float32. PRECISION "upcast" multiplies float32 copies of half
    inputs (their products are exact in float32, as on tensor cores): Triton's interpreter
    has no bfloat16 matrix product, so the tests run the kernels that way."""
    if PRECISION == "upcast":
        result = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        result = tl.dot(a, b, input_precision=PRECISION)
    return result


@triton.jit
def _one_bucket(bucket, t0, r_min, R, BM: tl.constexpr, BN: tl.constexpr):
    """(whether every distance of the tile pair whose first distance is ``t0`` reads one bucket,
    the first one's index in the call): T5's bucket is monotone in the distance on each side of
    zero and the two sides share no bucket, so a tile whose first and last distances (inside the
    call; the others are masked) share a bucket reads that bucket alone. Away from the diagonal,
    past T5's max_distance, every tile does."""
    at = tl.minimum(tl.maximum(t0 - r_min, 0), R - 1)
    last = tl.minimum(tl.maximum(t0 + (BM + BN - 2) - r_min, 0), R - 1)
    return tl.load(bucket + at) == tl.load(bucket + last), at


@triton.jit
def _bias(rel, h, bias_row, bucket, t0, r_min, R, p1, p2, BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
          ONE_BUCKET: tl.constexpr):
    """The bias of head ``h`` at the distances ``rel`` (an int64 tile; ``t0`` its first), in
    natural units. A bucketed row (BIAS 1) is a value gathered per pair, or with ONE_BUCKET one
    value read once where the tile reads one bucket (_one_bucket)."""
    if BIAS == 1:
        one = False
        at = 0
        if ONE_BUCKET:
            one, at = _one_bucket(bucket, t0, r_min, R, BM, BN)
        if one:
            value = tl.zeros([BM, BN], tl.float32) + tl.load(bias_row + h * R + at).to(tl.float32)
        else:
            idx = tl.minimum(tl.maximum(rel - r_min, 0), R - 1)  # pairs outside the call are masked anyway
            value = tl.load(bias_row + h * R + idx).to(tl.float32)
    else:
        a = tl.abs(rel).to(tl.float32)
        r1 = tl.load(p1 + h).to(tl.float32)
        if BIAS == 2:
            value = -r1 * a
        elif BIAS == 3:
            r2 = tl.load(p2 + h).to(tl.float32)
            value = -r1 * tl.log(1.0 + r2 * a)
        else:
            r2 = tl.load(p2 + h).to(tl.float32)
            value = tl.where(a > 0, -r1 * tl.exp2(r2 * tl.log2(tl.maximum(a, 1.0))), 0.0)
    return value


@triton.jit
def _distance_rows(r, shaw_k, row_of, r_min, R, ZERO_BEYOND: tl.constexpr, ROW_MAP: tl.constexpr):
    """The table row each distance ``r`` reads: with ROW_MAP the call's per-distance map
    ``row_of[r - r_min]`` (DeBERTa's bucketed rows; a distance outside the call reads its
    nearest end, whose pairs are masked anyway), else Shaw's ``clip(r, -k, k) + k``, or -1
    (the zero row) beyond +-k with ZERO_BEYOND. Every map is monotone in ``r``."""
    if ROW_MAP:
        c = tl.load(row_of + tl.minimum(tl.maximum(r - r_min, 0), R - 1))
    else:
        c = tl.minimum(tl.maximum(r, -shaw_k), shaw_k) + shaw_k
        if ZERO_BEYOND:
            c = tl.where(tl.abs(r) <= shaw_k, c, -1)
    return c


@triton.jit
def _table_band(table, h, t0, shaw_k, row_of, r_min, R, stride_th, width, offs_c, W: tl.constexpr,
                ZERO_BEYOND: tl.constexpr, ROW_MAP: tl.constexpr):
    """A table's rows for the W distances from ``t0`` (zeros for the zero row)."""
    c = _distance_rows(t0 + tl.arange(0, W), shaw_k, row_of, r_min, R, ZERO_BEYOND, ROW_MAP)
    return tl.load(table + h * stride_th + c[:, None] * width + offs_c[None, :],
                   mask=(c[:, None] >= 0) & (offs_c[None, :] < width), other=0.0)


@triton.jit
def _one_row(t0, shaw_k, row_of, r_min, R, BM: tl.constexpr, BN: tl.constexpr, ZERO_BEYOND: tl.constexpr,
             ROW_MAP: tl.constexpr):
    """Whether every pair of a tile pair whose first distance is ``t0`` reads one table row
    (all its distances beyond the table's reach on one side: most tiles of a long sequence),
    and that row (with ZERO_BEYOND the row is the zero row). A map is monotone, so its rows
    at the window's two ends are equal exactly when every distance between reads one row."""
    last = t0 + BM + BN - 2
    if ROW_MAP:
        row = _distance_rows(t0, shaw_k, row_of, r_min, R, ZERO_BEYOND, ROW_MAP)
        one = row == _distance_rows(last, shaw_k, row_of, r_min, R, ZERO_BEYOND, ROW_MAP)
    else:
        if ZERO_BEYOND:
            one = (t0 > shaw_k) | (last < -shaw_k)
        else:
            one = (t0 >= shaw_k) | (last <= -shaw_k)
        row = tl.where(t0 > 0, 2 * shaw_k, 0)
    return one, row


@triton.jit
def _table_row(table, h, row, stride_th, width, offs_c):
    return tl.load(table + h * stride_th + row * width + offs_c, mask=offs_c < width, other=0.0).to(tl.float32)


@triton.jit
def _rows_read(x, table, h, t0, rel, shaw_k, row_of, r_min, R, stride_th, width, offs_c, PRECISION: tl.constexpr,
               ZERO_BEYOND: tl.constexpr, ROW_MAP: tl.constexpr, BY_KEY: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr):
    """``(BM, BN)``: each pair's ``x . table[c(r_ij)]`` with x the pair's query-side row
    (Shaw's and DeBERTa's c2p key term with x = q; dP's value term with x = dout), or with
    BY_KEY its key-side row (DeBERTa's p2c with x = k). A tile that reads one row takes one
    product per row of x; others multiply x by the rows of the tile's distances and lay
    the result out by pair."""
    one, row = _one_row(t0, shaw_k, row_of, r_min, R, BM, BN, ZERO_BEYOND, ROW_MAP)
    out = tl.zeros([BM, BN], tl.float32)
    if one:
        if not ZERO_BEYOND:
            dots = tl.sum(x.to(tl.float32) * _table_row(table, h, row, stride_th, width, offs_c)[None, :], 1)
            if BY_KEY:
                out += dots[None, :]
            else:
                out += dots[:, None]
    else:
        rows = _table_band(table, h, t0, shaw_k, row_of, r_min, R, stride_th, width, offs_c, BM + BN, ZERO_BEYOND,
                           ROW_MAP).to(x.dtype)
        at = (rel - t0).to(tl.int32)  # each pair's distance within the window
        if BY_KEY:
            out = tl.gather(_dot(rows, tl.trans(x), PRECISION), at, axis=0)
        else:
            out = tl.gather(_dot(x, tl.trans(rows), PRECISION), at, axis=1)
    return out


@triton.jit
def _rows_weighted(weights, like, table, h, t0, shaw_k, row_of, r_min, R, stride_th, width, offs_c, C: tl.constexpr,
                   PRECISION: tl.constexpr, ZERO_BEYOND: tl.constexpr, ROW_MAP: tl.constexpr, BY_KEY: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr):
    """``(BM, C)``: each query row's ``sum_j weights_ij table[c(r_ij)]`` (Shaw's value term with
    P; dq's c2p term with dS), or with BY_KEY ``(BN, C)``, each key's ``sum_i`` (dk's p2c term),
    the weights' per-distance sums multiplied in ``like``'s dtype."""
    one, row = _one_row(t0, shaw_k, row_of, r_min, R, BM, BN, ZERO_BEYOND, ROW_MAP)
    if BY_KEY:
        out = tl.zeros([BN, C], tl.float32)
        sums = tl.sum(weights, 0)
    else:
        out = tl.zeros([BM, C], tl.float32)
        sums = tl.sum(weights, 1)
    if one:
        if not ZERO_BEYOND:
            out += sums[:, None] * _table_row(table, h, row, stride_th, width, offs_c)[None, :]
    else:
        rows = _table_band(table, h, t0, shaw_k, row_of, r_min, R, stride_th, width, offs_c, BM + BN, ZERO_BEYOND,
                           ROW_MAP)
        by_distance = _by_distance(weights, 0, BM + BN, BM, BN, BY_KEY)
        out = _dot(by_distance.to(like.dtype), rows.to(like.dtype), PRECISION)
    return out


@triton.jit
def _rows_grad(slab, first_row, last_row, first_sum, last_sum, weights, x, t0, shaw_k, row_of, r_min, R, offs_c,
               C: tl.constexpr, PRECISION: tl.constexpr, ZERO_BEYOND: tl.constexpr, ROW_MAP: tl.constexpr,
               BY_KEY: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Adds to the program's own float32 partial sum of a table's gradient, ``slab`` (rows x C
    in global memory), each row c's ``sum over pairs reading c of weights_ij x`` with x the
    pair's query-side row (dwv with P and dout, dwk / dc2p with dS and q), or with BY_KEY its
    key-side row (dp2c with dS and k): a far tile's one row, or the band's per-distance sums
    merged by row and added to their rows, 32 distances at a time. A map is monotone, so the
    distances of a part reading one row are a run: each run's first distance sums its run
    (a 0/1 product, 32 x 32, _merge_runs) and only those are written, each to its own row.

    Returns the program's running sums of the call's first and last rows (_end_rows), a far
    tile's sum added to them when it reads one (it nearly always does), so that a far tile
    writes nothing and needs no barrier (on an H100 the same speed as adding each far tile's
    row to the slab, within the spread between runs). The slab lives in global memory, not
    in registers: DeBERTa's tables have 2 x 256 rows and Shaw's 2k + 1, (rows x C) float32
    per program that a register tile spilled; so did the whole window's 0/1 product."""
    one, row = _one_row(t0, shaw_k, row_of, r_min, R, BM, BN, ZERO_BEYOND, ROW_MAP)
    if one:
        if not ZERO_BEYOND:
            if BY_KEY:
                g = tl.sum(tl.sum(weights, 0)[:, None] * x.to(tl.float32), 0)
            else:
                g = tl.sum(tl.sum(weights, 1)[:, None] * x.to(tl.float32), 0)
            if row == first_row:
                first_sum += g
            elif row == last_row:
                last_sum += g
            else:
                tl.store(slab + row * C + offs_c, tl.load(slab + row * C + offs_c) + g)
                tl.debug_barrier()  # the next tile's reads of this row may be other threads'
    else:
        for first in range(0, BM + BN, 32):
            part = _by_distance(weights, first, 32, BM, BN, BY_KEY)
            band = _dot(tl.trans(part).to(x.dtype), x, PRECISION)  # (32, C): the sum per distance
            t = t0 + first + tl.arange(0, 32)
            c = _distance_rows(t, shaw_k, row_of, r_min, R, ZERO_BEYOND, ROW_MAP)
            starts = (c != _distance_rows(t - 1, shaw_k, row_of, r_min, R, ZERO_BEYOND, ROW_MAP)) | (t == t0 + first)
            starts = starts & (c >= 0)
            runs = _merge_runs(((c[:, None] == c[None, :]) & starts[:, None]).to(tl.float32), band, PRECISION)
            at = slab + c[:, None] * C + offs_c[None, :]
            tl.store(at, tl.load(at, mask=starts[:, None], other=0.0) + runs, mask=starts[:, None])
            tl.debug_barrier()  # the next part's or tile's reads of these rows may be other threads'
    return first_sum, last_sum


@triton.jit
def _merge_runs(runs, band, PRECISION: tl.constexpr):
    """``runs @ band`` for a 0/1 matrix ``runs`` (which distances each row sums) and float32
    per-distance sums ``band``: on a GPU in TF32 three times (``band`` split into a TF32 part and
    its remainder; the 0/1 factor is exact in TF32, so each sum is good to about 2^-22) on the
    tensor cores. Exact float32 products (``ieee``) run on the CUDA cores: with them, on an H200,
    DeBERTa's forward+backward (causal, L = 4096, B = 4, H = 16) took 25.8 ms at head 64 and 66.0
    at head 128, Shaw's 16.6 and 82.1, against 20.4, 43.2, 14.6 and 25.3 with TF32 three times
    (bench/gpu_tiles.py), every error against float64 unchanged (bench/gpu.py); at head 128 the
    dq kernel's spills fell from 14 to 1 KB per thread (compile_check). The interpreter's products
    are exact."""
    if PRECISION == "upcast":
        merged = tl.dot(runs, band, input_precision="ieee")
    else:
        merged = tl.dot(runs, band, input_precision="tf32x3")
    return merged


@triton.jit
def _end_rows(shaw_k, row_of, r_min, R, C: tl.constexpr, ZERO_BEYOND: tl.constexpr, ROW_MAP: tl.constexpr):
    """The rows read at the call's smallest and largest distance, with running sums (zeros)
    for _rows_grad: every far tile reads one of them (a map is monotone)."""
    first_row = _distance_rows(r_min, shaw_k, row_of, r_min, R, ZERO_BEYOND, ROW_MAP)
    last_row = _distance_rows(r_min + R - 1, shaw_k, row_of, r_min, R, ZERO_BEYOND, ROW_MAP)
    return first_row, last_row, tl.zeros([C], tl.float32), tl.zeros([C], tl.float32)


@triton.jit
def _add_end_rows(slab, first_row, last_row, first_sum, last_sum, offs_c):
    """Adds the running sums of _rows_grad's end rows to the slab, one row after the other
    (they may be one row); the zero row (-1, Shaw's beyond +-k with ZERO_BEYOND) gets none."""
    tl.debug_barrier()
    at = slab + first_row * offs_c.shape[0] + offs_c
    real = offs_c < tl.where(first_row >= 0, offs_c.shape[0], 0)
    tl.store(at, tl.load(at, mask=real, other=0.0) + first_sum, mask=real)
    tl.debug_barrier()
    at = slab + last_row * offs_c.shape[0] + offs_c
    real = offs_c < tl.where(last_row >= 0, offs_c.shape[0], 0)
    tl.store(at, tl.load(at, mask=real, other=0.0) + last_sum, mask=real)


@triton.jit
def _by_distance(x, first, W: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BY_KEY: tl.constexpr):
    """A tile ``(BM, BN)`` laid out by its W distances from the tile's ``first``-th, ``(BM, W)``:
    entry (i, t) holds the pair (i, first + t - (BM - 1) + i), the one at the tile's
    (first + t)-th distance, or 0 where that key is outside; with BY_KEY by key, ``(BN, W)``:
    entry (j, t) holds the pair (j + (BM - 1) - first - t, j)."""
    t = first + tl.arange(0, W)
    if BY_KEY:
        i = tl.arange(0, BN)[:, None] + (BM - 1) - t[None, :]
        out = tl.where((i >= 0) & (i < BM), tl.gather(tl.trans(x), tl.minimum(tl.maximum(i, 0), BM - 1), axis=1),
                       0.0)
    else:
        j = t[None, :] - (BM - 1) + tl.arange(0, BM)[:, None]
        out = tl.where((j >= 0) & (j < BN), tl.gather(x, tl.minimum(tl.maximum(j, 0), BN - 1), axis=1), 0.0)
    return out


@triton.jit
def _visible(offs_m, offs_n, rel, b, Lk, pad, stride_pb, stride_pn, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr):
    """Which pairs of the tile a query sees: keys inside the call, not in its future under a
    causal mask, not padded."""
    ok = (offs_n[None, :] < Lk) & (offs_m[:, None] >= 0)
    if CAUSAL:
        ok = ok & (rel <= 0)
    if HAS_PAD:
        padded = tl.load(pad + b * stride_pb + offs_n * stride_pn, mask=offs_n < Lk, other=1)
        ok = ok & (padded == 0)[None, :]
    return ok


@triton.jit
def _rows(base, offs_r, offs_d, stride_r, stride_d, L, d):
    """Rows ``offs_r`` of an (L, d) matrix at ``base`` (zeros outside it)."""
    mask = (offs_r[:, None] < L) & (offs_d[None, :] < d)
    return tl.load(base + offs_r[:, None] * stride_r + offs_d[None, :] * stride_d, mask=mask, other=0.0)


@triton.jit
def _query_bias(qb, h, offs_d, d):
    """Head h's row of the query bias ``(H, d)`` float32 (zeros past d)."""
    return tl.load(qb + h * d + offs_d, mask=offs_d < d, other=0.0)


@triton.jit
def _logits(q, qx, k, kx_ptrs, offs_m, offs_n, offs_d, offs_x, b, h, Lk, d, dx, delta, r_min, R, qk_scale,
            bias_row, bucket, p1, p2, pad, stride_pb, stride_pn, wk, wq, row_of, t0, shaw_k, stride_wkh, stride_wqh,
            far_hi, far_lo, xl_clamp, qb, H, Lq, gt, seg, grid_a, grid_b, BIAS: tl.constexpr, HAS_X: tl.constexpr,
            CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, PRECISION: tl.constexpr, X_PRECISION: tl.constexpr,
            KEMB: tl.constexpr, QEMB: tl.constexpr, ZERO_BEYOND: tl.constexpr, ROW_MAP: tl.constexpr,
            X_CLAMP: tl.constexpr, QUERY_BIAS: tl.constexpr, GRID: tl.constexpr, HAS_SEG: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, MASKED: tl.constexpr = True, ONE_BUCKET: tl.constexpr = False):
    """(logits in base-2 units with masked pairs at -inf, visible pairs, distances) of one tile;
    with MASKED False a tile whose every pair is visible (unmasked_key_end): no mask built; with
    ONE_BUCKET a T5 tile reading one bucket adds its value once (_bias).
    A key table read by the query (KEMB: Shaw's, DeBERTa's c2p): the query tile times the
    table rows of the tile's BM + BN - 1 distances (from ``t0``), each pair then reading its
    distance's column; a table read by the key (QEMB: DeBERTa's p2c) likewise from the key
    tile; ``k`` is the key tile as _rows loads it. A grid term (GRID: SAM's, Swin's) and segments
    (HAS_SEG) as grid.py reads them."""
    s = _dot(q, tl.trans(k), PRECISION)
    if QUERY_BIAS:  # (q + u) . k as q . k + u . k: one float32 dot per key, q + u never rounded
        s += tl.sum(k.to(tl.float32) * _query_bias(qb, h, offs_d, d)[None, :], 1)[None, :]
    if HAS_X:
        kx = tl.load(kx_ptrs, mask=(offs_n[:, None] < Lk) & (offs_x[None, :] < dx), other=0.0)
        xs = _dot(qx, tl.trans(kx), X_PRECISION)
        rel = offs_n[None, :].to(tl.int64) - offs_m[:, None] + delta
        if X_CLAMP:  # beyond the clamp a row reads its feature product at +-clamp_len (``far``)
            xs = tl.where(-rel > xl_clamp, far_hi[:, None], tl.where(rel > xl_clamp, far_lo[:, None], xs))
        s += xs
    rel = offs_n[None, :].to(tl.int64) - offs_m[:, None] + delta
    if KEMB:
        s += _rows_read(q, wk, h, t0, rel, shaw_k, row_of, r_min, R, stride_wkh, d, offs_d, PRECISION, ZERO_BEYOND,
                        ROW_MAP, False, BM, BN)
    if QEMB:
        s += _rows_read(k, wq, h, t0, rel, shaw_k, row_of, r_min, R, stride_wqh, d, offs_d, PRECISION, ZERO_BEYOND,
                        ROW_MAP, True, BM, BN)
    s = s * qk_scale
    if BIAS != 0:
        s += _bias(rel, h, bias_row, bucket, t0, r_min, R, p1, p2, BIAS, BM, BN, ONE_BUCKET) * 1.4426950408889634
    if GRID != 0:
        s += grid_bias(gt, b * H + h, h, offs_m, offs_n, Lq, Lk, grid_a, grid_b, GRID) * 1.4426950408889634
    if MASKED:
        ok = same_segment(_visible(offs_m, offs_n, rel, b, Lk, pad, stride_pb, stride_pn, CAUSAL, HAS_PAD), seg, b,
                          offs_m, offs_n, Lq, Lk, HAS_SEG)
        s = tl.where(ok, s, float("-inf"))
    else:
        ok = tl.full([BM, BN], 1, tl.int1)
    return s, ok, rel


@triton.jit
def batch_head():
    """The program's batch x head index, int64: launch axis 1, continued along axis 2 where there
    are more than a launch axis holds (launch.batch_head_axes: CUDA's grid axes 1 and 2 stop at
    65535, and Swin's windows x heads pass it)."""
    return tl.program_id(2).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)


@triton.jit
def _query_program(H, GROUP):
    """A query program's (batch x head, batch, head, key head), in int64: every address
    offset built from them is then int64 (b * stride_qb passes 2^31 when q has 2^31
    elements; the launcher refuses one batch entry of that size)."""
    bh = batch_head()
    h = bh % H
    return bh, bh // H, h, h // GROUP


@triton.jit
def _clamped_rows(QX, b, h, offs_m, Lq, dx, stride_xb, stride_xh, stride_xm, stride_xd, X_CLAMP: tl.constexpr,
                  BM: tl.constexpr):
    """With X_CLAMP, each query row's feature product at distance +clamp_len and -clamp_len,
    held in qx's two columns after its dx features (terms.py)."""
    hi = tl.zeros([BM], tl.float32)
    lo = hi
    if X_CLAMP:
        row = QX + b * stride_xb + h * stride_xh + offs_m * stride_xm
        hi = tl.load(row + dx * stride_xd, mask=offs_m < Lq, other=0.0)
        lo = tl.load(row + (dx + 1) * stride_xd, mask=offs_m < Lq, other=0.0)
    return hi, lo


@triton.jit
def _query_rows(Q, QX, b, h, offs_m, offs_d, offs_x, Lq, d, dx, stride_qb, stride_qh, stride_qm, stride_qd,
                stride_xb, stride_xh, stride_xm, stride_xd, HAS_X: tl.constexpr):
    """A query tile's rows of q and, with HAS_X, of its features qx (else q again, unread)."""
    row = offs_m[:, None] < Lq
    q = _rows(Q + b * stride_qb + h * stride_qh, offs_m, offs_d, stride_qm, stride_qd, Lq, d)
    qx = q
    if HAS_X:
        qx = tl.load(QX + b * stride_xb + h * stride_xh + offs_m[:, None] * stride_xm + offs_x[None, :] * stride_xd,
                     mask=row & (offs_x[None, :] < dx), other=0.0)
    return q, qx


@triton.jit(do_not_specialize=_UNSPECIALISED)
def attention_forward_kernel(
        Q, K, V, O, LSE, PAD, BIAS_ROWS, BUCKET, P1, P2, QX, KX, WK, WV, QB, WQ, ROW_OF, RNG, GT, SEG,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_xb, stride_xh, stride_xm, stride_xd,
        stride_kxn, stride_kxd, stride_pb, stride_pn,
        H, GROUP, Lq, Lk, d, dv, dx, delta, r_min, R, shaw_k, stride_wkh, stride_wvh, stride_wqh, xl_clamp,
        grid_a, grid_b, query_pos, key_pos, keep_from, keep_scale, qk_scale,
        D: tl.constexpr, DV: tl.constexpr, DX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
        BIAS: tl.constexpr, HAS_X: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
        PRECISION: tl.constexpr, X_PRECISION: tl.constexpr, KEMB: tl.constexpr, VEMB: tl.constexpr,
        QEMB: tl.constexpr, ZERO_BEYOND: tl.constexpr, ROW_MAP: tl.constexpr, X_CLAMP: tl.constexpr,
        QUERY_BIAS: tl.constexpr, DROPOUT: tl.constexpr, GRID: tl.constexpr, HAS_SEG: tl.constexpr):
    bh, b, h, hk = _query_program(H, GROUP)
    m_start = query_tile(tl.program_id(0), tl.num_programs(0), CAUSAL) * BM
    offs_m = m_start + tl.arange(0, BM)
    offs_n0 = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    offs_v = tl.arange(0, DV)
    offs_x = tl.arange(0, DX)
    q, qx = _query_rows(Q, QX, b, h, offs_m, offs_d, offs_x, Lq, d, dx, stride_qb, stride_qh, stride_qm,
                        stride_qd, stride_xb, stride_xh, stride_xm, stride_xd, HAS_X)
    far_hi, far_lo = _clamped_rows(QX, b, h, offs_m, Lq, dx, stride_xb, stride_xh, stride_xm, stride_xd, X_CLAMP, BM)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    row_max = tl.full([BM], float("-inf"), tl.float32)
    row_sum = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DV], tl.float32)
    seed, offset = seed_offset(RNG, DROPOUT)
    end = causal_key_end(m_start, Lk, delta, BM, CAUSAL)
    # Plain attention runs two loops, each compiled for its tiles: the key tiles that need no mask (most of a
    # long call), then the few that cross the diagonal or the call's end (all of them with padding or segments).
    # Its cost on sm_90 (compile_check, bfloat16): head 64 causal 130 -> 167 registers, no spills. With any term
    # the two copies cost spills (Shaw's K+V 920 -> 1716 bytes per thread, KERPLE 156 -> 253 registers), and in
    # the backward's kernels even for plain attention (dk, dv at head 64 causal 40 -> 204 bytes, dq at head 128
    # 0 -> 224): those keep one loop until a GPU times both.
    split: tl.constexpr = BIAS == 0 and not (HAS_X or KEMB or VEMB or QEMB) and GRID == 0
    unmasked_end = unmasked_key_end(m_start, Lk, delta, end, BN, CAUSAL, HAS_PAD, HAS_SEG) if split else 0
    for masked in tl.static_range(0 if split else 1, 2):
        for n_start in range(unmasked_end if masked else 0, end if masked else unmasked_end, BN):
            offs_n = n_start + offs_n0
            t0 = delta.to(tl.int64) + n_start - m_start - (BM - 1)  # the tile pair's first distance
            k = _rows(k_base, offs_n, offs_d, stride_kn, stride_kd, Lk, d)
            s, ok, rel = _logits(q, qx, k, KX + offs_n[:, None] * stride_kxn + offs_x[None, :] * stride_kxd,
                                 offs_m, offs_n, offs_d, offs_x, b, h, Lk, d, dx, delta, r_min, R, qk_scale,
                                 BIAS_ROWS, BUCKET, P1, P2, PAD, stride_pb, stride_pn, WK, WQ, ROW_OF, t0, shaw_k,
                                 stride_wkh, stride_wqh, far_hi, far_lo, xl_clamp, QB, H, Lq, GT, SEG, grid_a, grid_b,
                                 BIAS, HAS_X, CAUSAL, HAS_PAD, PRECISION, X_PRECISION, KEMB, QEMB, ZERO_BEYOND, ROW_MAP,
                                 X_CLAMP, QUERY_BIAS, GRID, HAS_SEG, BM, BN, masked == 1)
            new_max = tl.maximum(row_max, tl.max(s, 1))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # a row with nothing visible yet
            p = tl.exp2(s - shift[:, None])
            rescale = tl.exp2(row_max - shift)
            row_sum = row_sum * rescale + tl.sum(p, 1)
            # dropout after the softmax's sums: the normaliser and lse are the softmax's
            p = dropped(p, multipliers(seed, offset, bh, offs_m, n_start, query_pos, key_pos, keep_from, keep_scale,
                                       BM, BN, DROPOUT), DROPOUT)
            v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_v[None, :] * stride_vd,
                        mask=(offs_n[:, None] < Lk) & (offs_v[None, :] < dv), other=0.0)
            acc = acc * rescale[:, None] + _dot(p.to(v.dtype), v, PRECISION)
            if VEMB:  # Shaw's value term: P's sums per distance times the table's rows
                acc += _rows_weighted(p, v, WV, h, t0, shaw_k, ROW_OF, r_min, R, stride_wvh, dv, offs_v, DV,
                                      PRECISION, ZERO_BEYOND, ROW_MAP, False, BM, BN)
            row_max = new_max
    seen = row_sum > 0
    out = acc / tl.where(seen, row_sum, 1.0)[:, None]
    lse = tl.where(seen, (row_max + tl.log2(tl.where(seen, row_sum, 1.0))) * 0.6931471805599453, float("-inf"))
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_v[None, :] * stride_od,
             out.to(O.dtype.element_ty), mask=(offs_m[:, None] < Lq) & (offs_v[None, :] < dv))
    tl.store(LSE + bh * Lq + offs_m, lse, mask=offs_m < Lq)


@triton.jit
def _row_stats(lse_ptr, dlt_ptr, offs_m, Lq):
    """The query rows' logsumexp in base-2 units and their D = dout . out (row_kernels.row_dots_kernel)."""
    lse = tl.load(lse_ptr + offs_m, mask=offs_m < Lq, other=float("-inf")) * 1.4426950408889634
    return lse, tl.load(dlt_ptr + offs_m, mask=offs_m < Lq, other=0.0)


@triton.jit
def _probabilities(s, ok, lse):
    """P of the tile from its base-2 logits and the rows' base-2 logsumexp (_row_stats)."""
    return tl.where(ok & (lse[:, None] > float("-inf")), tl.exp2(s - lse[:, None]), 0.0)


@triton.jit(do_not_specialize=_UNSPECIALISED)
def attention_backward_kv_kernel(
        Q, K, V, DO, LSE, DLT, DK, DVV, PAD, BIAS_ROWS, BUCKET, P1, P2, QX, KX, WK, WV, QB, WQ, ROW_OF, RNG, GT, SEG,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_xb, stride_xh, stride_xm, stride_xd,
        stride_kxn, stride_kxd, stride_pb, stride_pn,
        H, GROUP, Lq, Lk, d, dv, dx, delta, r_min, R, shaw_k, stride_wkh, stride_wvh, stride_wqh, xl_clamp,
        grid_a, grid_b, query_pos, key_pos, keep_from, keep_scale, qk_scale,
        scale,
        D: tl.constexpr, DV: tl.constexpr, DX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
        BIAS: tl.constexpr, HAS_X: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
        PRECISION: tl.constexpr, X_PRECISION: tl.constexpr, KEMB: tl.constexpr, VEMB: tl.constexpr,
        QEMB: tl.constexpr, ZERO_BEYOND: tl.constexpr, ROW_MAP: tl.constexpr, X_CLAMP: tl.constexpr,
        QUERY_BIAS: tl.constexpr, DROPOUT: tl.constexpr, GRID: tl.constexpr, HAS_SEG: tl.constexpr):
    """dk, dv of one key tile of one key head, over the query tiles of every query head
    that reads it (DO and the outputs dk, dv share q's / k's / v's strides resp.)."""
    n_start = tl.program_id(0) * BN
    bhk = batch_head()  # int64 addresses, as _query_program's
    Hkv = H // GROUP
    b = bhk // Hkv
    hk = bhk % Hkv
    offs_n = n_start + tl.arange(0, BN)
    offs_m0 = tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    offs_v = tl.arange(0, DV)
    offs_x = tl.arange(0, DX)
    k = _rows(K + b * stride_kb + hk * stride_kh, offs_n, offs_d, stride_kn, stride_kd, Lk, d)
    kx_ptrs = KX + offs_n[:, None] * stride_kxn + offs_x[None, :] * stride_kxd
    v = tl.load(V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_v[None, :] * stride_vd,
                mask=(offs_n[:, None] < Lk) & (offs_v[None, :] < dv), other=0.0)
    dk = tl.zeros([BN, D], tl.float32)
    dvv = tl.zeros([BN, DV], tl.float32)
    seed, offset = seed_offset(RNG, DROPOUT)
    # under a causal mask, the first query that sees key n_start is at row n_start + delta
    first = 0
    if CAUSAL:
        first = (tl.minimum(tl.maximum(n_start + delta.to(tl.int64), 0), Lq).to(tl.int32) // BM) * BM
    for g in range(0, GROUP):
        h = hk * GROUP + g
        for m_start in range(first, Lq, BM):
            offs_m = m_start + offs_m0
            row = (offs_m[:, None] < Lq)
            q, qx = _query_rows(Q, QX, b, h, offs_m, offs_d, offs_x, Lq, d, dx, stride_qb, stride_qh, stride_qm,
                                stride_qd, stride_xb, stride_xh, stride_xm, stride_xd, HAS_X)
            far_hi, far_lo = _clamped_rows(QX, b, h, offs_m, Lq, dx, stride_xb, stride_xh, stride_xm, stride_xd,
                                           X_CLAMP, BM)
            t0 = delta.to(tl.int64) + n_start - m_start - (BM - 1)
            # T5's one-bucket tiles read one value here only: in this kernel the compile check (sm_90,
            # bfloat16, 64 x 64) counted fewer spills with it (head 64: 244 -> 0 bytes per thread, causal
            # 376 -> 292; head 128: 668 -> 456, 816 -> 720); in the forward it cost spills at head 128
            # (0 -> 336, causal 748), in the dq kernel at every causal shape (24 -> 476, 344 -> 1052).
            s, ok, rel = _logits(q, qx, k, kx_ptrs, offs_m, offs_n, offs_d, offs_x, b, h, Lk, d, dx, delta,
                                 r_min, R, qk_scale, BIAS_ROWS, BUCKET, P1, P2, PAD, stride_pb, stride_pn, WK, WQ,
                                 ROW_OF, t0, shaw_k, stride_wkh, stride_wqh, far_hi, far_lo, xl_clamp, QB, H, Lq, GT,
                                 SEG, grid_a, grid_b, BIAS, HAS_X, CAUSAL, HAS_PAD, PRECISION, X_PRECISION, KEMB,
                                 QEMB, ZERO_BEYOND, ROW_MAP, X_CLAMP, QUERY_BIAS, GRID, HAS_SEG, BM, BN,
                                 ONE_BUCKET=True)
            lse, dlt = _row_stats(LSE + (b * H + h) * Lq, DLT + (b * H + h) * Lq, offs_m, Lq)
            p = _probabilities(s, ok, lse)
            do = tl.load(DO + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om
                         + offs_v[None, :] * stride_od, mask=row & (offs_v[None, :] < dv), other=0.0)
            z = multipliers(seed, offset, b * H + h, offs_m, n_start, query_pos, key_pos, keep_from, keep_scale, BM,
                            BN, DROPOUT)
            dvv += _dot(tl.trans(dropped(p, z, DROPOUT)).to(do.dtype), do, PRECISION)
            dp = _dot(do, tl.trans(v), PRECISION)
            if VEMB:
                dp += _rows_read(do, WV, h, t0, rel, shaw_k, ROW_OF, r_min, R, stride_wvh, dv, offs_v, PRECISION,
                                 ZERO_BEYOND, ROW_MAP, False, BM, BN)
            ds = tl.where(p > 0, p * (dropped(dp, z, DROPOUT) - dlt[:, None]), 0.0)  # P (z dP - D)
            dk += _dot(tl.trans(ds).to(q.dtype), q, PRECISION)
            if QEMB:  # the key's p2c term: dS's per-distance sums by key times the rows
                dk += _rows_weighted(ds, q, WQ, h, t0, shaw_k, ROW_OF, r_min, R, stride_wqh, d, offs_d, D,
                                     PRECISION, ZERO_BEYOND, ROW_MAP, True, BM, BN)
            if QUERY_BIAS:  # the keys' share of u . k
                dk += tl.sum(ds, 0)[:, None] * _query_bias(QB, h, offs_d, d)[None, :]
    out_mask = (offs_n[:, None] < Lk)
    tl.store(DK + b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
             (dk * scale).to(DK.dtype.element_ty), mask=out_mask & (offs_d[None, :] < d))
    tl.store(DVV + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_v[None, :] * stride_vd,
             dvv.to(DVV.dtype.element_ty), mask=out_mask & (offs_v[None, :] < dv))


@triton.jit
def _bias_grads(ds, rel, ok, h, bucket, r_min, R, p1, p2, g1, g2, gt, NB: tl.constexpr, BIAS: tl.constexpr):
    """The tile's contribution to the bias parameters' gradients: ``g1``, ``g2`` per row
    (slope or r1, r2), ``gt`` per table entry (bucketed rows)."""
    if BIAS == 1:
        idx = tl.minimum(tl.maximum(rel - r_min, 0), R - 1)
        which = tl.load(bucket + idx)
        lo = tl.min(tl.where(ok, which, NB))
        hi = tl.max(tl.where(ok, which, -1))
        entries = tl.arange(0, NB)
        for e in range(lo, hi + 1):  # one bucket for most tiles, a few near the diagonal
            gt += tl.where(entries == e, tl.sum(tl.sum(tl.where(which == e, ds, 0.0), 1), 0), 0.0)
    elif BIAS >= 2:
        a = tl.abs(rel).to(tl.float32)
        if BIAS == 2:
            g1 += tl.sum(-ds * a, 1)
        elif BIAS == 3:
            r1 = tl.load(p1 + h).to(tl.float32)
            r2 = tl.load(p2 + h).to(tl.float32)
            g1 += tl.sum(-ds * tl.log(1.0 + r2 * a), 1)
            g2 += tl.sum(-ds * r1 * a / (1.0 + r2 * a), 1)
        else:
            r1 = tl.load(p1 + h).to(tl.float32)
            r2 = tl.load(p2 + h).to(tl.float32)
            log_a = tl.log(tl.maximum(a, 1.0))
            power = tl.where(a > 0, tl.exp(r2 * log_a), 0.0)
            g1 += tl.sum(-ds * power, 1)
            g2 += tl.sum(-ds * r1 * power * log_a, 1)
    return g1, g2, gt


@triton.jit(do_not_specialize=_UNSPECIALISED)
def attention_backward_q_kernel(
        Q, K, V, DO, LSE, DLT, DQ, DQX, PARTS, PAD, BIAS_ROWS, BUCKET, P1, P2, QX, KX, WK, WV, QB, WQ, ROW_OF, RNG,
        GT, SEG, DWK, DWV, DWQ, DG,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_xb, stride_xh, stride_xm, stride_xd,
        stride_kxn, stride_kxd, stride_pb, stride_pn,
        H, GROUP, Lq, Lk, d, dv, dx, delta, r_min, R, shaw_k, stride_wkh, stride_wvh, stride_wqh, xl_clamp,
        grid_a, grid_b, query_pos, key_pos, keep_from, keep_scale, qk_scale,
        scale, n_parts, table_rows,
        D: tl.constexpr, DV: tl.constexpr, DX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr,
        BIAS: tl.constexpr, HAS_X: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
        PRECISION: tl.constexpr, X_PRECISION: tl.constexpr, KEMB: tl.constexpr, VEMB: tl.constexpr,
        QEMB: tl.constexpr, ZERO_BEYOND: tl.constexpr, ROW_MAP: tl.constexpr, X_CLAMP: tl.constexpr,
        QUERY_BIAS: tl.constexpr, DROPOUT: tl.constexpr, GRID: tl.constexpr, HAS_SEG: tl.constexpr,
        GY: tl.constexpr, GX: tl.constexpr):
    """dq (and dqx) of the query tiles pid, pid + programs, ... (pid = program_id(0), programs =
    num_programs(0)) of one head, and the program's partial sums of the positional parameters'
    gradients, PARTS[(b * H + h) * programs + pid, :] and its slabs of DWK, DWV, DWQ (table_rows
    x D or DV float32 each, zeros when the kernel starts, left unscaled; DQ contiguous, DQX
    with QX's strides, DO with the output's); with GRID, SAM's sums of dS by key grid row and
    column into its rows of DG (zeros first) or Swin's per table entry into its PARTS row. A
    program owns several tiles where the partial tables would otherwise be one per tile."""
    bh, b, h, hk = _query_program(H, GROUP)
    offs_n0 = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    offs_v = tl.arange(0, DV)
    offs_x = tl.arange(0, DX)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    g1 = tl.zeros([BM], tl.float32)
    g2 = tl.zeros([BM], tl.float32)
    gt = tl.zeros([NB], tl.float32)
    part = bh * tl.num_programs(0) + tl.program_id(0)
    dwk, dwv, dwq = DWK + part * table_rows * D, DWV + part * table_rows * DV, DWQ + part * table_rows * D
    first_row, last_row, first_k, last_k = _end_rows(shaw_k, ROW_OF, r_min, R, D, ZERO_BEYOND, ROW_MAP)
    _, _, first_v, last_v = _end_rows(shaw_k, ROW_OF, r_min, R, DV, ZERO_BEYOND, ROW_MAP)
    first_q, last_q = first_k, last_k
    seed, offset = seed_offset(RNG, DROPOUT)
    for step in range(tl.program_id(0), tl.cdiv(Lq, BM), tl.num_programs(0)):
        m_start = query_tile(step, tl.cdiv(Lq, BM), CAUSAL) * BM
        offs_m = m_start + tl.arange(0, BM)
        row = offs_m[:, None] < Lq
        q, qx = _query_rows(Q, QX, b, h, offs_m, offs_d, offs_x, Lq, d, dx, stride_qb, stride_qh, stride_qm,
                            stride_qd, stride_xb, stride_xh, stride_xm, stride_xd, HAS_X)
        far_hi, far_lo = _clamped_rows(QX, b, h, offs_m, Lq, dx, stride_xb, stride_xh, stride_xm, stride_xd, X_CLAMP,
                                       BM)
        do = tl.load(DO + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_v[None, :] * stride_od,
                     mask=row & (offs_v[None, :] < dv), other=0.0)
        lse, dlt = _row_stats(LSE + bh * Lq, DLT + bh * Lq, offs_m, Lq)  # once per query tile, not per key tile
        dq = tl.zeros([BM, D], tl.float32)
        dqx = tl.zeros([BM, DX], tl.float32)
        dfar_hi = tl.zeros([BM], tl.float32)
        dfar_lo = tl.zeros([BM], tl.float32)
        for n_start in range(0, causal_key_end(m_start, Lk, delta, BM, CAUSAL), BN):
            offs_n = n_start + offs_n0
            kx_ptrs = KX + offs_n[:, None] * stride_kxn + offs_x[None, :] * stride_kxd
            k = _rows(k_base, offs_n, offs_d, stride_kn, stride_kd, Lk, d)
            t0 = delta.to(tl.int64) + n_start - m_start - (BM - 1)
            s, ok, rel = _logits(q, qx, k, kx_ptrs, offs_m, offs_n, offs_d, offs_x, b, h, Lk, d, dx, delta,
                                 r_min, R, qk_scale, BIAS_ROWS, BUCKET, P1, P2, PAD, stride_pb, stride_pn, WK, WQ,
                                 ROW_OF, t0, shaw_k, stride_wkh, stride_wqh, far_hi, far_lo, xl_clamp, QB, H, Lq, GT,
                                 SEG, grid_a, grid_b, BIAS, HAS_X, CAUSAL, HAS_PAD, PRECISION, X_PRECISION, KEMB,
                                 QEMB, ZERO_BEYOND, ROW_MAP, X_CLAMP, QUERY_BIAS, GRID, HAS_SEG, BM, BN)
            p = _probabilities(s, ok, lse)
            v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_v[None, :] * stride_vd,
                        mask=(offs_n[:, None] < Lk) & (offs_v[None, :] < dv), other=0.0)
            z = multipliers(seed, offset, bh, offs_m, n_start, query_pos, key_pos, keep_from, keep_scale, BM, BN,
                            DROPOUT)
            dp = _dot(do, tl.trans(v), PRECISION)
            if VEMB:  # dP gains dout . wv[c(r)]; the table's rows gain (P z)'s per-distance sums times dout
                dp += _rows_read(do, WV, h, t0, rel, shaw_k, ROW_OF, r_min, R, stride_wvh, dv, offs_v, PRECISION,
                                 ZERO_BEYOND, ROW_MAP, False, BM, BN)
                first_v, last_v = _rows_grad(dwv, first_row, last_row, first_v, last_v, dropped(p, z, DROPOUT), do,
                                             t0, shaw_k, ROW_OF, r_min, R, offs_v, DV, PRECISION, ZERO_BEYOND,
                                             ROW_MAP, False, BM, BN)
            ds = tl.where(p > 0, p * (dropped(dp, z, DROPOUT) - dlt[:, None]), 0.0)  # P (z dP - D)
            if GRID != 0:  # SAM's sums by key grid row and column (DG), Swin's per entry (the partial sums)
                grid_grads(ds, k, DG, PARTS + part * n_parts, bh, m_start, n_start, offs_m, offs_n, Lq, Lk, grid_a,
                           grid_b, PRECISION, GRID, GY, GX, BM, BN)
            if KEMB:  # dq gains dS's per-distance sums times the rows; the rows gain them times q
                dq += _rows_weighted(ds, q, WK, h, t0, shaw_k, ROW_OF, r_min, R, stride_wkh, d, offs_d, D,
                                     PRECISION, ZERO_BEYOND, ROW_MAP, False, BM, BN)
                first_k, last_k = _rows_grad(dwk, first_row, last_row, first_k, last_k, ds, q, t0, shaw_k, ROW_OF,
                                             r_min, R, offs_d, D, PRECISION, ZERO_BEYOND, ROW_MAP, False, BM, BN)
            if QEMB:  # the p2c table's rows gain dS's per-distance sums by key times k
                first_q, last_q = _rows_grad(dwq, first_row, last_row, first_q, last_q, ds, k, t0, shaw_k, ROW_OF,
                                             r_min, R, offs_d, D, PRECISION, ZERO_BEYOND, ROW_MAP, True, BM, BN)
            dq += _dot(ds.to(k.dtype), k, PRECISION)
            if HAS_X:
                kx = tl.load(kx_ptrs, mask=(offs_n[:, None] < Lk) & (offs_x[None, :] < dx), other=0.0)
                ds_x = ds
                if X_CLAMP:
                    beyond_hi, beyond_lo = -rel > xl_clamp, rel > xl_clamp
                    dfar_hi += tl.sum(tl.where(beyond_hi, ds, 0.0), 1)
                    dfar_lo += tl.sum(tl.where(beyond_lo, ds, 0.0), 1)
                    ds_x = tl.where(beyond_hi | beyond_lo, 0.0, ds)
                dqx += _dot(ds_x, kx, X_PRECISION)
            g1, g2, gt = _bias_grads(ds, rel, ok, h, BUCKET, r_min, R, P1, P2, g1, g2, gt, NB, BIAS)
        tl.store(DQ + (bh * Lq + offs_m[:, None]) * d + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
                 mask=row & (offs_d[None, :] < d))
        if HAS_X:
            dqx_rows = DQX + b * stride_xb + h * stride_xh + offs_m * stride_xm  # dqx is made like qx
            tl.store(dqx_rows[:, None] + offs_x[None, :] * stride_xd, dqx * scale, mask=row & (offs_x[None, :] < dx))
            if X_CLAMP:
                tl.store(dqx_rows + dx * stride_xd, dfar_hi * scale, mask=offs_m < Lq)
                tl.store(dqx_rows + (dx + 1) * stride_xd, dfar_lo * scale, mask=offs_m < Lq)
    if KEMB:
        _add_end_rows(dwk, first_row, last_row, first_k, last_k, offs_d)
    if VEMB:
        _add_end_rows(dwv, first_row, last_row, first_v, last_v, offs_v)
    if QEMB:
        _add_end_rows(dwq, first_row, last_row, first_q, last_q, offs_d)
    parts = PARTS + part * n_parts
    if BIAS == 1:
        tl.store(parts + tl.arange(0, NB), gt)
    elif BIAS >= 2:
        tl.store(parts, tl.sum(g1, 0))
        if BIAS >= 3:
            tl.store(parts + 1, tl.sum(g2, 0))
