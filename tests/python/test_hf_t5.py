"""relpos.torch.patch_hf_t5 against transformers itself: tiny random T5 models
(no downloads), float64, eager attention. The patched model's outputs and every
parameter's gradient equal the unpatched model's; generate() with the cache gives
the same tokens and scores. Training with attention dropout: test_hf_dropout.py."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import (MT5Config, MT5ForConditionalGeneration, T5Config, T5EncoderModel,
                          T5ForConditionalGeneration, UMT5Config, UMT5EncoderModel)

import relpos.torch as rt
from hf_checks import assert_same_gradients


def tiny_config(config_class=T5Config, **kw):
    return config_class(vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_decoder_layers=2, num_heads=4,
                    relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
                    decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, attn_implementation="eager", **kw)


def pair(cls, seed=0, config_class=T5Config):
    torch.manual_seed(seed)
    upstream = cls(tiny_config(config_class)).double().eval()
    ours = rt.patch_hf_t5(copy.deepcopy(upstream))
    return upstream, ours


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 40, (2, 27), generator=g)  # long enough for the logarithmic buckets
    mask = torch.ones(2, 27, dtype=torch.long)
    mask[1, -5:] = 0
    return ids, mask


def test_encoder_model():
    upstream, ours = pair(T5EncoderModel)
    ids, mask = inputs()
    a = upstream(input_ids=ids, attention_mask=mask).last_hidden_state
    b = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)
    dy = torch.randn_like(a)
    (a * dy).sum().backward()
    (b * dy).sum().backward()
    assert_same_gradients(upstream, ours)
    assert ours.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("cls,config_class", [(T5ForConditionalGeneration, T5Config),
                                              (MT5ForConditionalGeneration, MT5Config)], ids=["t5", "mt5"])
def test_encoder_decoder_loss_and_gradients(cls, config_class):
    upstream, ours = pair(cls, seed=2, config_class=config_class)
    ids, mask = inputs(3)
    labels = torch.randint(2, 40, (2, 11), generator=torch.Generator().manual_seed(4))
    a = upstream(input_ids=ids, attention_mask=mask, labels=labels)
    b = ours(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(b.logits, a.logits, rtol=1e-10, atol=1e-10)
    a.loss.backward()
    b.loss.backward()
    assert_same_gradients(upstream, ours)
    assert ours.decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.grad.abs().sum() > 0


def test_generate_with_the_cache():
    upstream, ours = pair(T5ForConditionalGeneration, seed=5)
    ids, mask = inputs(6)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, use_cache=True,
              return_dict_in_generate=True, output_scores=True)
    a, b = upstream.generate(**kw), ours.generate(**kw)
    assert torch.equal(a.sequences, b.sequences)
    for sa, sb in zip(a.scores, b.scores):
        torch.testing.assert_close(sb, sa, rtol=1e-9, atol=1e-9)


def test_unsupported_uses_are_refused():
    _, ours = pair(T5EncoderModel)
    ids, mask = inputs()
    with pytest.raises(ValueError, match="output_attentions"):
        ours(input_ids=ids, attention_mask=mask, output_attentions=True)
    with pytest.raises(ValueError, match="no T5 stack"):
        rt.patch_hf_t5(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="UMT5EncoderModel is not patched: UMT5 gives every layer its own"):
        rt.patch_hf_t5(UMT5EncoderModel(tiny_config(UMT5Config)))


def test_a_mask_relpos_cannot_apply_is_refused():
    _, ours = pair(T5EncoderModel)
    attn = ours.encoder.block[0].layer[0].SelfAttention
    hidden = torch.randn(1, 5, 16, dtype=torch.float64)
    holes = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    holes[0, 0, 2, 3] = False  # one query may not see one key: neither causal nor padding
    with pytest.raises(ValueError, match="not causal-plus-key-padding"):
        attn(hidden, mask=holes)


def test_a_bfloat16_model_runs_patched():
    """A T5 model in bfloat16 (model.to(torch.bfloat16)), patched: its encoder
    output and loss are the bfloat16 upstream model's within bfloat16's rounding
    of a 2-layer model, and every parameter gets a bfloat16 gradient."""
    torch.manual_seed(0)
    upstream = T5ForConditionalGeneration(tiny_config()).to(torch.bfloat16).eval()
    ours = rt.patch_hf_t5(copy.deepcopy(upstream))
    ids, mask = inputs()
    labels = ids[:, :9].contiguous()
    a = upstream(input_ids=ids, attention_mask=mask, labels=labels)
    b = ours(input_ids=ids, attention_mask=mask, labels=labels)
    assert b.logits.dtype == torch.bfloat16
    torch.testing.assert_close(b.logits.float(), a.logits.float(), rtol=0, atol=0.1)
    torch.testing.assert_close(b.loss.float(), a.loss.float(), rtol=0.02, atol=0.02)
    b.loss.backward()
    for name, p in ours.named_parameters():
        assert p.grad is None or p.grad.dtype == torch.bfloat16, name
    assert ours.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.grad.abs().sum() > 0
