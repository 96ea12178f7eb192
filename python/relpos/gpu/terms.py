"""Each scheme's parameters as the kinds of term the GPU kernels know (kernels.py).

The one place where a scheme meets the kernels: a scheme becomes a bias per
(head, distance) of one kind, an extra query/key dot product, a rotation of q
and k, tables of rows per distance, a bias on the query, or a term on a grid (SAM's, Swin's), built from
its parameters with differentiable torch operations where the kernels do not take the parameter itself. Imports
NumPy, torch and relpos.schemes only, never the compiled CPU extension, so the
GPU path loads where that extension was not built.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from relpos.schemes import (SAM, ALiBi, DeBERTa, KERPLE, KERPLEPower, NoPosition, RoPE, Shaw, Swin, T5,
                             TransformerXL, alibi_slopes)

from . import kernels
from .config import padded
from .grid import GRID_AXES, GRID_NONE, GRID_TABLE

# Largest distance any bias formula is asked for; T5's buckets and ALiBi's |r| are
# exact below it (relpos's kMaxPosition).
MAX_POSITION = 1 << 40

# Position tables (RoPE's and Transformer-XL's sines and cosines, T5's buckets per distance,
# ALiBi's default slopes) on the device they are used on, by everything they depend on. They
# are computed on the CPU in float64, as the oracle's, and copied to the device: once per key
# here, not on every call, where the blocking copy synchronised the stream mid-forward and
# the CPU trigonometry (about L x d / 2 values per rotation) ran in the timed call. A plain
# dict, emptied when it grows past _TABLES_MAX entries (offsets that move every call).
_TABLES: dict = {}
_TABLES_MAX = 64


def _cached(key, make):
    """The table for ``key``, made by ``make()`` the first time (never modified in place).
    While torch.export traces with fake tensors a table is made and not kept: a fake one
    kept would be what later eager calls read (torch.compile's Dynamo keeps real ones)."""
    if not torch.compiler.is_dynamo_compiling() and \
            torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
        return make()
    table = _TABLES.get(key)
    if table is None:
        if len(_TABLES) >= _TABLES_MAX:
            _TABLES.clear()
        table = _TABLES[key] = make()
    return table


@dataclass
class Terms:
    """What the kernels receive for one call: q and k as the dot product reads them,
    optional query / key features (``qx`` per head, ``kx`` shared), a bias kind
    with its per-head parameters ``p1``, ``p2`` (learnable, their gradients computed
    by the kernels) or a bucketed table (``table`` ``(H, buckets)`` read through
    ``bucket``, an int32 bucket per distance of the call), and tables of rows per
    distance: Shaw's key and value rows per clipped distance, DeBERTa's c2p (as ``wk``)
    and p2c (``wq``, read by the key) through ``row_of``, an int32 row per distance of
    the call; on a grid (grid.py) ``grid``, SAM's scores by key grid row and column ``(B, H, Lq,
    kh + kw)`` or Swin's table ``(H, entries)``, float32, with ``grid_a, grid_b`` = kh, kw or
    wh, ww."""

    q: torch.Tensor
    k: torch.Tensor
    bias: int = kernels.BIAS_NONE
    p1: Optional[torch.Tensor] = None
    p2: Optional[torch.Tensor] = None
    table: Optional[torch.Tensor] = None
    bucket: Optional[torch.Tensor] = None
    qx: Optional[torch.Tensor] = None
    kx: Optional[torch.Tensor] = None
    wk: Optional[torch.Tensor] = None  # read by the query: Shaw's (2k+1, d), DeBERTa's c2p (2 span, d); or (H, ...)
    wv: Optional[torch.Tensor] = None  # Shaw's value rows, (2k+1, dv) or (H, 2k+1, dv)
    wq: Optional[torch.Tensor] = None  # DeBERTa's p2c rows read by the key, (2 span, d) or (H, 2 span, d)
    row_of: Optional[torch.Tensor] = None  # (Lq + Lk - 1,) int32: the table row per distance (DeBERTa's)
    shaw_k: int = 0
    zero_beyond: bool = False
    xl_clamp: int = 0  # > 0: qx ends with the feature products at +-xl_clamp (Transformer-XL's clamp_len)
    rot_q: Optional[torch.Tensor] = None  # RoPE: (Lq, 2, D) cos and signed sin per query row and column
    rot_k: Optional[torch.Tensor] = None  # (Lk, 2, D) the same per key row
    partner: Optional[torch.Tensor] = None  # (D,) int32: the column each column is rotated with
    qb: Optional[torch.Tensor] = None  # (H, d): a bias added to every query row of a head (Transformer-XL's u)
    grid: Optional[torch.Tensor] = None  # on a grid: SAM's per-row scores or Swin's table (grid.py)
    grid_kind: int = GRID_NONE
    grid_a: int = 0  # SAM's key grid height, Swin's window height
    grid_b: int = 0  # its width


def t5_buckets(distances: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Hugging Face's ``_relative_position_bucket`` of each distance (key minus query), with
    the float32 logarithm rounded once from double, as relpos.t5_bucket computes it."""
    r = distances.clamp(-MAX_POSITION, MAX_POSITION)
    bucket = torch.zeros_like(r)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (r > 0).long() * num_buckets
        n = r.abs()
    else:
        n = (-r).clamp(min=0)
    max_exact = num_buckets // 2
    log_ratio = torch.tensor(math.log(max_distance / max_exact), dtype=torch.float32)
    # float32 n / max_exact as upstream divides, then its logarithm rounded once to float32
    ratio = (n.float() / float(max_exact)).clamp(min=1.0)
    span = torch.tensor(float(num_buckets - max_exact), dtype=torch.float32)
    scaled = torch.log(ratio.double()).float() / log_ratio * span
    large = (max_exact + scaled.long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(n < max_exact, n, large)


def deberta_rows(distances: torch.Tensor, position_buckets: int, max_relative_positions: int) -> torch.Tensor:
    """DeBERTa's table row of each distance r (key minus query): ``clamp(bucket(-r) + span, 0,
    2 span - 1)`` with transformers' ``make_log_bucket_position`` of the relative position
    ``-r`` (query minus key), evaluated in float32 as upstream does with each logarithm
    rounded once from double, as relpos.deberta_bucket computes it (the roundings decide
    the bucket edges). Non-increasing in r, as the kernels' one-row test needs."""
    x = (-distances).clamp(-MAX_POSITION, MAX_POSITION)
    span = position_buckets if position_buckets > 0 else max_relative_positions
    bucket = x
    if position_buckets > 0:
        mid = position_buckets // 2
        ratio = x.abs().clamp(min=mid).float() / mid  # clamped: no log(0) in the rows that stay x
        step = torch.log(torch.tensor((max_relative_positions - 1) / mid, dtype=torch.float32).double()).float()
        far = torch.ceil(torch.log(ratio.double()).float() / step * (mid - 1)) + mid
        bucket = torch.where(x.abs() > mid, torch.sign(x) * far.long(), x)
    return (bucket + span).clamp(0, 2 * span - 1)


def _positions(length: int, offset: int, device) -> torch.Tensor:
    return torch.arange(length, dtype=torch.float64, device=device) + float(offset)


def _rotation(length: int, offset: int, rope: RoPE, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE as kernels.rotate_kernel applies it to rows at positions ``offset + i``:
    a ``(length, 2, D)`` float32 table, cos then sin with the rotation's sign, per row and
    column (1 and 0 past the rotated dimensions and d; D = config.padded(d)), and the
    ``(D,)`` int32 column each column is rotated with. Angles in float64, as the oracle's;
    made once per key on the device."""
    dims = d if rope.dims is None else int(rope.dims)
    if dims % 2 or not 2 <= dims <= d:
        raise ValueError(f"relpos: rope.dims: must be even, >= 2 and <= d={d}, got {dims}")
    half, width = dims // 2, padded(d)

    def make():
        inv_freq = 1.0 / torch.tensor(float(rope.base), dtype=torch.float64) ** (
            torch.arange(half, dtype=torch.float64) * 2 / dims)
        angle = _positions(length, offset, "cpu")[:, None] * inv_freq[None, :]
        cos, sin = torch.cos(angle).float(), torch.sin(angle).float()
        table = torch.zeros(length, 2, width, dtype=torch.float32)
        table[:, 0] = 1.0
        partner = torch.arange(width, dtype=torch.int32)
        if rope.style == "half_split":  # columns j and j + half: (a, b) -> (a cos - b sin, b cos + a sin)
            first, second = torch.arange(half), torch.arange(half, dims)
        else:  # columns 2i and 2i + 1
            first, second = torch.arange(0, dims, 2), torch.arange(1, dims, 2)
        table[:, 0, first], table[:, 1, first] = cos, -sin
        table[:, 0, second], table[:, 1, second] = cos, sin
        partner[first], partner[second] = second.to(torch.int32), first.to(torch.int32)
        return table.to(device), partner.to(device)

    return _cached(("rope", length, int(offset), float(rope.base), dims, rope.style, d, device), make)


def _xl_features(q: torch.Tensor, xl: TransformerXL, q_offset: int, Lk: int, k_offset: int):
    """Transformer-XL's positional score ``(q_i + v) . W_R R(p)``, ``p = q_pos - k_pos``, as a
    dot product of query and key features: with ``c = (q + v) W_R = [A, B]`` (the sine and
    cosine halves), ``A sin(wp) + B cos(wp)`` splits by the angle-difference formulas into
    ``[A sin(w q_pos) + B cos(w q_pos), B sin(w q_pos) - A cos(w q_pos)]`` read against
    ``[cos(w k_pos), sin(w k_pos)]``, so no (distance x d) table is made. With
    ``clamp_len > 0``, qx carries two more columns, the score at ``p = +clamp_len`` and
    ``-clamp_len``, which the kernels read for pairs beyond the clamp."""
    pos_dim = xl.w_r.shape[-1]
    half = pos_dim // 2
    inv_freq = 1.0 / 10000.0 ** (torch.arange(half, dtype=torch.float64) * 2 / pos_dim)

    def sin_cos(what, angles):  # angles: a function, called once per key
        def make():
            a = angles()
            return tuple(f(a).to(device=q.device, dtype=torch.float32) for f in (torch.sin, torch.cos))

        return _cached(("xl", *what, pos_dim, q.device), make)

    sq, cq = sin_cos((q.shape[2], int(q_offset)), lambda: _positions(q.shape[2], q_offset, "cpu")[:, None] * inv_freq)
    sk, ck = sin_cos((Lk, int(k_offset)), lambda: _positions(Lk, k_offset, "cpu")[:, None] * inv_freq)
    c = torch.einsum("bhid,hde->bhie", q.float() + xl.v.float()[None, :, None, :], xl.w_r.float())
    A, B = c[..., :half], c[..., half:]
    parts = [A * sq + B * cq, B * sq - A * cq]
    if xl.clamp_len:
        s_c, c_c = sin_cos(("clamp", int(xl.clamp_len)), lambda: float(xl.clamp_len) * inv_freq)
        parts += [((A * s_c + B * c_c).sum(-1, keepdim=True)), ((B * c_c - A * s_c).sum(-1, keepdim=True))]
    return torch.cat(parts, -1), _cached(("xl kx", Lk, int(k_offset), pos_dim, q.device),
                                         lambda: torch.cat((ck, sk), -1))


def grid_offsets(q_size: int, k_size: int) -> torch.Tensor:
    """The ``(q_size, k_size)`` int64 offset index of each query and key coordinate on one axis, as
    SAM's ``get_rel_pos`` takes it (the shorter axis's coordinates scaled), in float32 as the CPU
    core's ``grid_offset_index`` evaluates it: ``yq - yk + k_size - 1`` where the sizes agree."""
    q_scale = torch.tensor(max(k_size / q_size, 1.0), dtype=torch.float32)
    k_scale = torch.tensor(max(q_size / k_size, 1.0), dtype=torch.float32)
    shift = torch.tensor((k_size - 1) * max(q_size / k_size, 1.0), dtype=torch.float32)
    coords = (torch.arange(q_size, dtype=torch.float32)[:, None] * q_scale
              - torch.arange(k_size, dtype=torch.float32)[None, :] * k_scale)
    return (coords + shift).long()


def _grid_shape(scheme) -> tuple[int, int, int, int]:
    """(qh, qw, kh, kw) of a SAM or Swin record."""
    if isinstance(scheme, Swin):
        return (int(scheme.window_height), int(scheme.window_width)) * 2
    qh, qw = int(scheme.q_height), int(scheme.q_width)
    return qh, qw, int(scheme.k_height or qh), int(scheme.k_width or qw)


def _check_grid(scheme, Lq: int, Lk: int) -> None:
    """Lq and Lk are the cells of the grids, one row per cell (the CPU core's check_grid)."""
    qh, qw, kh, kw = _grid_shape(scheme)
    names = (("swin.window_height x swin.window_width",) * 2 if isinstance(scheme, Swin)
             else ("sam.q_height x sam.q_width", "sam.k_height x sam.k_width"))
    for name, (h, w), what, L in zip(names, ((qh, qw), (kh, kw)), ("q has Lq", "k has Lk"), (Lq, Lk)):
        if h * w != L:
            raise ValueError(f"relpos: {name}: {h} x {w} = {h * w} cells, but {what}={L} rows (one per cell, "
                             "row by row)")


def _sam_scores(q: torch.Tensor, sam: SAM) -> torch.Tensor:
    """SAM's terms as the kernels read them: each query row's score against rel_h at each key grid
    row and against rel_w at each key grid column, ``(B, H, Lq, kh + kw)`` float32, made by
    differentiable products (q times each table, then each row's offsets gathered: a row reads an
    offset through at most one grid row or column, so the gathers' gradients sum nothing)."""
    qh, qw, kh, kw = _grid_shape(sam)
    B, H, Lq, d = q.shape
    index_y = _cached(("sam", qh, kh, q.device), lambda: grid_offsets(qh, kh).to(q.device))
    index_x = _cached(("sam", qw, kw, q.device), lambda: grid_offsets(qw, kw).to(q.device))
    cells = q.float().reshape(B, H, qh, qw, d)
    by_y = torch.gather(cells @ sam.rel_h.float().t(), -1, index_y[:, None, :].expand(B, H, qh, qw, kh))
    by_x = torch.gather(cells @ sam.rel_w.float().t(), -1, index_x[None, :, :].expand(B, H, qh, qw, kw))
    return torch.cat((by_y, by_x), -1).reshape(B, H, Lq, kh + kw).contiguous()


def _expected_shapes(scheme, H: int, d: int, dv: int) -> dict:
    """Each learnable tensor's shapes the kernels index (a table shared by the heads may be
    ``(1, rows, width)`` too, as the CPU core takes it; attention.py reads it as ``(rows, width)``)."""
    if isinstance(scheme, Shaw):
        rows = 2 * int(scheme.k) + 1
        return {"wk": ((rows, d), (1, rows, d), (H, rows, d)), "wv": ((rows, dv), (1, rows, dv), (H, rows, dv))}
    if isinstance(scheme, DeBERTa):
        span = scheme.position_buckets if scheme.position_buckets > 0 else scheme.max_relative_positions
        return dict.fromkeys(("c2p", "p2c"), ((2 * span, d), (1, 2 * span, d), (H, 2 * span, d)))
    if isinstance(scheme, T5):
        return {"table": ((H, scheme.table.shape[-1]),)}
    if isinstance(scheme, TransformerXL):
        pos_dim = scheme.w_r.shape[-1]
        return {"u": ((H, d),), "v": ((H, d),), "w_r": ((H, d, pos_dim),)}
    if isinstance(scheme, SAM):
        qh, qw, kh, kw = _grid_shape(scheme)
        return {"rel_h": ((2 * max(qh, kh) - 1, d),), "rel_w": ((2 * max(qw, kw) - 1, d),)}
    if isinstance(scheme, Swin):
        return {"table": ((H, (2 * int(scheme.window_height) - 1) * (2 * int(scheme.window_width) - 1)),)}
    return {f: ((H,),) for f in scheme._tensors}  # ALiBi's slopes, KERPLE's r1 and r2


# Elements of one table of rows per distance (rows x width per head) the kernels address with
# int32 offsets.
_MAX_TABLE = (1 << 31) - 1


def _check_tensors(scheme, q: torch.Tensor, dv: int) -> None:
    """Each tensor of the scheme a torch tensor on q's device with a shape the kernels index."""
    for field in scheme._tensors:
        x = getattr(scheme, field)
        if x is not None and (not isinstance(x, torch.Tensor) or x.device != q.device):
            raise ValueError(f"relpos: {scheme.name}.{field}: expected a torch tensor on q's device {q.device}, got "
                             f"{x.device if isinstance(x, torch.Tensor) else type(x).__name__}")
    if isinstance(scheme, DeBERTa):
        scheme.check_joint_options(int(scheme.position_buckets), int(scheme.max_relative_positions))
        if scheme.c2p is None and scheme.p2c is None:
            raise ValueError("relpos: deberta: give c2p, p2c or both")
    for field, shapes in _expected_shapes(scheme, q.shape[1], q.shape[3], dv).items():
        x = getattr(scheme, field)
        if x is not None and tuple(x.shape) not in shapes:
            raise ValueError(f"relpos: {scheme.name}.{field}: expected shape {' or '.join(map(str, shapes))}, "
                             f"got {tuple(x.shape)}")
        if x is not None and x.dim() >= 2 and x.shape[-2] * x.shape[-1] > _MAX_TABLE:
            raise ValueError(f"relpos: {scheme.name}.{field}: {x.shape[-2]} x {x.shape[-1]} elements per head; the "
                             "GPU kernels address at most 2^31 - 1")


def terms_of(scheme, q, k, q_offset: int, k_offset: int, dv: int) -> Terms:
    """The kernels' terms for a scheme record whose arrays are torch tensors on q's device
    (checked) with v's head size ``dv``."""
    H, Lq, Lk = q.shape[1], q.shape[2], k.shape[2]
    if isinstance(scheme, (SAM, Swin)):
        _check_grid(scheme, Lq, Lk)
    _check_tensors(scheme, q, dv)
    if isinstance(scheme, NoPosition):
        return Terms(q, k)
    if isinstance(scheme, RoPE):
        rot_q, partner = _rotation(Lq, q_offset, scheme, q.shape[3], q.device)
        rot_k, _ = _rotation(Lk, k_offset, scheme, q.shape[3], q.device)
        return Terms(q, k, rot_q=rot_q, rot_k=rot_k, partner=partner)
    if isinstance(scheme, ALiBi):
        slopes = scheme.slopes
        if slopes is None:
            slopes = _cached(("alibi", H, q.device),
                             lambda: torch.tensor(alibi_slopes(H), dtype=torch.float32, device=q.device))
        return Terms(q, k, kernels.BIAS_ALIBI, p1=slopes)
    if isinstance(scheme, KERPLE):
        return Terms(q, k, kernels.BIAS_KERPLE_LOG, p1=scheme.r1, p2=scheme.r2)
    if isinstance(scheme, KERPLEPower):
        return Terms(q, k, kernels.BIAS_KERPLE_POWER, p1=scheme.r1, p2=scheme.r2)
    if isinstance(scheme, T5):
        delta = k_offset - q_offset
        options = (bool(scheme.bidirectional), scheme.table.shape[-1], int(scheme.max_distance))

        def make():
            distances = torch.arange(delta - (Lq - 1), delta + Lk, dtype=torch.int64)
            return t5_buckets(distances, *options).to(torch.int32).to(q.device)

        bucket = _cached(("t5", delta, Lq, Lk, *options, q.device), make)
        return Terms(q, k, kernels.BIAS_ROW, table=scheme.table, bucket=bucket)
    if isinstance(scheme, Shaw):
        return Terms(q, k, wk=scheme.wk, wv=scheme.wv, shaw_k=int(scheme.k), zero_beyond=scheme.beyond == "zero")
    if isinstance(scheme, DeBERTa):
        delta = k_offset - q_offset
        options = (int(scheme.position_buckets), int(scheme.max_relative_positions))

        def make():
            distances = torch.arange(delta - (Lq - 1), delta + Lk, dtype=torch.int64)
            return deberta_rows(distances, *options).to(torch.int32).to(q.device)

        row_of = _cached(("deberta", delta, Lq, Lk, *options, q.device), make)
        return Terms(q, k, wk=scheme.c2p, wq=scheme.p2c, row_of=row_of)
    if isinstance(scheme, TransformerXL):
        qx, kx = _xl_features(q, scheme, q_offset, Lk, k_offset)
        return Terms(q, k, qx=qx, kx=kx, xl_clamp=int(scheme.clamp_len), qb=scheme.u)
    if isinstance(scheme, (SAM, Swin)):  # cells from the rows, whatever the offsets (the CPU core's)
        _, _, kh, kw = _grid_shape(scheme)
        if isinstance(scheme, SAM):
            if Lq * (kh + kw) > _MAX_TABLE:
                raise ValueError(f"relpos: sam: {Lq} query rows x {kh + kw} key grid rows and columns per head; "
                                 "the GPU kernels address at most 2^31 - 1")
            return Terms(q, k, grid=_sam_scores(q, scheme), grid_kind=GRID_AXES, grid_a=kh, grid_b=kw)
        return Terms(q, k, grid=scheme.table.float().contiguous(), grid_kind=GRID_TABLE, grid_a=kh, grid_b=kw)
    raise ValueError(f"relpos: scheme: {getattr(scheme, 'name', type(scheme).__name__)} has no GPU kernel yet; "
                     "its CPU tensors run on the C++ kernels")
