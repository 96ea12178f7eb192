"""relpos.torch.patch_hf_sam against transformers itself: tiny random SAM vision encoders (no
downloads), float64, eager attention. The patched encoder's outputs and every parameter's
gradient equal the unpatched encoder's to 1e-9: windowed layers (windows that pad the feature
map, and windows that tile it) and global layers, tables of the layer's grid and tables that
transformers resizes; what the patch refuses, refused by name."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import SamVisionConfig, SamVisionModel

import relpos.torch as rt
from hf_checks import assert_same_gradients, float64_softmax  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("float64_softmax")


def tiny_config(window_size=3, **kw):
    # a 32 x 32 image in patches of 4: an 8 x 8 feature map; windows of 3 pad it to 9 x 9
    return SamVisionConfig(hidden_size=32, output_channels=16, num_hidden_layers=3, num_attention_heads=4,
                           image_size=32, patch_size=4, window_size=window_size, global_attn_indexes=[1],
                           mlp_dim=48, attn_implementation="eager", **kw)


def pair(seed=0, **kw):
    torch.manual_seed(seed)
    upstream = SamVisionModel(tiny_config(**kw)).double().eval()
    with torch.no_grad():  # SAM's vision config draws weights of std 1e-10 and tables of zeros: give them values
        for name, p in upstream.named_parameters():
            if "rel_pos" in name:
                p.normal_(0, 0.5)
            elif p.dim() > 1:
                p.normal_(0, 0.2)
    return upstream, rt.patch_hf_sam(copy.deepcopy(upstream))


@pytest.mark.parametrize("window_size", [3, 4])  # 3 pads the 8 x 8 map to 9 x 9, 4 tiles it
def test_the_patched_encoder_equals_transformers(window_size):
    upstream, ours = pair(window_size=window_size)
    pixels = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a, b = upstream(pixels).last_hidden_state, ours(pixels).last_hidden_state
    torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-10)
    dy = torch.randn_like(a)
    (a * dy).sum().backward()
    (b * dy).sum().backward()
    assert_same_gradients(upstream, ours)
    layer = ours.vision_encoder.layers[1].attn  # the global layer's tables received their gradients
    assert layer.rel_pos_h.grad.abs().sum() > 0 and layer.rel_pos_w.grad.abs().sum() > 0


def test_tables_of_another_grid_are_resized_as_transformers_resizes_them():
    upstream, ours = pair(window_size=4)
    with torch.no_grad():  # the global layer's tables trained for a 6 x 6 map: 11 rows, resized to 15
        for model in (upstream, ours):
            attn = model.vision_encoder.layers[1].attn
            attn.rel_pos_h = torch.nn.Parameter(torch.randn(11, attn.rel_pos_h.shape[1], dtype=torch.float64,
                                                            generator=torch.Generator().manual_seed(3)))
            attn.rel_pos_w = torch.nn.Parameter(attn.rel_pos_h.detach().flip(0).clone())
    pixels = torch.randn(1, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(ours(pixels).last_hidden_state, upstream(pixels).last_hidden_state,
                               rtol=1e-9, atol=1e-10)


def test_output_attentions_is_refused_by_name():
    _, ours = pair()
    with pytest.raises(ValueError, match="patch_hf_sam: output_attentions"):
        ours(torch.randn(1, 3, 32, 32, dtype=torch.float64), output_attentions=True)


def test_a_model_without_sam_attention_is_refused():
    with pytest.raises(ValueError, match="patch_hf_sam: the model has no SAM vision attention"):
        rt.patch_hf_sam(torch.nn.Linear(2, 2))
