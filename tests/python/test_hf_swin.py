"""relpos.torch.patch_hf_swin against transformers itself: tiny random Swin models (no
downloads), float64, eager attention. The patched model's outputs and every parameter's
gradient equal the unpatched model's to 1e-9: windows and shifted windows (their region masks
as segments), a feature map that pads its windows; what the patch refuses, refused by name."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import SwinConfig, SwinForImageClassification

import relpos.torch as rt
from hf_checks import assert_same_gradients, float64_softmax  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("float64_softmax")


def pair(image_size=32, seed=0):
    # patches of 4: an 8 x 8 map (10 x 10 at 40, padded to windows of 4), two stages of two
    # layers, the second of each shifted
    config = SwinConfig(image_size=image_size, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                        window_size=4, num_labels=3, attn_implementation="eager")
    torch.manual_seed(seed)
    upstream = SwinForImageClassification(config).double().eval()
    with torch.no_grad():  # transformers starts the tables at zero: give them values to check
        for name, p in upstream.named_parameters():
            if "relative_position_bias_table" in name:
                p.normal_(0, 0.5)
    return upstream, rt.patch_hf_swin(copy.deepcopy(upstream))


@pytest.mark.parametrize("image_size", [32, 40])
def test_the_patched_model_equals_transformers(image_size):
    upstream, ours = pair(image_size)
    pixels = torch.randn(2, 3, image_size, image_size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a, b = upstream(pixels).logits, ours(pixels).logits
    torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-10)
    a.square().sum().backward()
    b.square().sum().backward()
    assert_same_gradients(upstream, ours)
    table = ours.swin.encoder.layers[0].blocks[1].attention.relative_position_bias.relative_position_bias_table
    assert table.grad.abs().sum() > 0  # the shifted layer's table learns


def test_output_attentions_is_refused_by_name():
    _, ours = pair()
    with pytest.raises(ValueError, match="patch_hf_swin: output_attentions"):
        ours(torch.randn(1, 3, 32, 32, dtype=torch.float64), output_attentions=True)


def test_a_mask_that_is_not_of_regions_is_refused():
    _, ours = pair()
    attn = ours.swin.encoder.layers[0].blocks[0].attention
    mask = torch.zeros(1, 16, 16, dtype=torch.float64)
    mask[0, 0, 5] = -100.0  # not symmetric: no regions make it
    with pytest.raises(ValueError, match="patch_hf_swin: the attention mask is not a shifted window's mask"):
        attn(torch.randn(1, 16, 16, dtype=torch.float64), mask)


def test_a_model_without_swin_attention_is_refused():
    with pytest.raises(ValueError, match="patch_hf_swin: the model has no Swin window attention"):
        rt.patch_hf_swin(torch.nn.Linear(2, 2))
