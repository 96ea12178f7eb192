"""``RelativeMultiheadAttention``, a multi-head attention module with a relative
position scheme, and loaders of upstream layers' weights into it.

    import torch, relpos.torch as rt
    layer = rt.RelativeMultiheadAttention(512, 8, scheme="shaw", shaw_k=16)
    y = layer(x, causal=True)                 # x (B, L, 512) -> y (B, L, 512)
    y.sum().backward()                        # gradients for projections and wK, wV

The module computes with ``relpos.torch.functional.attention``, or with
``relpos.torch.context_parallel.ring_attention`` when its sequence is sharded.
``from_hf_t5``, ``from_transformer_xl`` and ``from_opennmt`` build a module
holding the weights of the upstream attention layers (docs/torch.md gives the
mappings).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Optional, Union

import torch
from torch import nn

import relpos
from relpos._calls import check_threads
from relpos.schemes import KERPLE_MIN, flag, integer, number  # noqa: F401  (rt.KERPLE_MIN: the records' floor)
from relpos.torch.context_parallel import ring_attention
from relpos.torch.functional import attention

__all__ = ["RelativeMultiheadAttention", "from_hf_t5", "from_transformer_xl", "from_opennmt"]

SCHEMES = tuple(relpos.schemes.SCHEMES)  # the names the module's ``scheme`` argument takes


class RelativeMultiheadAttention(nn.Module):
    """Multi-head attention with a relative position scheme, batch first.

    ``forward(query, key=None, value=None, *, key_padding=None, causal=False,
    mems=None, q_offset=0, k_offset=0)``: query ``(B, Lq, embed_dim)``, key/value
    ``(B, Lk, kdim / vdim)`` (default: the query; self-attention) -> ``(B, Lq, embed_dim)``.
    ``key_padding`` is bool ``(B, Lk)``, True = padded, the name ``relpos.forward``
    and ``attention`` use (nn.MultiheadAttention's ``key_padding_mask`` is accepted
    with a deprecation warning). ``q_offset="end"``: the queries are the last key
    positions (a KV-cache step).
    ``mems`` ``(B, M, kdim)`` (Transformer-XL memory, any scheme): prepended to the
    keys and values without gradient; queries then sit at positions ``M + i``.
    ``context_parallel=group`` (a ``torch.distributed`` group, or True for the world):
    the sequence is sharded across the group and forward takes this rank's rows,
    self-attention only, their positions as ``q_offset`` or ``segments`` (from
    ``relpos.context_parallel.shard_sequence``); ring attention makes the result
    that of the whole sequence. Every parameter's gradient is then this rank's
    share: sum them over the group (``all_reduce``), as ``examples/context_parallel.py`` does.
    ``num_kv_heads`` (dividing ``num_heads``; default ``num_heads``) projects keys and
    values to fewer heads, each shared by ``num_heads / num_kv_heads`` query heads
    (grouped-query attention; 1: multi-query).
    ``dropout`` in [0, 1): attention dropout on the probabilities, in training mode only, as
    ``nn.MultiheadAttention``'s (``attention(dropout_p=)``; each call draws its mask from torch's
    generator of the inputs' device). ``layer.dropout`` may be changed between calls.

    Scheme parameters (created only for the chosen ``scheme``):
      shaw   ``shaw_wk`` / ``shaw_wv``: ``(2k+1, head_dim)`` shared by heads, or
             ``(H, 2k+1, head_dim)`` with ``shaw_per_head``; ``shaw_tables`` 'k', 'v'
             or 'kv'; ``shaw_tied`` uses one table for keys and values (OpenNMT-py).
      t5     ``t5_table`` ``(H, t5_num_buckets)``; bidirectional (encoder) or causal buckets.
             ``scale`` defaults to T5's 1. Share a stack's table by assigning the parameter.
      alibi  the paper's slopes, or a learnable ``alibi_slopes`` ``(H,)`` with ``alibi_learnable``.
      rope   ``rope_base``, ``rope_dims``, ``rope_style`` (no parameters).
      xl     ``xl_u``, ``xl_v`` ``(H, head_dim)``, ``xl_w_r`` ``(H, head_dim, xl_pos_dim)``.
      kerple ``kerple_r1``, ``kerple_r2`` ``(H,)``, initialised uniformly in (0, 2) and (0, 1)
             and clamped at ``KERPLE_MIN`` = 0.01 in forward, as in the paper's code.
      kerple_power  ``kerple_power_r1``, ``kerple_power_r2`` ``(H,)``, the same, ``r2`` also
             clamped at 2 (the power variant's range).
      deberta  ``deberta_c2p`` / ``deberta_p2c``: ``(2 span, head_dim)`` shared by heads, or
             ``(H, 2 span, head_dim)`` with ``deberta_per_head``, learned as tables (DeBERTa
             itself projects one embedding table by W_K and W_Q); ``deberta_pos_att_type``
             'c2p', 'p2c' or 'c2p|p2c'; ``deberta_position_buckets`` (span; <= 0: no buckets,
             span ``deberta_max_relative_positions``). ``scale`` defaults to DeBERTa's.
    Each scheme's record creates its tensors (``init_params`` in ``relpos/schemes.py``) and
    checks its options; the module keeps the scheme's arguments in ``scheme_options``. A
    record's option that the signature does not name is taken as a keyword by its core
    name (``<scheme>_<option>``); any other extra keyword is refused by name.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        scheme: str = "none",
        *,
        head_dim: Optional[int] = None,
        num_kv_heads: Optional[int] = None,
        kdim: Optional[int] = None,
        vdim: Optional[int] = None,
        bias: bool = True,
        scale: Optional[float] = None,
        dropout: float = 0.0,
        shaw_k: int = 16,
        shaw_tables: str = "kv",
        shaw_per_head: bool = False,
        shaw_tied: bool = False,
        shaw_beyond: str = "clip",
        t5_num_buckets: int = 32,
        t5_max_distance: int = 128,
        t5_bidirectional: bool = True,
        alibi_learnable: bool = False,
        rope_base: float = 10000.0,
        rope_dims: Optional[int] = None,
        rope_style: str = "half_split",
        xl_pos_dim: Optional[int] = None,
        xl_clamp_len: int = 0,
        deberta_position_buckets: int = 256,
        deberta_max_relative_positions: int = 512,
        deberta_pos_att_type: str = "c2p|p2c",
        deberta_per_head: bool = False,
        algorithm: str = "auto",
        threads: Optional[int] = None,
        context_parallel=None,
        **options,
    ):
        # The arguments by name: the scheme's record reads its own (shaw_k, xl_pos_dim, ...).
        arguments = dict(locals())
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"relpos: scheme: must be one of {', '.join(SCHEMES)}; got {scheme!r}")
        record = relpos.schemes.SCHEMES[scheme]
        # Options the signature does not name (a scheme's record added later) by their core names.
        cores = [o.core for o in record.option_table()]
        for name in arguments.pop("options"):
            if not any(name.startswith(f"{s}_") for s in SCHEMES):
                raise TypeError(f"RelativeMultiheadAttention got an unexpected keyword argument {name!r}")
            if name not in cores or name in arguments:
                raise ValueError(f"relpos: RelativeMultiheadAttention: no argument {name!r} for scheme {scheme!r} "
                                 f"(its options: {', '.join(cores) or 'none'})")
        arguments.update(options)
        for arg, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("head_dim", head_dim),
                           ("num_kv_heads", num_kv_heads), ("kdim", kdim), ("vdim", vdim), ("xl_pos_dim", xl_pos_dim)):
            if value is not None and integer(value, arg) < 1:
                raise ValueError(f"relpos: {arg}: must be >= 1, got {value}")
        for arg in ("bias", "shaw_per_head", "shaw_tied", "alibi_learnable", "deberta_per_head"):
            flag(arguments[arg], arg)  # "no" would otherwise read as true
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"relpos: num_kv_heads: must divide num_heads {num_heads}, got {num_kv_heads}")
        # The scheme's arguments (its options' defaults where the module takes none for one),
        # its options checked here under the module's names for them.
        defaults = {o.core: o.default for o in record.option_table() if o.default is not dataclasses.MISSING}
        given = {n: x for n, x in arguments.items() if n.startswith(f"{scheme}_") or n in cores}
        self.scheme_options = {**defaults, **given}
        if missing := [o.core for o in record.option_table() if o.core not in self.scheme_options]:
            raise ValueError(f"relpos: RelativeMultiheadAttention: scheme {scheme!r} needs {', '.join(missing)} "
                             "(its grid: the sequence's rows of cells)")
        for o in record.option_table():
            o.check(self.scheme_options[o.core], o.core)
        if threads is not None:
            check_threads(threads)
        if not 0 <= number(dropout, "dropout") < 1:
            raise ValueError(f"relpos: dropout: must be in [0, 1) (the probability of dropping an attention "
                             f"probability), got {dropout!r}")
        if head_dim is None:
            if embed_dim % num_heads:
                raise ValueError(f"relpos: embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
            head_dim = embed_dim // num_heads
        # The options that size the module's tensors, checked before any is made (the
        # record's own checks see a call; a module that could never run is refused here).
        if scheme == "t5":  # the core's check of the bucket count against the distance, named as here
            relpos._relpos.check_t5_config(flag(t5_bidirectional, "t5_bidirectional"),
                                           integer(t5_num_buckets, "t5_num_buckets"),
                                           integer(t5_max_distance, "t5_max_distance"),
                                           "relpos: t5_num_buckets", "relpos: t5_max_distance")
        if scheme == "rope" and ((rope_dims or head_dim) % 2 or (rope_dims or head_dim) > head_dim):
            raise ValueError(f"relpos: rope_dims: the rotated dimensions must be even and <= head_dim {head_dim}, "
                             f"got {rope_dims or head_dim}" + ("" if rope_dims else " (none given: the whole head)"))
        if scheme == "xl" and (xl_pos_dim or embed_dim) % 2:
            raise ValueError(f"relpos: xl_pos_dim: must be even (sin and cos halves); it defaults to embed_dim "
                             f"{embed_dim}, got {xl_pos_dim or embed_dim}")
        if shaw_tables not in ("k", "v", "kv"):
            raise ValueError(f"relpos: shaw_tables: must be 'k', 'v' or 'kv', got {shaw_tables!r}")
        if deberta_pos_att_type not in ("c2p", "p2c", "c2p|p2c", "p2c|c2p"):
            raise ValueError("relpos: deberta_pos_att_type: must be 'c2p', 'p2c' or 'c2p|p2c', "
                             f"got {deberta_pos_att_type!r}")
        self.embed_dim, self.num_heads, self.head_dim, self.scheme = embed_dim, num_heads, head_dim, scheme
        self.num_kv_heads = num_kv_heads
        self.scale, self.algorithm, self.threads, self.dropout = scale, algorithm, threads, float(dropout)
        # A torch.distributed process group (True: the whole world) over which the
        # sequence is sharded: forward then takes this rank's rows (ring attention).
        self.context_parallel = context_parallel
        inner = num_heads * head_dim
        self.q_proj = nn.Linear(embed_dim, inner, bias=bias)
        self.k_proj = nn.Linear(kdim or embed_dim, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(vdim or embed_dim, num_kv_heads * head_dim, bias=bias)
        self.out_proj = nn.Linear(inner, embed_dim, bias=bias)

        # Every scheme's tensor attribute exists, None where this module has no such tensor:
        # position_scheme, the loaders below and users read them by name (``layer.shaw_wv``).
        for cls in relpos.schemes.SCHEMES.values():
            for field in cls._tensors:
                setattr(self, f"{cls.name}_{field}", None)
        params = record.init_params(num_heads, head_dim, embed_dim, self.scheme_options)
        for field, tensor in params.items():
            if tensor is not None:
                setattr(self, f"{scheme}_{field}", nn.Parameter(tensor))

    def position_scheme(self):
        """The relpos scheme record holding this module's parameters (not copies; KERPLE's
        clamped into their range)."""
        record = relpos.schemes.SCHEMES[self.scheme]
        params = {field: getattr(self, f"{record.name}_{field}") for field in record._tensors}
        return record.module_record(self.scheme_options, params)

    def _heads(self, x: torch.Tensor, heads: Optional[int] = None) -> torch.Tensor:
        """(B, L, heads * d) -> (B, heads, L, d) as a strided view (the core reads it in place);
        d is read from the last axis alone, so a zero-length x (B or L of 0) has it too."""
        return x.unflatten(2, (heads or self.num_heads, -1)).transpose(1, 2)

    def forward(
        self,
        query: torch.Tensor,
        key: Optional[torch.Tensor] = None,
        value: Optional[torch.Tensor] = None,
        *,
        key_padding: Optional[torch.Tensor] = None,
        causal: bool = False,
        mems: Optional[torch.Tensor] = None,
        q_offset: Union[int, str] = 0,
        k_offset: int = 0,
        key_padding_mask: Optional[torch.Tensor] = None,
        segments=None,
    ) -> torch.Tensor:
        if key_padding_mask is not None:
            if key_padding is not None:
                raise ValueError("relpos: key_padding and key_padding_mask: pass one (they are the same argument)")
            warnings.warn("relpos: key_padding_mask is deprecated; pass key_padding (the name relpos uses everywhere)",
                          DeprecationWarning, stacklevel=2)
            key_padding = key_padding_mask
        key = query if key is None else key
        value = key if value is None else value
        widths = (("query", query, self.q_proj.in_features), ("key", key, self.k_proj.in_features),
                  ("value", value, self.v_proj.in_features))
        for name, x, width in widths:
            if x.dim() != 3 or x.shape[2] != width:
                raise ValueError(f"relpos: {name}: expected (B, L, {width}), got {tuple(x.shape)}")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(f"relpos: query, key, value: batch and key lengths disagree: {tuple(query.shape)}, "
                             f"{tuple(key.shape)}, {tuple(value.shape)}")
        if mems is not None and key is not value and key.shape[2] != value.shape[2]:
            raise ValueError(f"relpos: mems: one memory serves as keys and values, so key and value need one "
                             f"width; got {key.shape[2]} and {value.shape[2]}")
        if mems is not None and (mems.dim() != 3 or mems.shape[0] != key.shape[0] or mems.shape[2] != key.shape[2]):
            raise ValueError(f"relpos: mems: expected (B={key.shape[0]}, M, {key.shape[2]}) like the keys, "
                             f"got {tuple(mems.shape)}")
        if mems is not None and isinstance(key_padding, torch.Tensor) and key_padding.shape != key.shape[:2]:
            raise ValueError(f"relpos: key_padding: expected (B={key.shape[0]}, L={key.shape[1]}), the new keys "
                             f"only (the memory's {mems.shape[1]} are never padded), got {tuple(key_padding.shape)}")
        if isinstance(q_offset, str) and q_offset != "end":
            raise ValueError(f"relpos: q_offset: expected an integer or 'end', got {q_offset!r}")
        if mems is not None:
            # Memory is context only: no gradient flows into the cached states.
            mems = mems.detach()
            key, value = torch.cat([mems, key], 1), torch.cat([mems, value], 1)
            if q_offset != "end":  # "end" stays end-aligned with the longer keys
                q_offset = integer(q_offset, "q_offset") + mems.shape[1]
            if key_padding is not None:
                pad = key_padding.new_zeros(key_padding.shape[0], mems.shape[1])
                key_padding = torch.cat([pad, key_padding], 1)
        q = self._heads(self.q_proj(query))
        k = self._heads(self.k_proj(key), self.num_kv_heads)
        v = self._heads(self.v_proj(value), self.num_kv_heads)
        dropout_p = self.dropout if self.training else 0.0
        if self.context_parallel is not None:
            if mems is not None or key is not query:
                raise ValueError("relpos: context_parallel: self-attention over the sharded sequence only "
                                 "(no key/value arguments, no mems)")
            group = None if self.context_parallel is True else self.context_parallel
            # Every parameter's gradient is this rank's share, the positional ones too:
            # the model sums them all over the group, as for data parallelism.
            out = ring_attention(q, k, v, self.position_scheme(), group=group, causal=causal, key_padding=key_padding,
                                 q_offset=q_offset, k_offset=q_offset, q_segments=segments, k_segments=segments,
                                 scale=self.scale, threads=self.threads, reduce_param_grads=False,
                                 dropout_p=dropout_p)
        else:
            out = attention(q, k, v, self.position_scheme(), causal=causal, key_padding=key_padding,
                            q_offset=q_offset, k_offset=k_offset, scale=self.scale, algorithm=self.algorithm,
                            threads=self.threads, dropout_p=dropout_p)
        return self.out_proj(out.transpose(1, 2).flatten(2))


# ---------------------------------------------------------------------------
# Weights of upstream layers (mappings documented in docs/torch.md).
# ---------------------------------------------------------------------------


def _copy(dst: nn.Linear, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
    with torch.no_grad():
        dst.weight.copy_(weight)
        if dst.bias is not None:
            dst.bias.copy_(bias)


def from_hf_t5(attn, relative_attention_bias: Optional[nn.Embedding] = None, *, cross_attention: bool = False
               ) -> RelativeMultiheadAttention:
    """A module with the weights of a Hugging Face ``T5Attention`` (attribute names
    ``q, k, v, o, n_heads, key_value_proj_dim, is_decoder, relative_attention_num_buckets,
    relative_attention_max_distance`` and, on the first layer of a stack,
    ``relative_attention_bias``). Later self-attention layers of a stack take the
    stack's ``relative_attention_bias`` (the first layer's) as argument.

    ``relative_attention_bias.weight`` ``(num_buckets, H)`` becomes ``t5_table``
    ``(H, num_buckets)``; scale 1; encoder buckets bidirectional, decoder causal
    (call the decoder's self-attention with ``causal=True``).
    ``cross_attention=True`` loads a decoder's cross-attention layer
    (``T5LayerCrossAttention.EncDecAttention``): T5 gives it no position bias, so
    the module has none (scheme ``"none"``, scale 1); call it with the encoder's
    states as key and value."""
    H, d = attn.n_heads, attn.key_value_proj_dim
    if cross_attention:
        m = RelativeMultiheadAttention(attn.q.in_features, H, "none", head_dim=d, bias=False, scale=1.0)
    else:
        emb = relative_attention_bias if relative_attention_bias is not None else getattr(
            attn, "relative_attention_bias", None)
        if emb is None:
            raise ValueError("relpos: from_hf_t5: the layer has no relative_attention_bias: for a self-attention layer "
                             "after the first of its stack pass the stack's first relative_attention_bias; for a "
                             "cross-attention layer (EncDecAttention) pass cross_attention=True (T5 gives it no "
                             "position bias)")
        m = RelativeMultiheadAttention(attn.q.in_features, H, "t5", head_dim=d, bias=False, scale=1.0,
                                       t5_num_buckets=attn.relative_attention_num_buckets,
                                       t5_max_distance=attn.relative_attention_max_distance,
                                       t5_bidirectional=not attn.is_decoder)
        with torch.no_grad():
            m.t5_table.copy_(emb.weight.t())
    for dst, src in ((m.q_proj, attn.q), (m.k_proj, attn.k), (m.v_proj, attn.v), (m.out_proj, attn.o)):
        _copy(dst, src.weight)
    return m


def from_transformer_xl(attn, r_w_bias: torch.Tensor, r_r_bias: torch.Tensor, clamp_len: int = 0,
                        same_length: bool = False) -> RelativeMultiheadAttention:
    """A module with the weights of the original Transformer-XL
    ``RelPartialLearnableMultiHeadAttn`` (``qkv_net``, ``r_net``, ``o_net``, ``n_head``,
    ``d_head``, ``d_model``; no biases) and the model's ``r_w_bias`` / ``r_r_bias``
    ``(H, d_head)`` (shared by all layers upstream: pass the same tensors to every layer).

    u = r_w_bias, v = r_r_bias, W_R[h] = r_net.weight.view(H, d_head, d_model)[h]
    (pos_dim = d_model: the sinusoid ``[sin, cos]`` of size d_model), qkv_net split in
    q, k, v rows. Dropout, the residual and layer norm stay outside. Call it with
    ``causal=True`` and ``mems`` as upstream. Pass the model's ``same_length``:
    ``True`` (every query sees the same number of keys, a sliding window) is
    refused, as is ``RelLearnableMultiHeadAttn`` (``attn_type=1``)."""
    if same_length:
        raise ValueError("relpos: from_transformer_xl: same_length=True (a sliding-window mask giving every query the "
                         "same number of keys) is not supported: relpos masks causally and by key padding only; "
                         "train or evaluate with same_length=False")
    if not hasattr(attn, "r_net"):
        kind = type(attn).__name__
        raise ValueError(f"relpos: from_transformer_xl: {kind} has no r_net: only RelPartialLearnableMultiHeadAttn "
                         "(attn_type=0) is loaded; RelLearnableMultiHeadAttn (attn_type=1, learned r_emb and r_bias "
                         "per distance) is not supported")
    H, d, d_model = attn.n_head, attn.d_head, attn.d_model
    m = RelativeMultiheadAttention(d_model, H, "xl", head_dim=d, bias=False, xl_pos_dim=d_model,
                                   xl_clamp_len=clamp_len)
    w_q, w_k, w_v = attn.qkv_net.weight.chunk(3, 0)
    for dst, w in ((m.q_proj, w_q), (m.k_proj, w_k), (m.v_proj, w_v), (m.out_proj, attn.o_net.weight)):
        _copy(dst, w)
    with torch.no_grad():
        m.xl_u.copy_(r_w_bias)
        m.xl_v.copy_(r_r_bias)
        m.xl_w_r.copy_(attn.r_net.weight.view(H, d, d_model))
    if getattr(attn, "scale", None) is not None and not math.isclose(attn.scale, d**-0.5):
        m.scale = attn.scale
    return m


def from_opennmt(attn) -> RelativeMultiheadAttention:
    """A module with the weights of OpenNMT-py's ``MultiHeadedAttention``
    (``linear_query``, ``linear_keys``, ``linear_values``, ``final_linear``,
    ``head_count``, ``dim_per_head``, ``max_relative_positions``), 2.x or 3.x.

    ``max_relative_positions = k > 0``: ``relative_positions_embeddings``
    ``nn.Embedding(2k+1, dim_per_head)`` is Shaw's wK and wV at once
    (``shaw_tied``), shared by heads, distances clipped at +-k; ``0``: plain
    attention (scheme ``"none"``). OpenNMT-py 3.x: the linears' biases follow
    ``add_qkvbias`` (``False`` by default), and ``num_kv > 0`` key/value heads
    become ``num_kv_heads`` (grouped-query attention). Rotary (``-1``), ALiBi
    (``-2``) and ``relative_positions_buckets > 0`` are refused by name."""
    H, d = attn.head_count, attn.dim_per_head
    k = attn.max_relative_positions
    if k < 0:
        kind = {-1: "rotary embeddings", -2: "ALiBi"}.get(k, "an unknown position kind")
        raise ValueError(f"relpos: from_opennmt: max_relative_positions={k} ({kind}) is not loaded: build "
                         f"rt.RelativeMultiheadAttention with that scheme and copy the four linears")
    if getattr(attn, "relative_positions_buckets", 0) > 0:
        raise ValueError(f"relpos: from_opennmt: relative_positions_buckets={attn.relative_positions_buckets} "
                         "(a bucketed per-head bias) is not loaded")
    linears = (attn.linear_query, attn.linear_keys, attn.linear_values, attn.final_linear)
    biased = {lin.bias is not None for lin in linears}
    if len(biased) != 1:
        raise ValueError("relpos: from_opennmt: some of the four linears have biases and some not; relpos's module "
                         "has biases on all or none")
    num_kv = getattr(attn, "num_kv", 0) or H
    m = RelativeMultiheadAttention(attn.linear_query.in_features, H, "shaw" if k > 0 else "none", head_dim=d,
                                   num_kv_heads=num_kv, bias=biased.pop(), shaw_k=max(k, 0), shaw_tied=True)
    for dst, src in zip((m.q_proj, m.k_proj, m.v_proj, m.out_proj), linears):
        _copy(dst, src.weight, src.bias)
    if k > 0:
        with torch.no_grad():
            m.shaw_wk.copy_(attn.relative_positions_embeddings.weight)
    return m
