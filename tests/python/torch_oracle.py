"""An independent PyTorch implementation of relpos attention (docs/design.md section 1).

Written from the published formulas, not from the C++ code: every relative
term is materialised as a tensor with vectorised torch ops, the whole (Lq, Lk)
logit matrix is built at once, and gradients come from torch autograd. It is
meant to run in float64 and serve as the oracle of the Python tests.

    r(i, j)      = (k_offset + j) - (q_offset + i)
    logits(i, j) = scale * (q_i . k_j + score terms) + bias terms   (masked: -inf)
    out_i        = sum_j softmax_j(logits)(i, j) * z(i, j) * (v_j + value terms)
    lse_i        = log sum_j exp(logits(i, j))                      (-inf if all masked)

z is attention dropout's multiplier, keep / (1 - p), from an explicit mask
(``dropout_mask``: relpos.dropout_mask's, or ``philox_keep`` below), 1 without.
A row whose keys are all masked outputs 0 and passes back zero gradient.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

# ---------------------------------------------------------------------------
# Position math, as the upstream projects write it.
# ---------------------------------------------------------------------------


def hf_relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """HF transformers' T5Attention._relative_position_bucket, verbatim.

    relative_position = memory_position - query_position (an int64 tensor).
    """
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    # now relative_position is in the range [0, inf)

    # half of the buckets are for exact increments in positions
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact

    # The other half of the buckets are for logarithmically bigger bins in positions up to max_distance
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1)
    )

    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


def deberta_log_bucket(x: torch.Tensor, position_buckets: int, max_relative_positions: int) -> torch.Tensor:
    """DeBERTa-v2's log bucket of relative positions x (int64), from its definition (He et
    al. 2021; transformers' make_log_bucket_position): |x| <= mid = buckets // 2 stays x;
    beyond, sign(x) (mid + ceil(log(|x| / mid) / log((max - 1) / mid) (mid - 1))), evaluated
    in float32 as upstream does (its roundings decide the bucket edges). buckets <= 0: x."""
    if position_buckets <= 0:
        return x
    mid = position_buckets // 2
    far = x.abs() > mid
    ratio = x.abs().clamp(min=mid).to(torch.float32) / mid  # clamp: no log(0) in the unused rows
    steps = torch.log(ratio) / torch.log(torch.tensor((max_relative_positions - 1) / mid, dtype=torch.float32))
    logarithmic = (torch.ceil(steps * (mid - 1)) + mid).to(torch.long)
    return torch.where(far, torch.sign(x) * logarithmic, x)


def alibi_paper_slopes(n):
    """get_slopes of the ALiBi paper's repository (ofirpress/attention_with_linear_biases)."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    # In the paper, only models with 2^a heads were trained; other counts take the
    # slopes of the closest lower power of two and every other slope of twice it.
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + alibi_paper_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def sam_rel_index(q_size: int, k_size: int) -> torch.Tensor:
    """The (q_size, k_size) offset indices of one axis as transformers' SamVisionAttention.get_rel_pos
    computes them: the shorter axis's coordinates scaled, in float32, truncated by .long()."""
    q_coords = torch.arange(q_size)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size)[None, :] * max(q_size / k_size, 1.0)
    return ((q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)).long()


def swin_relative_position_index(height: int, width: int) -> torch.Tensor:
    """Swin's relative_position_index (Liu et al. 2021; transformers' SwinSelfAttention) of a
    height x width window: (N, N), N = height width."""
    coords = torch.stack(torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")).flatten(1)
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    relative[:, :, 0] += height - 1
    relative[:, :, 1] += width - 1
    relative[:, :, 0] *= 2 * width - 1
    return relative.sum(-1)


def relative_distance(lq: int, lk: int, q_offset: int, k_offset: int) -> torch.Tensor:
    """(Lq, Lk) int64 matrix r = key position - query position."""
    q_pos = q_offset + torch.arange(lq, dtype=torch.long)
    k_pos = k_offset + torch.arange(lk, dtype=torch.long)
    return k_pos[None, :] - q_pos[:, None]


def rope(x: torch.Tensor, positions: torch.Tensor, base: float, dims: Optional[int], style: str) -> torch.Tensor:
    """Rotary embedding of x (..., L, d) at the given absolute positions (L,).

    half_split: GPT-NeoX / Llama ``x * cos + rotate_half(x) * sin``;
    interleaved: GPT-J ``x * cos + rotate_every_two(x) * sin``.
    Only the first ``dims`` features rotate; the rest pass through.
    """
    rd = dims or x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # (L, rd/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    if style == "half_split":
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
        x1, x2 = x_rot[..., : rd // 2], x_rot[..., rd // 2 :]
        rotated = torch.cat([-x2, x1], -1)
    elif style == "interleaved":
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        rotated = torch.stack([-x2, x1], -1).flatten(-2)
    else:
        raise ValueError(style)
    return torch.cat([x_rot * cos + rotated * sin, x_pass], -1)


def xl_sinusoid(p: torch.Tensor, pos_dim: int) -> torch.Tensor:
    """Transformer-XL's PositionalEmbedding: [sin(p f), cos(p f)], f_i = 10000^(-2i/pos_dim)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, pos_dim, 2.0, dtype=torch.float64) / pos_dim))
    angles = p.to(torch.float64)[..., None] * inv_freq
    return torch.cat([angles.sin(), angles.cos()], -1)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


def _shaw_relative_table(table: torch.Tensor, r: torch.Tensor, k: int, beyond: str, heads: int) -> torch.Tensor:
    """A[h, i, j] = table[h, c(r(i, j))] (zero beyond +-k if beyond == 'zero'): (H, Lq, Lk, width)."""
    table = table[None] if table.dim() == 2 else table
    index = r.clamp(-k, k) + k
    a = table[:, index]  # (Ht, Lq, Lk, width)
    if beyond == "zero":
        a = a * (r.abs() <= k).to(a.dtype)[..., None]
    return a.expand(heads, *a.shape[1:])


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scheme: str = "none",
    opts: Optional[dict] = None,
    params: Optional[dict] = None,
    *,
    causal: bool = False,
    key_padding: Optional[torch.Tensor] = None,
    q_offset: int = 0,
    k_offset: int = 0,
    scale: Optional[float] = None,
    dropout_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    segments: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (out (B, H, Lq, dv), lse (B, H, Lq)).

    scheme / opts / params:
      none
      shaw   opts k, beyond ('clip'|'zero'); params shaw_wk and/or shaw_wv, (2k+1, w) or (H, 2k+1, w)
      t5     opts bidirectional, max_distance; params t5_table (H, num_buckets)
      alibi  params alibi_slopes (H,) optional (default: the paper's slopes)
      rope   opts base, dims (None = d), style ('half_split'|'interleaved')
      xl     opts clamp_len; params xl_u (H, d), xl_v (H, d), xl_w_r (H, d, pos_dim)
      kerple params kerple_r1, kerple_r2 (H,): bias -r1 log(1 + r2 |r|) (Chi et al. 2022, eq. for KERPLE-log)
      kerple_power params kerple_power_r1, kerple_power_r2 (H,): bias -r1 |r|^r2 (KERPLE-power)
      sam    opts q_height, q_width, k_height, k_width (None: the query grid's); params sam_rel_h,
             sam_rel_w: the logit gains q_i . rel_h[y] + q_i . rel_w[x], unscaled, y and x as
             SAM's get_rel_pos indexes them (its decomposed rel-pos, the query unscaled)
      swin   opts window_height, window_width; params swin_table (H, (2 wh - 1)(2 ww - 1)): bias
             table[h, relative_position_index(i, j)]
      deberta opts position_buckets (default 256), max_relative_positions (512); params deberta_c2p
             and/or deberta_p2c, (2 span, d) or (H, 2 span, d): score q_i . c2p[row(i - j)]
             + k_j . p2c[row(i - j)] (transformers' p2c gathers the key's row at -bucket(j - i)),
             row(x) = clamp(bucket(x) + span, 0, 2 span - 1) (positions, offsets included), span =
             buckets or, without buckets, max_relative_positions; the default scale
             1 / sqrt(d (1 + number of tables)) (DeBERTa's disentangled attention)
    key_padding: bool (B, Lk), True = padded.
    dropout_mask: bool (B, H, Lq, Lk), True = kept; the probabilities after the softmax are
    multiplied by it and divided by 1 - dropout_p (lse stays the softmax's).
    segments: (q_ids (B, Lq), k_ids (B, Lk)): a query sees the keys of its own segment.
    """
    opts, params = opts or {}, params or {}
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    if scale is None:  # the scheme's default: T5 unscaled, DeBERTa by its term count, the others 1 / sqrt(d)
        scale = 1.0 if scheme == "t5" else 1.0 / math.sqrt(d)
        if scheme == "deberta":  # 1 / sqrt(d n), n = 1 + tables, the root taken in float32 as DeBERTa's code does
            terms = 1 + sum(f"deberta_{t}" in params for t in ("c2p", "p2c"))
            scale = 1.0 / float(torch.sqrt(torch.tensor(float(d * terms), dtype=torch.float32)))
    r = relative_distance(Lq, Lk, q_offset, k_offset)

    bias = torch.zeros((), dtype=q.dtype)
    value_table = None  # (H, Lq, Lk, dv)

    if scheme == "none":
        score = q @ k.transpose(-1, -2)
    elif scheme == "shaw":
        score = q @ k.transpose(-1, -2)
        kk, beyond = opts["k"], opts.get("beyond", "clip")
        if "shaw_wk" in params:
            a_k = _shaw_relative_table(params["shaw_wk"], r, kk, beyond, H)
            score = score + torch.einsum("bhid,hijd->bhij", q, a_k)
        if "shaw_wv" in params:
            value_table = _shaw_relative_table(params["shaw_wv"], r, kk, beyond, H)
    elif scheme == "t5":
        table = params["t5_table"]
        bucket = hf_relative_position_bucket(
            r,
            bidirectional=opts.get("bidirectional", True),
            num_buckets=table.shape[1],
            max_distance=opts.get("max_distance", 128),
        )
        score = q @ k.transpose(-1, -2)
        bias = table[:, bucket]  # (H, Lq, Lk)
    elif scheme == "alibi":
        slopes = params.get("alibi_slopes")
        if slopes is None:
            slopes = torch.tensor(alibi_paper_slopes(H), dtype=q.dtype)
        score = q @ k.transpose(-1, -2)
        bias = -slopes[:, None, None] * r.abs().to(q.dtype)
    elif scheme == "kerple":
        r1, r2 = params["kerple_r1"], params["kerple_r2"]
        score = q @ k.transpose(-1, -2)
        bias = -r1[:, None, None] * torch.log(1 + r2[:, None, None] * r.abs().to(q.dtype))
    elif scheme == "kerple_power":
        r1, r2 = params["kerple_power_r1"], params["kerple_power_r2"]
        score = q @ k.transpose(-1, -2)
        bias = -r1[:, None, None] * torch.pow(r.abs().to(q.dtype), r2[:, None, None])
    elif scheme == "deberta":
        buckets, reach = opts.get("position_buckets", 256), opts.get("max_relative_positions", 512)
        span = buckets if buckets > 0 else reach

        def rows(table, x):  # (H, Lq, Lk, d): table[h, row(x(i, j))], a shared table broadcast over heads
            table = table[None] if table.dim() == 2 else table
            index = (deberta_log_bucket(x, buckets, reach) + span).clamp(0, 2 * span - 1)
            return table[:, index].expand(H, -1, -1, -1)

        score = q @ k.transpose(-1, -2)
        if "deberta_c2p" in params:  # content to position: the query reads the row of query_pos - key_pos
            score = score + torch.einsum("bhid,hijd->bhij", q, rows(params["deberta_c2p"], -r))
        if "deberta_p2c" in params:  # position to content: the key reads the row of query_pos - key_pos too
            score = score + torch.einsum("bhjd,hijd->bhij", k, rows(params["deberta_p2c"], -r))
    elif scheme == "sam":  # transformers' get_decomposed_rel_pos, batch and heads kept apart
        qh, qw = opts["q_height"], opts["q_width"]
        kh, kw = opts.get("k_height") or qh, opts.get("k_width") or qw
        ry = params["sam_rel_h"][sam_rel_index(qh, kh)]  # (qh, kh, d)
        rx = params["sam_rel_w"][sam_rel_index(qw, kw)]  # (qw, kw, d)
        grid = q.reshape(B, H, qh, qw, d)
        rel_h = torch.einsum("bnhwc,hkc->bnhwk", grid, ry)
        rel_w = torch.einsum("bnhwc,wkc->bnhwk", grid, rx)
        bias = (rel_h[..., :, None] + rel_w[..., None, :]).reshape(B, H, Lq, Lk)
        score = q @ k.transpose(-1, -2)
    elif scheme == "swin":
        index = swin_relative_position_index(opts["window_height"], opts["window_width"])
        bias = params["swin_table"][:, index]  # (H, N, N)
        score = q @ k.transpose(-1, -2)
    elif scheme == "rope":
        base, dims, style = opts.get("base", 10000.0), opts.get("dims"), opts.get("style", "half_split")
        qr = rope(q, q_offset + torch.arange(Lq), base, dims, style)
        kr = rope(k, k_offset + torch.arange(Lk), base, dims, style)
        score = qr @ kr.transpose(-1, -2)
    elif scheme == "xl":
        u, vb, w_r = params["xl_u"], params["xl_v"], params["xl_w_r"]
        clamp_len = opts.get("clamp_len", 0)
        p = -r
        if clamp_len > 0:
            p = p.clamp(-clamp_len, clamp_len)
        rel_emb = xl_sinusoid(p, w_r.shape[2]).to(q.dtype)  # (Lq, Lk, pos_dim)
        content = (q + u[None, :, None, :]) @ k.transpose(-1, -2)
        qw = torch.einsum("bhid,hdp->bhip", q + vb[None, :, None, :], w_r)  # ((q + v) W_R)
        score = content + torch.einsum("bhip,ijp->bhij", qw, rel_emb)
    else:
        raise ValueError(f"unknown scheme {scheme}")

    logits = scale * score + bias  # (B, H, Lq, Lk)

    mask = torch.zeros(Lq, Lk, dtype=torch.bool)
    if causal:
        mask = mask | (r > 0)
    mask = mask[None, None]
    if key_padding is not None:
        mask = mask | key_padding.to(torch.bool)[:, None, None, :]
    if segments is not None:
        mask = mask | (segments[0][:, None, :, None] != segments[1][:, None, None, :])
    mask = mask.expand_as(logits)

    # Softmax that tolerates fully masked rows: exp(-inf) = 0 gives zero
    # probabilities and zero gradients, the row sum 0 is replaced by 1.
    masked_logits = logits.masked_fill(mask, float("-inf"))
    row_max = masked_logits.detach().amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(masked_logits - row_max)
    total = e.sum(-1, keepdim=True)
    probs = e / torch.where(total > 0, total, torch.ones_like(total))
    if dropout_mask is not None:
        probs = probs * dropout_mask.to(probs.dtype) / (1.0 - dropout_p)

    out = probs @ v
    if value_table is not None:
        out = out + torch.einsum("bhij,hijd->bhid", probs, value_table)
    lse = (total.detach().log() + row_max).squeeze(-1)
    return out, lse


# ---------------------------------------------------------------------------
# Attention dropout's mask, from docs/design.md's counter layout.
# ---------------------------------------------------------------------------


def philox4x32_10(counter, key):
    """Philox 4x32-10 (Salmon et al. 2011) on uint64 NumPy arrays holding 32-bit words:
    counter a tuple of four arrays, key a pair of ints; the key bumped before every
    round but the first."""
    import numpy as np

    mask = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & mask for c in counter)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for round in range(10):
        if round:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
        a, b = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (b >> np.uint64(32)) ^ c1 ^ k0, b & mask, (a >> np.uint64(32)) ^ c3 ^ k1, a & mask
    return c0, c1, c2, c3


def philox_keep(seed: int, offset: int, B: int, H: int, Lq: int, Lk: int, p: float, q_offset: int = 0,
                k_offset: int = 0):
    """The keep mask (B, H, Lq, Lk) of the layout: counter (kp // 64 * 16 + kp % 16, qp, b H + h,
    offset), word kp // 16 % 4, key (seed low, seed high), kept where the word >= floor(p 2^32);
    positions mod 2^32."""
    import numpy as np

    kp = (np.arange(Lk, dtype=np.uint64) + np.uint64(k_offset)) % np.uint64(2**32)
    qp = (np.arange(Lq, dtype=np.uint64) + np.uint64(q_offset)) % np.uint64(2**32)
    bh = np.arange(B * H, dtype=np.uint64).reshape(B, H, 1, 1)
    shape = (B, H, Lq, Lk)
    counter = (np.broadcast_to(kp // np.uint64(64) * np.uint64(16) + kp % np.uint64(16), shape),
               np.broadcast_to(qp[:, None], shape), np.broadcast_to(bh, shape),
               np.full(shape, offset, dtype=np.uint64))
    words = philox4x32_10(counter, (seed % 2**32, (seed >> 32) % 2**32))
    word = np.broadcast_to((kp // np.uint64(16)) % np.uint64(4), shape)
    picked = np.choose(word.astype(np.int64), words)
    return picked >= np.uint64(int(p * 2**32))
