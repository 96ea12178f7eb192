"""``patch_hf_t5``: a loaded Hugging Face T5 model's attention computed by relpos, in place.

Every ``T5Attention`` of the model keeps its weights and its place; its forward is
replaced by one that projects q, k, v with the layer's own linears, runs the cache
exactly as transformers does (``DynamicCache`` / ``EncoderDecoderCache``), and calls
``relpos.torch.attention`` with the T5 scheme on the stack's one bias table (the
first layer's ``relative_attention_bias``, which receives the gradient), causal in
the decoder's self-attention with the queries at the end of the cached keys, and
no position bias in cross-attention. transformers' attention mask becomes relpos's
causal flag plus key padding; a mask that is not of that form is refused. In training
mode the layer's attention dropout (``config.dropout_rate``, which T5Attention applies to
its attention weights when ``self.training``) is relpos's ``dropout_p``.
"""
from __future__ import annotations

import types

import torch
from torch import nn

import relpos
from relpos.torch.functional import attention

__all__ = ["patch_hf_t5"]


def _key_padding(mask, batch: int, key_length: int):
    """(B, Lk) bool, True = padded, from transformers' 4-D mask (bool: True = attend;
    float: 0 = attend, very negative = masked), read in the last query row (a causal
    mask's last row sees every key that is not padding); None when nothing is padded."""
    if mask is None:
        return None
    if mask.dim() != 4 or mask.shape[-1] != key_length:
        raise ValueError(f"relpos: patch_hf_t5: expected a (B, 1, Lq, {key_length}) attention mask, "
                         f"got shape {tuple(mask.shape)}")
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    padded = ~allowed[:, 0, -1, :].expand(batch, key_length)
    return padded if bool(padded.any()) else None


def _check_mask(mask, padding, causal: bool, query_length: int, key_length: int) -> None:
    """The mask must be what relpos applies: causal (queries at the end of the keys)
    and key padding; anything else (a custom mask) would be computed wrongly."""
    if mask is None:
        return
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    expected = torch.ones(query_length, key_length, dtype=torch.bool, device=mask.device)
    if causal:
        expected = torch.tril(expected, diagonal=key_length - query_length)
    expected = expected[None, None]
    if padding is not None:
        expected = expected & ~padding[:, None, None, :]
    allowed, expected = torch.broadcast_tensors(allowed, expected)
    rows_with_keys = expected.any(-1, keepdim=True)  # fully masked rows: any mask gives zeros in relpos
    if not torch.equal(allowed & rows_with_keys, expected & rows_with_keys):
        raise ValueError("relpos: patch_hf_t5: the attention mask is not causal-plus-key-padding; relpos cannot "
                         "apply an arbitrary mask")


def _project_and_cache(attn, hidden_states, key_value_states, past_key_values):
    """q, k, v as (B, H, L, d) and transformers' cache bookkeeping, as T5Attention does it."""
    from transformers.cache_utils import EncoderDecoderCache

    hidden_shape = (*hidden_states.shape[:-1], -1, attn.key_value_proj_dim)
    query = attn.q(hidden_states).view(hidden_shape).transpose(1, 2)
    is_cross = key_value_states is not None
    is_updated, cache = False, past_key_values
    if isinstance(past_key_values, EncoderDecoderCache):
        is_updated = past_key_values.is_updated.get(attn.layer_idx)
        cache = past_key_values.cross_attention_cache if is_cross else past_key_values.self_attention_cache
    if is_cross and past_key_values is not None and is_updated:
        return query, cache.layers[attn.layer_idx].keys, cache.layers[attn.layer_idx].values
    current = key_value_states if is_cross else hidden_states
    kv_shape = (*current.shape[:-1], -1, attn.key_value_proj_dim)
    key = attn.k(current).view(kv_shape).transpose(1, 2)
    value = attn.v(current).view(kv_shape).transpose(1, 2)
    if past_key_values is not None:
        key, value = cache.update(key, value, attn.layer_idx)
        if is_cross and isinstance(past_key_values, EncoderDecoderCache):
            past_key_values.is_updated[attn.layer_idx] = True
    return query, key, value


def _forward(self, hidden_states, mask=None, key_value_states=None, position_bias=None, past_key_values=None,
             **kwargs):
    if kwargs.get("output_attentions"):
        raise ValueError("relpos: patch_hf_t5: output_attentions=True needs the attention weights, which relpos "
                         "never forms; unpatch the model to inspect them")
    query, key, value = _project_and_cache(self, hidden_states, key_value_states, past_key_values)
    B, H, Lq, _ = query.shape
    Lk = key.shape[2]
    cross = key_value_states is not None
    causal = self.is_decoder and not cross
    padding = _key_padding(mask, B, Lk)
    _check_mask(mask, padding, causal, Lq, Lk)
    if cross:
        scheme = relpos.NoPosition()
    else:
        table = self._relpos_bias_owner.relative_attention_bias.weight.t()  # (H, num_buckets), gradients flow
        scheme = relpos.T5(table, bidirectional=not self.is_decoder,
                           max_distance=self.relative_attention_max_distance)
    # Self-attention's queries are the last cached positions; cross-attention has no positions.
    out = attention(query, key, value, scheme, causal=causal, key_padding=padding, q_offset=0 if cross else "end",
                    scale=1.0, dropout_p=self.dropout if self.training else 0.0)  # where T5Attention drops
    out = self.o(out.transpose(1, 2).reshape(B, Lq, -1))
    return out, None, None


def _refuse_relatives(model: nn.Module) -> None:
    """T5's relatives whose attention differs from T5's, refused by the model's name
    before anything is patched."""
    from transformers.models.longt5.modeling_longt5 import LongT5LocalAttention, LongT5TransientGlobalAttention
    from transformers.models.umt5.modeling_umt5 import UMT5Attention

    why = (((LongT5LocalAttention, LongT5TransientGlobalAttention),
            "LongT5's encoder attends to a local window of keys (and to transient global tokens), a mask "
            "relpos does not apply"),
           ((UMT5Attention,), "UMT5 gives every layer its own relative_attention_bias table, where T5 (and this "
            "patch) shares the first layer's across its stack"))
    for module in model.modules():
        for classes, reason in why:
            if isinstance(module, classes):
                raise ValueError(f"relpos: patch_hf_t5: {type(model).__name__} is not patched: {reason}")


def _attentions(model: nn.Module) -> list:
    """(attention, the layer whose relative_attention_bias it uses) for every attention of
    every T5 stack in ``model``, all checked before any is patched."""
    from transformers.models.mt5.modeling_mt5 import MT5Attention
    from transformers.models.t5.modeling_t5 import T5Attention

    stacks = [m for m in model.modules() if hasattr(m, "block") and isinstance(m.block, nn.ModuleList)]
    found = []
    for stack in stacks:
        owner = None
        for block in stack.block:
            self_attention = getattr(block.layer[0], "SelfAttention", None)
            attentions = [self_attention]
            if len(block.layer) > 2 and hasattr(block.layer[1], "EncDecAttention"):
                attentions.append(block.layer[1].EncDecAttention)
            for attn in attentions:
                if not isinstance(attn, (T5Attention, MT5Attention)):
                    what = type(attn).__name__ if attn is not None else f"a {type(block.layer[0]).__name__} layer"
                    raise ValueError(f"relpos: patch_hf_t5: {type(model).__name__}: expected T5Attention or "
                                     f"MT5Attention, found {what}")
            if self_attention.has_relative_attention_bias:
                owner = owner or self_attention
            if owner is None:
                raise ValueError("relpos: patch_hf_t5: a stack's first layer has no relative_attention_bias")
            found += [(attn, owner) for attn in attentions]
    return found


def patch_hf_t5(model: nn.Module) -> nn.Module:
    """Replaces, in place, the attention of every T5 stack in ``model`` (T5Model,
    T5ForConditionalGeneration, T5EncoderModel and their MT5 versions) by
    relpos's; returns the model. UMT5 (a table per layer) and LongT5 (local attention)
    are refused by name, and nothing is patched then. Outputs, gradients and
    ``generate()`` (with its cache) equal the unpatched model's to rounding (in training,
    with attention dropout, in distribution: relpos draws its own masks); no
    ``output_attentions``. Each stack's self-attention layers use the first
    layer's ``relative_attention_bias``."""
    _refuse_relatives(model)
    attentions = _attentions(model)
    if not attentions:
        raise ValueError(f"relpos: patch_hf_t5: no T5 stack found in {type(model).__name__}")
    for attn, owner in attentions:
        # Plain attributes, not submodules: the owner is not registered twice (or in itself).
        object.__setattr__(attn, "_relpos_bias_owner", owner)
        object.__setattr__(attn, "forward", types.MethodType(_forward, attn))
    return model
