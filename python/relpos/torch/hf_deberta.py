"""``patch_hf_deberta``: a Hugging Face DeBERTa-v2/v3 model's attention computed by relpos, in place.

Every ``DisentangledSelfAttention`` of the model (``DebertaV2Model`` and its task heads:
sequence and token classification, masked LM, ...) keeps its weights and its place; its
forward is replaced by one that projects q, k, v and the relative embeddings with the
layer's own linears, exactly as transformers does, and calls ``relpos.torch.attention``
with the DeBERTa scheme: the c2p and p2c scores come from the (H, 2 span, d) projected
tables inside the fused kernel instead of (B H, L, L) gathers. transformers' attention mask
(the outer product of the input mask) becomes relpos's key padding; a padded query row,
which transformers fills with the mean of every value (all its scores are the same minimum),
gets that mean too, so the patched model's outputs equal the unpatched one's everywhere.
In training, the layer's attention-probability dropout (``attention_probs_dropout_prob``,
the ``self.dropout`` transformers applies after the softmax) is relpos's ``dropout_p``;
a padded query row then gets the mean of the values undropped (dropout's expectation, where
transformers drops them too; such a row reaches no unpadded position's output).

Refused by name, with a ValueError at the call: ``output_attentions`` (relpos forms no
probability matrix), a mask that is not an outer product of a padding mask, relative
positions other than transformers' own, and DeBERTa v1 (``DebertaModel``: another
attention module).
"""
from __future__ import annotations

import types

import torch
from torch import nn

import relpos
from relpos.torch.functional import attention

__all__ = ["patch_hf_deberta"]


def _padding_of(mask: torch.Tensor, batch: int, length: int):
    """(query padded, key padded) (B, L) bool from transformers' mask, True = padded; None
    where nothing is; ValueError unless the mask is keep_i and keep_j."""
    if mask.dim() == 2:
        keep = mask.bool()
        return (None, None) if bool(keep.all()) else (~keep, ~keep)
    allowed = (mask if mask.dim() == 4 else mask[:, None]).bool()
    if allowed.shape[1] != 1 or allowed.shape[-2:] != (length, length):
        raise ValueError(f"relpos: patch_hf_deberta: expected a (B, 1, {length}, {length}) attention mask, "
                         f"got shape {tuple(mask.shape)}")
    allowed = allowed[:, 0].expand(batch, length, length)
    keep_keys, keep_queries = allowed.any(1), allowed.any(2)
    if not torch.equal(allowed, keep_queries[:, :, None] & keep_keys[:, None, :]):
        raise ValueError("relpos: patch_hf_deberta: the attention mask is not an outer product of a padding "
                         "mask; relpos cannot apply an arbitrary mask")
    if bool(keep_keys.all()) and bool(keep_queries.all()):
        return None, None
    return ~keep_queries, ~keep_keys


def _tables(attn, rel_embeddings):
    """The c2p and p2c tables (H, 2 span, d) as transformers projects them (None: no such term)."""
    if not attn.relative_attention or rel_embeddings is None:
        return None, None
    rows = attn.pos_dropout(rel_embeddings)[: 2 * attn.pos_ebd_size]
    heads, d = attn.num_attention_heads, attn.attention_head_size

    def table(term, shared, own):
        if term not in attn.pos_att_type:
            return None
        proj = shared if attn.share_att_key else getattr(attn, own)
        return proj(rows).view(rows.shape[0], heads, d).transpose(0, 1)

    return table("c2p", attn.key_proj, "pos_key_proj"), table("p2c", attn.query_proj, "pos_query_proj")


def _forward(self, hidden_states, attention_mask, output_attentions=False, query_states=None, relative_pos=None,
             rel_embeddings=None):
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    if output_attentions:
        raise ValueError("relpos: patch_hf_deberta: output_attentions is not served (relpos forms no attention "
                         "probabilities); call the model with output_attentions=False")
    # transformers applies self.dropout (nn.Dropout; StableDropout in older versions) to the probabilities.
    dropout = getattr(self.dropout, "p", getattr(self.dropout, "drop_prob", 0.0)) if self.dropout.training else 0.0
    queries = hidden_states if query_states is None else query_states
    B, Lq, Lk = queries.shape[0], queries.shape[1], hidden_states.shape[1]
    if Lq != Lk:
        raise ValueError("relpos: patch_hf_deberta: queries and keys of different lengths are not served "
                         "(transformers' own p2c fails for them)")
    heads, d = self.num_attention_heads, self.attention_head_size
    q = self.query_proj(queries).view(B, Lq, heads, d)
    k = self.key_proj(hidden_states).view(B, Lk, heads, d)
    v = self.value_proj(hidden_states).view(B, Lk, heads, d)
    c2p, p2c = _tables(self, rel_embeddings)
    scheme = None
    if c2p is not None or p2c is not None:
        if relative_pos is not None:  # as the encoder passes it: transformers' own, checked
            own = build_relative_position(queries, hidden_states, bucket_size=self.position_buckets,
                                          max_position=self.max_relative_positions)
            given = relative_pos.to(own.device).reshape(-1, Lq, Lk)
            if not torch.equal(given, own[0].expand_as(given)):
                raise ValueError("relpos: patch_hf_deberta: relative_pos differs from transformers' own relative "
                                 "positions; relpos computes those")
        scheme = relpos.DeBERTa(c2p=c2p, p2c=p2c, position_buckets=self.position_buckets,
                                max_relative_positions=self.max_relative_positions)
    padded_queries, padded_keys = _padding_of(attention_mask, B, Lq)
    # transformers divides by sqrt(d (1 + the terms pos_att_type names)), the root in float32, even
    # where relative_attention is off and no term is computed: given here for every layer.
    factor = 1 + ("c2p" in self.pos_att_type) + ("p2c" in self.pos_att_type)
    scale = 1.0 / float(torch.sqrt(torch.tensor(float(d), dtype=torch.float32) * factor))
    out = attention(q, k, v, scheme, key_padding=padded_keys, scale=scale, layout="blhd", dropout_p=dropout)
    if padded_queries is not None:  # every score of such a row is the same minimum: the mean of all values
        out = torch.where(padded_queries[:, :, None, None], v.mean(1, keepdim=True).expand_as(out), out)
    return out.reshape(B, Lq, heads * d), None


def patch_hf_deberta(model: nn.Module) -> nn.Module:
    """Computes every DeBERTa-v2/v3 attention of ``model`` with relpos, in place; returns
    ``model``. Its weights, outputs, loss and gradients stay transformers' (the module
    docstring lists what is refused)."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

    try:
        from transformers.models.deberta.modeling_deberta import DisentangledSelfAttention as DebertaV1Attention
    except ImportError:  # a transformers without DeBERTa v1
        DebertaV1Attention = ()
    patched = 0
    for name, module in model.named_modules():
        if DebertaV1Attention and isinstance(module, DebertaV1Attention):
            raise ValueError(f"relpos: patch_hf_deberta: {name} is DeBERTa v1's attention (DebertaModel), whose "
                             "projections and relative positions differ; only DeBERTa-v2/v3 is served")
        if isinstance(module, DisentangledSelfAttention):
            module.forward = types.MethodType(_forward, module)
            patched += 1
    if not patched:
        raise ValueError("relpos: patch_hf_deberta: the model has no DeBERTa-v2/v3 attention "
                         "(DisentangledSelfAttention)")
    return model
