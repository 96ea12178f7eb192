"""patch_hf_t5 and patch_hf_deberta in training mode with the configs' attention dropout, against
transformers 5.23 itself (tiny random configs, no downloads):

* exactly: the patched model in train mode with attention dropout equals the unpatched one
  whose attention dropout is given relpos's masks (torch.nn.functional.dropout replaced, for
  the 4-D attention probabilities, by the mask of each relpos call's [seed, offset], drawn
  again after the same torch.manual_seed; hidden dropout is the identity in both runs),
  float64: logits, loss and every parameter's gradient;
* statistically: the mean of n patched attention layers' training outputs approaches the
  eval output at the 1/sqrt(n) rate (fixed seeds, stated tolerances);
* in training: a few dozen AdamW steps of a small T5 and a small DeBERTa classifier on a toy
  task with dropout 0.1 reach the unpatched models' loss within the spread over seeds;
* examples/deberta_finetune.py fine-tunes a tiny DeBERTa-v3-style classifier.
"""
from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import torch
from transformers import DebertaV2Config, DebertaV2ForSequenceClassification, T5Config, T5ForConditionalGeneration

import relpos
import relpos.torch as rt
from relpos._autograd import draw_dropout_rng, dropout_seed_offset

ROOT = Path(__file__).resolve().parents[2]


def t5_config(dropout: float, **kw):
    return T5Config(vocab_size=24, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
                    relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=dropout,
                    decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, attn_implementation="eager", **kw)


def deberta_config(attention_dropout: float, hidden_dropout: float = 0.0):
    """DeBERTa-v3's attention (buckets, c2p and p2c, shared keys, normalised embeddings), tiny."""
    return DebertaV2Config(vocab_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=48, max_position_embeddings=64, relative_attention=True,
                           position_buckets=8, max_relative_positions=40, pos_att_type=["p2c", "c2p"],
                           share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
                           hidden_dropout_prob=hidden_dropout, attention_probs_dropout_prob=attention_dropout,
                           num_labels=2, type_vocab_size=0)


def pair(model_class, config, patch, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    plain = model_class(config).to(dtype)
    return plain, patch(copy.deepcopy(plain))


# ---- exactly: transformers' attention dropout given relpos's masks


def relpos_masks_for_transformers(monkeypatch, rngs, expected_p):
    """torch.nn.functional.dropout, for the rest of the test: the i-th 4-D input (attention
    probabilities (B, H, Lq, Lk), without a cache at positions from 0) is multiplied by the mask
    of rngs[i] and divided by 1 - p; any other input (hidden states) passes unchanged."""
    masks = iter(rngs)

    def dropout(x, p=0.5, training=True, inplace=False):
        if x.dim() != 4 or not training or p == 0:
            return x
        assert p == expected_p
        B, H, Lq, Lk = x.shape
        seed, offset = dropout_seed_offset(next(masks))
        keep = torch.from_numpy(relpos.dropout_mask(seed, offset, B, H, Lq, Lk, p))
        return x * keep / (1 - p)

    monkeypatch.setattr(torch.nn.functional, "dropout", dropout)


def train_step_results(model, batch):
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                    if p.grad is not None}


def assert_exactly_transformers_with_relpos_masks(monkeypatch, plain, patched, batch, p, calls):
    """patched's training step, then plain's with the masks of the `calls` rngs patched drew."""
    monkeypatch.setattr(torch.nn.functional, "dropout", lambda x, *a, **k: x)  # hidden dropout: identity
    torch.manual_seed(21)
    logits, loss, grads = train_step_results(patched.train(), batch)
    torch.manual_seed(21)
    rngs = [draw_dropout_rng("cpu") for _ in range(calls)]
    assert len({tuple(r.tolist()) for r in rngs}) == calls
    relpos_masks_for_transformers(monkeypatch, rngs, p)
    want_logits, want_loss, want_grads = train_step_results(plain.train(), batch)
    torch.testing.assert_close(logits, want_logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-12)
    assert grads.keys() == want_grads.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], want_grads[n], rtol=1e-9, atol=1e-11, msg=n)
    with torch.no_grad():  # dropout changed the step: the check has teeth
        assert not torch.allclose(logits, patched.eval()(**batch).logits, rtol=1e-3, atol=1e-3)


def test_t5_in_training_is_transformers_with_relpos_masks(monkeypatch):
    """Encoder self-attention (padded), decoder self-attention (causal) and cross-attention, two
    layers each: 2 + 2 * 2 relpos calls, in the order the model runs them."""
    plain, patched = pair(T5ForConditionalGeneration, t5_config(0.2), rt.patch_hf_t5)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 24, (2, 27), generator=g)
    mask = torch.ones(2, 27, dtype=torch.long)
    mask[1, -5:] = 0
    batch = dict(input_ids=ids, attention_mask=mask, labels=torch.randint(2, 24, (2, 9), generator=g))
    assert_exactly_transformers_with_relpos_masks(monkeypatch, plain, patched, batch, 0.2, calls=6)


def test_deberta_in_training_is_transformers_with_relpos_masks(monkeypatch):
    """Two layers, padding: the classifier reads the first token, so the padded query rows (the
    mean of the values in both, undropped in relpos's) reach neither the logits nor a gradient."""
    plain, patched = pair(DebertaV2ForSequenceClassification, deberta_config(0.2, 0.1), rt.patch_hf_deberta)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 24, (2, 30), generator=g)
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[1, 20:] = 0
    batch = dict(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1]))
    assert_exactly_transformers_with_relpos_masks(monkeypatch, plain, patched, batch, 0.2, calls=2)


def test_t5_train_mode_without_dropout_equals_transformers():
    plain, patched = pair(T5ForConditionalGeneration, t5_config(0.0), rt.patch_hf_t5)
    g = torch.Generator().manual_seed(3)
    batch = dict(input_ids=torch.randint(2, 24, (2, 27), generator=g),
                 labels=torch.randint(2, 24, (2, 9), generator=g))
    state = torch.get_rng_state()
    logits, loss, grads = train_step_results(patched.train(), batch)
    assert torch.equal(torch.get_rng_state(), state)  # dropout 0: nothing drawn
    want_logits, want_loss, want_grads = train_step_results(plain.train(), batch)
    torch.testing.assert_close(logits, want_logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-12)
    for n in want_grads:
        torch.testing.assert_close(grads[n], want_grads[n], rtol=1e-9, atol=1e-11, msg=n)


# ---- statistically: one attention layer is linear in its mask


def assert_mean_approaches(sample, exact, n=400):
    """The mean of n samples (independent masks) differs from ``exact`` by a mean of n zero-mean
    terms, whose size falls as 1/sqrt(n): with fixed seeds, the error at n must be at most 3/4 of
    that at n / 16 (expected ratio 1/4) and every entry within 4 standard errors."""
    with torch.no_grad():
        samples = torch.stack([sample() for _ in range(n)])
    err = {m: float((samples[:m].mean(0) - exact).square().mean().sqrt()) for m in (n // 16, n)}
    assert err[n] <= 0.75 * err[n // 16], err
    standard_error = samples.std(0) / math.sqrt(n)
    assert bool(((samples.mean(0) - exact).abs() <= 4 * standard_error + 1e-12).all())


def test_the_mean_of_t5_attention_in_training_approaches_its_eval_output():
    _, patched = pair(T5ForConditionalGeneration, t5_config(0.2), rt.patch_hf_t5)
    attn = patched.decoder.block[0].layer[0].SelfAttention
    hidden = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    causal = torch.tril(torch.ones(10, 10, dtype=torch.bool))[None, None]
    with torch.no_grad():
        exact = attn.eval()(hidden, mask=causal)[0]
    attn.train()
    torch.manual_seed(5)
    assert_mean_approaches(lambda: attn(hidden, mask=causal)[0], exact)


def test_the_mean_of_deberta_attention_in_training_approaches_its_eval_output():
    _, patched = pair(DebertaV2ForSequenceClassification, deberta_config(0.2), rt.patch_hf_deberta)
    layer = patched.deberta.encoder.layer[0].attention.self
    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(2, 12, 32, generator=g, dtype=torch.float64)
    rel = patched.deberta.encoder.get_rel_embedding()
    keep = torch.ones(2, 12, dtype=torch.bool)
    mask = keep[:, None, :, None] & keep[:, None, None, :]
    with torch.no_grad():
        exact = layer.eval()(hidden, mask, rel_embeddings=rel)[0]
    layer.train()
    torch.manual_seed(7)
    assert_mean_approaches(lambda: layer(hidden, mask, rel_embeddings=rel)[0], exact)


# ---- in training: the patched models learn as the unpatched ones

SEEDS = range(3)
STEPS = 24


def final_loss(model, batches, lr):
    """Mean training loss of the last 5 of STEPS AdamW steps over `batches` (cycled)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for step in range(STEPS):
        loss = model(**batches[step % len(batches)]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return sum(losses[-5:]) / 5, losses[0]


def assert_trains_as_transformers(model_class, config, patch, batches, lr):
    """Over SEEDS (each its initialisation and dropout draws), the patched model's mean final loss
    lies within the unpatched models' range of final losses widened by half its spread, and both
    learn (final loss below 3/4 of the first)."""
    finals = {"plain": [], "patched": []}
    for seed in SEEDS:
        plain, patched = pair(model_class, config, patch, seed=seed, dtype=torch.float32)
        for name, model in (("plain", plain), ("patched", patched)):
            torch.manual_seed(100 + seed)
            final, first = final_loss(model, batches, lr)
            assert final < 0.75 * first, (name, seed, first, final)
            finals[name].append(final)
    low, high = min(finals["plain"]), max(finals["plain"])
    margin = (high - low) / 2
    mean = sum(finals["patched"]) / len(SEEDS)
    assert low - margin <= mean <= high + margin, finals


def test_a_small_t5_trains_with_attention_dropout_as_transformers_does():
    """Reverse 8 tokens, dropout_rate 0.1 (attention and hidden)."""
    g = torch.Generator().manual_seed(8)
    batches = []
    for _ in range(4):
        ids = torch.randint(2, 24, (8, 8), generator=g)
        batches.append(dict(input_ids=ids, labels=ids.flip(1)))
    assert_trains_as_transformers(T5ForConditionalGeneration, t5_config(0.1), rt.patch_hf_t5, batches, 1e-2)


def test_a_small_deberta_classifier_trains_with_attention_dropout_as_transformers_does():
    """Whether token 2 occurs more often than token 3, sequences of 16 with padding; both
    dropout probabilities 0.1."""
    g = torch.Generator().manual_seed(9)
    batches = []
    for _ in range(4):
        ids = torch.randint(2, 6, (16, 16), generator=g)
        mask = (torch.arange(16) < torch.randint(10, 17, (16, 1), generator=g)).long()
        labels = (((ids == 2) & (mask == 1)).sum(1) > ((ids == 3) & (mask == 1)).sum(1)).long()
        batches.append(dict(input_ids=ids, attention_mask=mask, labels=labels))
    assert_trains_as_transformers(DebertaV2ForSequenceClassification, deberta_config(0.1, 0.1),
                                  rt.patch_hf_deberta, batches, 1e-2)


def test_the_deberta_fine_tuning_example_runs_at_a_tiny_size(tmp_path):
    """40 steps from scratch: the loss falls and held-out sentences are classified; the saved model
    then loads as a checkpoint (--model, with its tokenizer) and fine-tunes on."""
    def run(*args):
        subprocess.run([sys.executable, str(ROOT / "examples" / "deberta_finetune.py"), *args, "--json",
                        str(tmp_path / "run.json")], check=True, capture_output=True, timeout=300)
        return json.loads((tmp_path / "run.json").read_text())

    first = run("--steps", "40", "--save", str(tmp_path / "model"))
    assert first["patched"] and first["attention_dropout"] == 0.1 and len(first["losses"]) == 40
    assert sum(first["losses"][-5:]) < sum(first["losses"][:5])
    assert first["accuracy"] > 0.6
    again = run("--steps", "5", "--lr", "1e-4", "--model", str(tmp_path / "model"))
    assert again["patched"] and again["accuracy"] >= first["accuracy"] - 0.1
