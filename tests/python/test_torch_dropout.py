"""Attention dropout through relpos.torch (docs/torch.md, "Attention dropout"): rt.attention's
``dropout_p`` and RelativeMultiheadAttention's ``dropout``, on the C++ kernels.

* out and every gradient against the float64 oracle applying the explicit mask
  (relpos.dropout_mask of the call's seed and offset), every scheme, grouped-query heads,
  causal / padded / cross-attention with offsets, the rng given or drawn from torch's
  generator (captured by drawing it again after the same torch.manual_seed);
* torch.manual_seed repeats a call; p = 0 draws nothing and is the call without dropout,
  bit for bit; lse is the softmax's; a decode step draws the last row of the whole mask;
* the module drops in training only, as nn.MultiheadAttention;
* bad dropout_p, rng and module dropout refused by name.
"""
from __future__ import annotations

import math

import pytest
import torch

import relpos
import relpos.torch as rt
import torch_oracle
from relpos._autograd import draw_dropout_rng, dropout_seed_offset
from test_gqa import SCHEMES, inputs, record

P = 0.3


def oracle_mask(rng, B, H, Lq, Lk, p, q_offset=0, k_offset=0):
    seed, offset = dropout_seed_offset(rng)
    return torch.from_numpy(relpos.dropout_mask(seed, offset, B, H, Lq, Lk, p, q_offset=q_offset, k_offset=k_offset))


def oracle(q, k, v, name, opts, params, rng, p, **call):
    """torch_oracle.attention with the call's explicit mask, k and v repeated per query head."""
    H, Lq, Lk = q.shape[1], q.shape[2], k.shape[2]
    q_offset = call.get("q_offset", 0)
    q_offset = call.get("k_offset", 0) + Lk - Lq if q_offset == "end" else q_offset
    mask = oracle_mask(rng, q.shape[0], H, Lq, Lk, p, q_offset, call.get("k_offset", 0))
    group = H // k.shape[1]
    return torch_oracle.attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), name, opts, params,
                                  **{**call, "q_offset": q_offset}, dropout_mask=mask, dropout_p=p)[0]


def out_and_grads(out, tensors):
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    return [out.detach(), *torch.autograd.grad(out, tensors, dout)]


CALLS = {  # (L, hkv, call options)
    "causal-padded": (13, 2, dict(causal=True, pad=True, q_offset=3, k_offset=3)),
    "cross-end": (9, 1, dict(lq=4, q_offset="end", k_offset=70)),  # keys across a 64-key block
}


@pytest.mark.parametrize("given", [True, False], ids=["rng-given", "rng-drawn"])
@pytest.mark.parametrize("call", CALLS, ids=list(CALLS))
@pytest.mark.parametrize("name,opts,shapes", SCHEMES, ids=[s[0] for s in SCHEMES])
def test_dropout_matches_the_oracle_with_the_explicit_mask(name, opts, shapes, call, given):
    L, hkv, options = CALLS[call]
    q, k, v, params = inputs(name, shapes, hkv, L, seed=len(name))
    options = dict(options)
    q = q[:, :, -options.pop("lq", L):].detach().requires_grad_()
    pad = options.pop("pad", False)
    if pad:
        options["key_padding"] = torch.zeros(q.shape[0], L, dtype=torch.bool)
        options["key_padding"][1, 2:5] = True
    tensors = [q, k, v, *params.values()]
    if given:
        rng = torch.tensor([-0x0123456789ABCDEF, 2**32 + 77])  # a negative seed word, an offset past 32 bits
        out = rt.attention(q, k, v, record(name, opts, params), dropout_p=P, dropout_rng=rng, **options)
    else:
        torch.manual_seed(11)
        rng = draw_dropout_rng("cpu")
        torch.manual_seed(11)
        out = rt.attention(q, k, v, record(name, opts, params), dropout_p=P, **options)
    got = out_and_grads(out, tensors)
    want = out_and_grads(oracle(q, k, v, name, opts, params, rng, P, **options), tensors)
    for what, a, b in zip(["out", "dq", "dk", "dv", *params], got, want):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12, msg=f"{name} {call}: {what}")
    assert not torch.allclose(got[0], rt.attention(q, k, v, record(name, opts, params), **options).detach())


def small_call(seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 4, 11, 8, generator=g, requires_grad=True) for _ in range(3))
    table = torch.randn(4, 8, generator=g, requires_grad=True)

    def run(**options):
        out = rt.attention(q, k, v, relpos.T5(table, bidirectional=False), causal=True, **kw, **options)
        return out_and_grads(out, [q, k, v, table])
    return run


def test_torch_manual_seed_repeats_a_call():
    run = small_call()
    torch.manual_seed(3)
    first = run(dropout_p=P)
    torch.manual_seed(3)
    again = run(dropout_p=P)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    other = run(dropout_p=P)  # the generator has moved on: another mask
    assert not torch.equal(first[0], other[0])


def test_probability_zero_draws_nothing_and_is_the_call_without_dropout():
    run = small_call()
    plain = run()
    state = torch.get_rng_state()
    zero = run(dropout_p=0.0)
    ignored = run(dropout_p=0, dropout_rng=torch.tensor([1, 2]))
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(plain, zero, ignored))


def test_lse_is_the_softmaxs():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(3))
    _, lse = rt.attention(q, k, v, relpos.ALiBi(), causal=True, return_lse=True)
    out, lse_dropped = rt.attention(q, k, v, relpos.ALiBi(), causal=True, return_lse=True, dropout_p=0.5)
    assert torch.equal(lse, lse_dropped)
    assert not torch.equal(out, rt.attention(q, k, v, relpos.ALiBi(), causal=True))


def test_a_decode_step_draws_the_last_row_of_the_whole_calls_mask():
    """Keyed by absolute positions: one query at the end of a KV cache meets the mask entries the
    whole sequence's last query met."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 40, 8, generator=g) for _ in range(3))
    scheme, rng = relpos.ALiBi(), torch.tensor([5, 9])
    whole = rt.attention(q, k, v, scheme, causal=True, dropout_p=0.4, dropout_rng=rng)
    step = rt.attention(q[:, :, -1:], k, v, scheme, causal=True, q_offset="end", dropout_p=0.4, dropout_rng=rng)
    torch.testing.assert_close(step[:, :, 0], whole[:, :, -1], rtol=1e-13, atol=1e-13)


def test_the_module_drops_in_training_only():
    """nn.MultiheadAttention's convention: ``dropout`` applies in train mode; in eval mode the
    module is the one without dropout, bit for bit, and draws nothing. In training its output is
    rt.attention's with the rng the call drew."""
    torch.manual_seed(0)
    m = rt.RelativeMultiheadAttention(16, 4, "t5", dropout=0.25, t5_bidirectional=False)
    plain = rt.RelativeMultiheadAttention(16, 4, "t5", t5_bidirectional=False)
    plain.load_state_dict(m.state_dict())
    x = torch.randn(2, 9, 16)
    m.eval()
    state = torch.get_rng_state()
    assert torch.equal(m(x, causal=True), plain(x, causal=True))
    assert torch.equal(torch.get_rng_state(), state)
    m.train()
    torch.manual_seed(4)
    rng = draw_dropout_rng("cpu")
    torch.manual_seed(4)
    y = m(x, causal=True)
    q, k, v = (m._heads(proj(x)) for proj in (m.q_proj, m.k_proj, m.v_proj))
    inner = rt.attention(q, k, v, m.position_scheme(), causal=True, dropout_p=0.25, dropout_rng=rng)
    torch.testing.assert_close(y, m.out_proj(inner.transpose(1, 2).flatten(2)), rtol=0, atol=0)
    assert not torch.allclose(y, plain(x, causal=True))
    y.square().sum().backward()
    assert m.t5_table.grad.abs().sum() > 0


def test_activation_checkpointing_recomputes_the_same_mask():
    """torch.utils.checkpoint restores the generator before recomputing the forward, so the
    recomputed call draws the rng the first one drew: the gradients are those of the plain call."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    m = rt.RelativeMultiheadAttention(16, 4, "shaw", dropout=0.3, shaw_k=3).train()
    x = torch.randn(2, 9, 16, requires_grad=True)
    results = []
    for run in (lambda: m(x, causal=True), lambda: checkpoint(m, x, causal=True, use_reentrant=False)):
        m.zero_grad()
        x.grad = None
        torch.manual_seed(9)
        y = run()
        y.square().sum().backward()
        results.append([y.detach(), x.grad, *(p.grad for p in m.parameters())])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_the_mean_of_many_module_calls_approaches_the_call_without_dropout():
    """Inverted dropout is unbiased and the module is linear in the mask: the mean of n training
    calls differs from the eval call by a mean of n independent zero-mean terms, whose size falls
    as 1/sqrt(n). Seeds fixed: at n = 400 the error must be at most 3/4 of that at n = 25 (the
    expected ratio is 1/4) and every entry within 4 standard errors of the eval call."""
    torch.manual_seed(0)
    m = rt.RelativeMultiheadAttention(16, 4, "alibi", dropout=0.2)
    x = torch.randn(1, 12, 16)
    with torch.no_grad():
        exact = m.eval()(x, causal=True)
        m.train()
        torch.manual_seed(1)
        samples = torch.stack([m(x, causal=True) for _ in range(400)])
    err = {n: float((samples[:n].mean(0) - exact).square().mean().sqrt()) for n in (25, 400)}
    assert err[400] <= 0.75 * err[25], err
    standard_error = samples.std(0) / math.sqrt(400)
    assert bool(((samples.mean(0) - exact).abs() <= 4 * standard_error + 1e-12).all())


@pytest.mark.parametrize("kwargs, message", [
    (dict(dropout_p=1.0), r"^relpos: dropout_p: must be a number in \[0, 1\)"),
    (dict(dropout_p=-0.1), r"^relpos: dropout_p: must be a number in \[0, 1\)"),
    (dict(dropout_p=float("nan")), r"^relpos: dropout_p: must be a number in \[0, 1\)"),
    (dict(dropout_p="0.1"), r"^relpos: dropout_p: must be a number"),
    (dict(dropout_p=True), r"^relpos: dropout_p: must be a number"),
    (dict(dropout_p=0.1, dropout_rng=torch.tensor([1.0, 2.0])), r"^relpos: dropout_rng: expected an int64 tensor"),
    (dict(dropout_p=0.1, dropout_rng=torch.tensor([1, 2, 3])), r"^relpos: dropout_rng: expected an int64 tensor"),
    (dict(dropout_p=0.1, dropout_rng=[1, 2]), r"^relpos: dropout_rng: expected an int64 tensor .* got list"),
    (dict(dropout_p=0.1, dropout_rng=torch.tensor([1, 2], device="meta")), r"^relpos: dropout_rng: .* on meta"),
])
def test_bad_dropout_arguments_are_refused_by_name(kwargs, message):
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match=message):
        rt.attention(q, q, q, **kwargs)


@pytest.mark.parametrize("dropout", [1.0, -0.5, float("nan"), "0.1"])
def test_the_module_refuses_a_bad_dropout_by_name(dropout):
    with pytest.raises(ValueError, match=r"^relpos: dropout: "):
        rt.RelativeMultiheadAttention(8, 2, dropout=dropout)
