"""``patch_hf_swin``: a Hugging Face Swin model's window attention computed by relpos, in place.

Every ``SwinAttention`` of the model (``SwinModel`` and its task heads, ``SwinBackbone``) keeps
its weights and its place; its forward is replaced by one that projects q, k, v with the
layer's own linears, exactly as transformers does, and calls ``relpos.torch.attention`` with
the ``Swin`` scheme on the window's grid (windows are batch entries, as Swin lays them out):
the bias per head and 2-D offset is read from the (H, offsets) table inside the fused kernel,
not gathered into a (H, N, N) matrix. A shifted window's mask (transformers adds -100 between
cells of different regions of the rolled map) becomes relpos's segments, each cell's region an
id: exp(-100) is below float64's resolution of a softmax row's sum, so the numbers are
transformers'. Attention dropout in training is the layer's ``attention_probs_dropout_prob``.

Refused by name, with a ValueError at the call: ``output_attentions`` (relpos forms no
probability matrix), a mask that is not such a region mask, and windows whose cells are not the
bias table's window.
"""
from __future__ import annotations

import types

import torch
from torch import nn

import relpos
from relpos.torch.functional import attention
from relpos.torch.hf_sam import attentions_recorded

__all__ = ["patch_hf_swin"]


def _regions(mask: torch.Tensor) -> torch.Tensor:
    """Each cell's region id, (nW, N) int32, from transformers' shifted-window mask (nW, N, N)
    of 0 (same region) and -100: a cell's id is the first cell it may see. ValueError unless the
    mask is exactly the one of these ids."""
    same = mask == 0
    ids = same.to(torch.int8).argmax(-1).to(torch.int32)  # the first cell of each cell's region
    if not (torch.equal(same, ids[:, :, None] == ids[:, None, :]) and bool(((mask == 0) | (mask == -100)).all())):
        raise ValueError("relpos: patch_hf_swin: the attention mask is not a shifted window's mask of regions "
                         "(0 within a region, -100 across); relpos cannot apply an arbitrary mask")
    return ids


def _forward(self, hidden_states: torch.Tensor, attention_mask=None, **kwargs):
    if kwargs.get("output_attentions") or attentions_recorded():
        raise ValueError("relpos: patch_hf_swin: output_attentions is not served (relpos forms no attention "
                         "probabilities); call the model with output_attentions=False")
    batch_windows, cells, _ = hidden_states.shape
    bias = self.relative_position_bias
    window_height, window_width = (int(x) for x in bias.window_size)
    if cells != window_height * window_width:
        raise ValueError(f"relpos: patch_hf_swin: windows of {cells} cells, but the bias table is for "
                         f"{window_height} x {window_width} windows")
    shape = (batch_windows, cells, self.num_attention_heads, self.head_dim)
    q, k, v = (proj(hidden_states).view(shape) for proj in (self.q_proj, self.k_proj, self.v_proj))
    scheme = relpos.Swin(bias.relative_position_bias_table.t(), window_height=window_height,
                         window_width=window_width)
    segments = None
    if attention_mask is not None:  # (windows, N, N) of one image, the same for each image of the batch
        windows = attention_mask.shape[0]
        segments = _regions(attention_mask).repeat(batch_windows // windows, 1)
    dropout = self.attention_dropout if self.training else 0.0
    out = attention(q, k, v, scheme, scale=self.scaling, layout="blhd", segments=segments, dropout_p=dropout)
    return self.o_proj(out.reshape(batch_windows, cells, -1)), None


def patch_hf_swin(model: nn.Module) -> nn.Module:
    """Computes every Swin window attention of ``model`` with relpos, in place; returns ``model``.
    Its weights, outputs and gradients stay transformers' (the module docstring lists what is
    refused)."""
    from transformers.models.swin.modeling_swin import SwinAttention

    patched = 0
    for module in model.modules():
        if isinstance(module, SwinAttention):
            module.forward = types.MethodType(_forward, module)
            patched += 1
    if not patched:
        raise ValueError("relpos: patch_hf_swin: the model has no Swin window attention (SwinAttention)")
    return model
