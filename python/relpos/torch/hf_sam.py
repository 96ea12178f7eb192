"""``patch_hf_sam``: a Hugging Face SAM model's vision encoder attention computed by relpos, in place.

Every ``SamVisionAttention`` of the model (``SamModel``'s and ``SamVisionModel``'s image
encoder, its windowed and global layers; SAM-HQ's vision attention, which is SAM's) keeps its
weights and its place; its forward is replaced by one that projects q, k, v with the layer's
own linear, exactly as transformers does, and calls ``relpos.torch.attention`` with the
``SAM`` scheme on the layer's grid (a window of a windowed layer, which transformers lays out
as a batch entry, or the whole feature map of a global one): the decomposed terms
``q . rel_h[y] + q . rel_w[x]`` come from the two small tables inside the fused kernel instead
of a (B H, L, L) matrix of them. Tables trained for another grid are resized as transformers
resizes them (linear interpolation to 2 max(q, k) - 1 rows), before the call. Attention
dropout in training is the layer's ``config.attention_dropout``.

Refused by name, with a ValueError at the call: ``output_attentions=True`` (relpos forms no
probability matrix).
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

import relpos
from relpos.torch.functional import attention

__all__ = ["patch_hf_sam"]


def _resized(table: torch.Tensor, rows: int) -> torch.Tensor:
    """``table`` (n, d) with ``rows`` rows, as SAM's get_rel_pos resizes it (itself where n = rows:
    the interpolation to the same size is the identity)."""
    if table.shape[0] == rows:
        return table
    resized = F.interpolate(table.reshape(1, table.shape[0], -1).transpose(1, 2), size=rows, mode="linear")
    return resized.reshape(-1, rows).permute(1, 0)


def attentions_recorded() -> bool:
    """Whether the running model call records attention probabilities: transformers 5 collects
    them by hooks on the attention modules (utils/output_capturing.py), which no longer pass
    output_attentions down; its collector says what the call records."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # a transformers that passes output_attentions itself
        return False
    collected = _active_collector.get()
    return collected is not None and "attentions" in collected


def _forward(self, hidden_states: torch.Tensor, output_attentions=None):
    if output_attentions or attentions_recorded():
        raise ValueError("relpos: patch_hf_sam: output_attentions is not served (relpos forms no attention "
                         "probabilities); call the model with output_attentions=False")
    batch, height, width, _ = hidden_states.shape
    heads = self.num_attention_heads
    qkv = self.qkv(hidden_states).reshape(batch, height * width, 3, heads, -1)
    q, k, v = qkv.unbind(2)  # (B, L, heads, d) each
    scheme = None
    if self.use_rel_pos:
        scheme = relpos.SAM(_resized(self.rel_pos_h, 2 * height - 1), _resized(self.rel_pos_w, 2 * width - 1),
                            q_height=height, q_width=width)
    dropout = self.dropout if self.training else 0.0
    out = attention(q, k, v, scheme, scale=self.scale, layout="blhd", dropout_p=dropout)
    return self.proj(out.reshape(batch, height, width, -1)), None


def patch_hf_sam(model: nn.Module) -> nn.Module:
    """Computes every SAM vision-encoder attention of ``model`` with relpos, in place; returns
    ``model``. Its weights, outputs and gradients stay transformers' (the module docstring
    lists what is refused)."""
    from transformers.models.sam.modeling_sam import SamVisionAttention

    classes = [SamVisionAttention]
    try:
        from transformers.models.sam_hq.modeling_sam_hq import SamHQVisionAttention

        classes.append(SamHQVisionAttention)
    except ImportError:  # a transformers without SAM-HQ
        pass
    patched = 0
    for module in model.modules():
        if isinstance(module, tuple(classes)):
            module.forward = types.MethodType(_forward, module)
            patched += 1
    if not patched:
        raise ValueError("relpos: patch_hf_sam: the model has no SAM vision attention (SamVisionAttention)")
    return model
