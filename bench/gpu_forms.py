"""The forms bench/gpu.py times relpos.gpu against, each written as its own project or
PyTorch's documentation writes it, so that a ratio in the table says what replacing
that code with relpos.gpu gains:

- SDPA flash (no positions): the speed a position scheme is measured from;
- FlexAttention, compiled: plain, ALiBi with fixed slopes, T5 reading a per-distance
  bias row gathered from a table that requires grad, Shaw key-only reading a
  per-(query, distance) score precomputed from q;
- Hugging Face T5: the bias materialised per (head, query, key) from the table,
  passed to SDPA as a float mask (HF computes it in every forward);
- rotation then SDPA flash (RoPE as Llama applies it, cos / sin cached);
- Transformer-XL: ``(q + v) . (W_R R)`` as a band over distances, the pad-and-view
  rel-shift of kimiyoung/transformer-xl, then SDPA with it as a bias;
- OpenNMT-py's Shaw: (L, L, d) relation tables gathered and multiplied by
  ``relative_matmul``;
- Hugging Face DeBERTa-v2: ``DisentangledSelfAttention``'s c2p and p2c products
  against the whole (2 span, d) tables, gathered to (query, key) by the log-bucketed
  relative positions, added to the scores, an eager softmax.

Every form takes q, k, v ``(B, H, L, d)`` and returns ``(B, H, Lq, dv)``. Needs torch only
(flex_attention is imported when a flex form is built); runs on CPU tensors too, which is
how ``bench/gpu.py --smoke`` checks these forms without a GPU (flex forms are CUDA-only
there).
"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

T5_BUCKETS, T5_MAX_DISTANCE = 32, 128


def load_by_path(name: str, path: Path):
    """A module from its file (tests/python/torch_oracle.py is not inside a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def oracle():
    """tests/python/torch_oracle.py: the float64 reference, and Hugging Face's bucket
    function verbatim (the HF and flex T5 forms use it, as HF does)."""
    return load_by_path("torch_oracle", Path(__file__).resolve().parent.parent / "tests" / "python" / "torch_oracle.py")


def flash_context(device: torch.device):
    """SDPA restricted to its flash kernel on CUDA; on CPU (the smoke run) to the math
    kernel, the one every CPU build has."""
    return sdpa_kernel(SDPBackend.FLASH_ATTENTION if device.type == "cuda" else SDPBackend.MATH)


def sdpa_flash(q, k, v, *, causal: bool, scale: float):
    with flash_context(q.device):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def sdpa_with_bias(q, k, v, bias, *, scale: float):
    """SDPA with a float mask, torch choosing the kernel as a model calling it would
    (memory-efficient where it takes a bias that needs a gradient, else math)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


# ---------------------------------------------------------------------------
# RoPE: rotation, then SDPA flash
# ---------------------------------------------------------------------------


def rope_cache(L: int, d: int, base: float, dtype, device):
    """Llama's cos / sin cache ``(L, d)`` in the model's dtype (computed once per model)."""
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d)
    freqs = torch.outer(torch.arange(L, dtype=torch.float32, device=device), inv_freq)
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), -1)


def rope_then_flash(q, k, v, cos, sin, *, causal: bool, scale: float):
    """transformers' apply_rotary_pos_emb (half-split), then SDPA flash."""
    qr, kr = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    return sdpa_flash(qr, kr, v, causal=causal, scale=scale)


# ---------------------------------------------------------------------------
# T5 as Hugging Face runs it: a materialised bias per (head, query, key)
# ---------------------------------------------------------------------------


def t5_hf(q, k, v, table, *, causal: bool, scale: float, bidirectional: bool):
    """T5Attention.compute_bias (the bucket of every (query, key) pair, the table as an
    nn.Embedding ``(buckets, H)`` read per pair), the decoder's causal mask added at the
    dtype's minimum, then SDPA with that bias; the table receives its gradient."""
    bucket_of = oracle().hf_relative_position_bucket
    Lq, Lk = q.shape[2], k.shape[2]
    context = torch.arange(Lq, dtype=torch.long, device=q.device)[:, None]
    memory = torch.arange(Lk, dtype=torch.long, device=q.device)[None, :]
    bucket = bucket_of(memory - context, bidirectional=bidirectional, num_buckets=table.shape[1],
                       max_distance=T5_MAX_DISTANCE)
    bias = F.embedding(bucket, table.t()).permute(2, 0, 1).unsqueeze(0)  # (1, H, Lq, Lk)
    if causal:
        future = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).triu(1)
        bias = bias + torch.zeros(Lq, Lk, dtype=bias.dtype, device=q.device).masked_fill(
            future, torch.finfo(bias.dtype).min)
    return sdpa_with_bias(q, k, v, bias.to(q.dtype), scale=scale)


def t5_hf_bytes(B, H, Lq, Lk, itemsize=2) -> float:
    """Estimated peak of t5_hf's forward and backward (bucket index and its float
    temporaries, the bias, its masked copy, the bias gradient SDPA makes per batch
    row), to skip sizes that cannot fit."""
    pairs = Lq * Lk
    return pairs * 8 * 3 + H * pairs * itemsize * 4 + B * H * pairs * itemsize * 2


# ---------------------------------------------------------------------------
# Transformer-XL: band of (q + v) . W_R R, rel-shift, SDPA with it as a bias
# ---------------------------------------------------------------------------


def xl_sinusoid(positions: torch.Tensor, pos_dim: int) -> torch.Tensor:
    """PositionalEmbedding of kimiyoung/transformer-xl: ``[sin(p f), cos(p f)]``."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, pos_dim, 2.0, device=positions.device) / pos_dim))
    angles = torch.outer(positions.float(), inv_freq)
    return torch.cat([angles.sin(), angles.cos()], -1)


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """_rel_shift of kimiyoung/transformer-xl on a (B, H, Lq, Lrel) band whose column c
    holds distance ``p_max - c``: row i moves left by ``Lq - 1 - i`` (pad a zero column,
    reinterpret the rows, drop the first), so column j then holds the pair (i, j)."""
    B, H, Lq, Lrel = x.shape
    padded = torch.cat([x.new_zeros(B, H, Lq, 1), x], dim=-1).view(B, H, Lrel + 1, Lq)
    return padded[:, :, 1:].reshape(B, H, Lq, Lrel)


def xl_torch(q, k, v, u, vb, w_r, *, memory: int, causal: bool, scale: float):
    """Transformer-XL's attention with ``memory`` cached keys in front of the segment:
    ``AC = (q + u) . k`` inside SDPA, ``BD = (q + v) . (W_R R)`` over the distances
    ``p = memory + Lq - 1`` down to 0 (causal, XL's own band) or to ``-(Lq - 1)``,
    rel-shifted into (query, key) order and passed as SDPA's bias, scaled and masked."""
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    p_max = memory + Lq - 1
    p_min = 0 if causal else -(Lq - 1)
    positions = torch.arange(p_max, p_min - 1, -1, device=q.device)
    r_head_k = torch.einsum("hdp,jp->hjd", w_r, xl_sinusoid(positions, w_r.shape[2]).to(w_r.dtype))  # W_R R
    bd = torch.matmul(q + vb[None, :, None, :], r_head_k.transpose(1, 2)[None])  # (B, H, Lq, Lrel)
    bias = rel_shift(bd)[..., :Lk] * scale
    if causal:
        future = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).triu(memory + 1)
        bias = bias.masked_fill(future, float("-inf"))
    return sdpa_with_bias(q + u[None, :, None, :], k, v, bias, scale=scale)


def xl_torch_bytes(B, H, Lq, Lk, itemsize=2) -> float:
    """Estimated peak of xl_torch's forward and backward: the band, its padded and
    shifted copies, the bias and the gradients of each."""
    return B * H * Lq * (Lk + Lq) * itemsize * 8


# ---------------------------------------------------------------------------
# Shaw as OpenNMT-py writes it
# ---------------------------------------------------------------------------


def _relative_matmul(x, z, transpose: bool):
    """onmt/modules/multi_headed_attn.py relative_matmul: x (B, H, L, .) against a
    per-query table z (L, ., .) as one batched product over the queries."""
    batch_size, heads, length, _ = x.shape
    x_t = x.permute(2, 0, 1, 3).reshape(length, heads * batch_size, -1)
    x_tz = torch.matmul(x_t, z.transpose(1, 2) if transpose else z)
    return x_tz.reshape(length, batch_size, heads, -1).permute(1, 2, 0, 3)


def shaw_opennmt(q, k, v, wk, wv, shaw_k: int, *, causal: bool, scale: float):
    """OpenNMT-py's self-attention with max_relative_positions = shaw_k: the relation
    tables (L, L, d) gathered from the embeddings every call, the query scaled first,
    softmax in float32 as OpenNMT casts it."""
    Lq, Lk = q.shape[2], k.shape[2]
    distance = (torch.arange(Lk, device=q.device)[None, :] - torch.arange(Lq, device=q.device)[:, None])
    index = distance.clamp(-shaw_k, shaw_k) + shaw_k
    relations_keys, relations_values = F.embedding(index, wk), F.embedding(index, wv)
    query = q * scale
    scores = torch.matmul(query, k.transpose(2, 3)) + _relative_matmul(query, relations_keys, True)
    if causal:
        scores = scores.masked_fill(torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).triu(1), -1e18)
    attn = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(attn, v) + _relative_matmul(attn, relations_values, False)


def shaw_opennmt_bytes(B, H, Lq, Lk, d, itemsize=2) -> float:
    """Estimated peak of shaw_opennmt's forward and backward: the two relation tables and
    their gradients, the scores in the input dtype and float32, the probabilities."""
    return Lq * Lk * d * itemsize * 6 + B * H * Lq * Lk * (itemsize * 6 + 4 * 3)


# ---------------------------------------------------------------------------
# DeBERTa as Hugging Face transformers writes it
# ---------------------------------------------------------------------------


def deberta_hf(q, k, v, c2p, p2c, *, position_buckets: int, max_relative_positions: int, causal: bool,
               scale: float):
    """transformers' DisentangledSelfAttention (modeling_deberta_v2.py) from projected q, k, v
    and the tables' projections (pos_key_layer = c2p, pos_query_layer = p2c, shared by the
    heads): ``q k^T`` plus ``c2p_att`` (q against every table row, gathered at
    ``clamp(rel + span)``) plus ``p2c_att`` (k against every row, gathered at
    ``clamp(-rel + span)`` and transposed), each scaled, masked with the dtype's minimum as
    HF masks, softmax and ``@ v`` in the input dtype. ``rel`` is ``make_log_bucket_position``
    of query minus key position (tests/python/torch_oracle.py, checked against transformers)."""
    B, H, L, d = q.shape
    span = position_buckets if position_buckets > 0 else max_relative_positions
    positions = torch.arange(L, device=q.device)
    rel = oracle().deberta_log_bucket(positions[:, None] - positions[None, :], position_buckets,
                                      max_relative_positions)
    query, key = q.reshape(B * H, L, d), k.reshape(B * H, L, d)
    scores = torch.bmm(query, key.transpose(-1, -2)) * scale
    c2p_att = torch.bmm(query, c2p[None].expand(B * H, -1, -1).transpose(-1, -2))
    c2p_pos = torch.clamp(rel + span, 0, 2 * span - 1)
    scores = scores + torch.gather(c2p_att, -1, c2p_pos[None].expand(B * H, L, L)) * scale
    p2c_att = torch.bmm(key, p2c[None].expand(B * H, -1, -1).transpose(-1, -2))
    p2c_pos = torch.clamp(-rel + span, 0, 2 * span - 1)
    scores = scores + torch.gather(p2c_att, -1, p2c_pos[None].expand(B * H, L, L)).transpose(-1, -2) * scale
    if causal:
        future = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, torch.finfo(q.dtype).min)
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs, v.reshape(B * H, L, -1)).view(B, H, L, -1)


def deberta_hf_bytes(B, H, L, itemsize=2) -> float:
    """Estimated peak of deberta_hf's forward and backward: the scores, both gathered
    terms, their sums, the probabilities and the gradients of each, (B H, L, L) apiece."""
    return B * H * L * L * itemsize * 10


# ---------------------------------------------------------------------------
# FlexAttention
# ---------------------------------------------------------------------------

_FLEX = {}


def flex():
    """flex_attention compiled once for the process (each score_mod and shape is a
    compile of its own; the recompile limit is raised so that none falls back to the
    eager form, which materialises the scores)."""
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                with contextlib.suppress(Exception):
                    setattr(torch._dynamo.config, name, max(256, getattr(torch._dynamo.config, name)))
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
        _FLEX["create_block_mask"] = create_block_mask
    return _FLEX["fn"]


def causal_block_mask(L: int, device):
    """The causal BlockMask for (L, L), made once per length (outside the timed calls,
    as a model makes it once per batch)."""
    flex()
    key = ("causal", L, str(device))
    if key not in _FLEX:
        _FLEX[key] = _FLEX["create_block_mask"](lambda b, h, qi, kj: qi >= kj, None, None, L, L, device=device)
    return _FLEX[key]


def flex_plain(q, k, v, block_mask, *, scale: float):
    return flex()(q, k, v, block_mask=block_mask, scale=scale)


def flex_alibi(q, k, v, slopes, block_mask, *, scale: float):
    """ALiBi with fixed slopes (a tensor the score_mod reads, no gradient)."""
    def score_mod(score, b, h, qi, kj):
        return score - slopes[h] * (kj - qi).abs()

    return flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def t5_bucket_row(Lq: int, Lk: int, bidirectional: bool, device) -> torch.Tensor:
    """The bucket of every distance ``r = -(Lq - 1) ... Lk - 1`` (Hugging Face's function),
    row index ``r + Lq - 1``: what the flex T5 form reads per pair."""
    distances = torch.arange(-(Lq - 1), Lk, dtype=torch.long, device=device)
    return oracle().hf_relative_position_bucket(distances, bidirectional=bidirectional, num_buckets=T5_BUCKETS,
                                                max_distance=T5_MAX_DISTANCE).to(torch.int32)


def flex_t5(q, k, v, table, bucket_row, block_mask, *, scale: float):
    """T5 with the score_mod reading ``table[h, bucket(r)]`` from a table that requires
    grad: flex's backward then accumulates the table's gradient from every pair."""
    Lq = q.shape[2]

    def score_mod(score, b, h, qi, kj):
        return score + table[h, bucket_row[kj - qi + (Lq - 1)]]

    return flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def flex_shaw_keys(q, k, v, wk, shaw_k: int, block_mask, *, scale: float):
    """Shaw's key term only (flex has no per-pair value term): ``scale * q_i . wk[c(r)]``
    computed for every query and clipped distance as a (B, H, Lq, 2k+1) tensor, which the
    score_mod reads per pair; its gradient flows back to q and wk."""
    qw = torch.matmul(q, wk.t()) * scale

    def score_mod(score, b, h, qi, kj):
        return score + qw[b, h, qi, torch.clamp(kj - qi, -shaw_k, shaw_k) + shaw_k]

    return flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
