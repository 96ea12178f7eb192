"""NaN and infinity through relpos.torch.attention, in float32, bfloat16 and
float16, for every algorithm that serves the scheme: a key hidden by the mask
(key padding, or in the future under a causal mask) contributes nothing,
whatever its k and v hold (an uninitialised slot of a KV cache masked as
padding must not turn a batch into NaN), and a NaN in a visible logit, a
query or a parameter shows in exactly the rows that depend on it, as in
exact arithmetic (it must not become a probability of 0).

Each case runs twice, clean and poisoned, with the same dtype and algorithm;
what does not depend on the poison must equal the clean run (the same
arithmetic but for the order of a few sums), what does must be non-finite."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import relpos
import relpos.torch as rt
from harness import Case, make_problem

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ALGORITHMS = {"none": ["fused", "gather", "reference"],
              "shaw": ["fused", "gather", "split", "generalized_skew", "reference"],
              "t5": ["fused", "gather"], "xl": ["fused", "generalized_skew"], "rope": ["fused", "gather"]}
CASES = [
    Case("shaw_kv", "shaw", B=2, H=2, Lq=150, Lk=150, d=16, opts={"k": 4}),
    Case("t5", "t5", B=2, H=2, Lq=150, Lk=150, d=16, opts={"num_buckets": 16, "max_distance": 64}),
    Case("xl", "xl", B=2, H=2, Lq=150, Lk=150, d=16, opts={"pos_dim": 8}),
    Case("rope", "rope", B=2, H=2, Lq=150, Lk=150, d=16),
    Case("none", "none", B=2, H=2, Lq=150, Lk=150, d=16),
]
PAIRS = [(c, a) for c in CASES for a in ALGORITHMS[c.scheme]]


def _tol(dtype):
    return 1e-5 if dtype == torch.float32 else 2e-2


def _run(pb, dtype, algorithm, *, causal, key_padding=None, poison=None, params=None):
    """out, lse and the gradients of q, k, v and the scheme's tensors, after poison(q, k, v, dout, params)."""
    t = {n: torch.tensor(getattr(pb, n), dtype=dtype) for n in ("q", "k", "v", "dout")}
    prm = {n: torch.tensor(a, dtype=dtype) for n, a in pb.params.items()}
    if poison:
        poison(t, prm)
    for x in (t["q"], t["k"], t["v"], *prm.values()):
        x.requires_grad_(True)
    out, lse = rt.attention(t["q"], t["k"], t["v"], pb.scheme(params=prm), causal=causal, key_padding=key_padding,
                            algorithm=algorithm, return_lse=True)
    out.backward(t["dout"])
    grads = {n: t[n].grad.float() for n in ("q", "k", "v")} | {n: p.grad.float() for n, p in prm.items()}
    return out.detach().float(), lse.float(), grads


def _same(got, want, tol, what):
    assert torch.isfinite(got).all(), f"{what}: {int((~torch.isfinite(got)).sum())} non-finite values"
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case,algorithm", PAIRS, ids=[f"{c.id}-{a}" for c, a in PAIRS])
@pytest.mark.parametrize("special", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_causally_hidden_key_reaches_no_earlier_row(case, algorithm, dtype, special):
    pb, j = make_problem(case), 100  # key 100 of batch 0, head 1: rows 0..99 cannot see it

    def poison(t, _):
        t["v"][0, 1, j] = special
        if special != special:  # NaN: k too
            t["k"][0, 1, j] = special

    clean = _run(pb, dtype, algorithm, causal=True)
    out, lse, grads = _run(pb, dtype, algorithm, causal=True, poison=poison)
    tol = _tol(dtype)
    _same(out[0, 1, :j], clean[0][0, 1, :j], tol, "out of rows that cannot see the key")
    _same(lse[0, 1, :j], clean[1][0, 1, :j], tol, "lse of rows that cannot see the key")
    _same(grads["q"][0, 1, :j], clean[2]["q"][0, 1, :j], tol, "dq of rows that cannot see the key")
    assert (~torch.isfinite(out[0, 1, j:])).any(dim=-1).all(), "a row that sees the key came out finite"
    for b, h in ((0, 0), (1, 0), (1, 1)):  # other heads: untouched
        _same(out[b, h], clean[0][b, h], tol, f"out of head ({b}, {h})")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case,algorithm", PAIRS, ids=[f"{c.id}-{a}" for c, a in PAIRS])
@pytest.mark.parametrize("causal", [False, True], ids=["padding", "causal_padding"])
def test_padded_keys_holding_nan_and_inf_change_nothing(case, algorithm, dtype, causal):
    pb = make_problem(case)
    padding = torch.zeros(case.B, case.Lk, dtype=torch.bool)
    padding[0, 140:] = True  # the cache's unused slots
    padding[1, 3::7] = True

    def poison(t, _):
        t["k"][padding[:, None, :, None].expand_as(t["k"])] = float("nan")
        t["v"][padding[:, None, :, None].expand_as(t["v"])] = float("inf")

    clean = _run(pb, dtype, algorithm, causal=causal, key_padding=padding)
    out, lse, grads = _run(pb, dtype, algorithm, causal=causal, key_padding=padding, poison=poison)
    tol = _tol(dtype)
    _same(out, clean[0], tol, "out")
    _same(lse, clean[1], tol, "lse")
    for name, g in grads.items():
        _same(g, clean[2][name], tol, f"d{name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("algorithm", ALGORITHMS["shaw"])
def test_a_nan_logit_makes_every_row_that_sees_it_nan(algorithm, dtype):
    """Shaw's key table row of distance 0, seen by every query: every row is NaN,
    row 0 (whose only key it is) included, as in float64, not zeros with lse -inf."""
    case = Case("shaw_small", "shaw", B=1, H=1, Lq=16, Lk=16, d=8, opts={"k": 2})
    pb = make_problem(case)

    def poison(_, prm):
        prm["shaw_wk"][2, 1] = float("nan")

    out, lse, grads = _run(pb, dtype, algorithm, causal=True, poison=poison)
    assert torch.isnan(out).all(dim=-1).all(), f"{int(torch.isfinite(out).all(dim=-1).sum())} finite rows"
    assert torch.isnan(lse).all()
    exact, _, _ = _run(pb, torch.float64, "reference", causal=True, poison=poison)
    assert torch.isnan(exact).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case,algorithm", PAIRS, ids=[f"{c.id}-{a}" for c, a in PAIRS])
def test_a_nan_query_poisons_its_row_and_the_keys_it_sees_only(case, algorithm, dtype):
    pb, i = make_problem(case), 60

    def poison(t, _):
        t["q"][0, 1, i] = float("nan")

    clean = _run(pb, dtype, algorithm, causal=True)
    out, lse, grads = _run(pb, dtype, algorithm, causal=True, poison=poison)
    tol = _tol(dtype)
    assert torch.isnan(out[0, 1, i]).all() and torch.isnan(lse[0, 1, i])
    rows = torch.arange(case.Lq) != i
    _same(out[0, 1, rows], clean[0][0, 1, rows], tol, "out of the other rows")
    _same(grads["q"][0, 1, rows], clean[2]["q"][0, 1, rows], tol, "dq of the other rows")
    for name in ("k", "v"):  # keys after row i: it cannot see them
        _same(grads[name][0, 1, i + 1:], clean[2][name][0, 1, i + 1:], tol, f"d{name} of keys row {i} cannot see")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("algorithm", ["fused", "gather", "reference"])
@pytest.mark.parametrize("scheme", ["none", "t5", "alibi"])
def test_a_kv_cache_with_garbage_past_the_query_decodes_as_the_filled_part(scheme, algorithm, dtype):
    """One decoding step at position 100 against a cache of 300 slots whose slots
    101.. hold NaN and inf (never written): causal masking hides them, and the
    step equals the same step against the 101 filled slots alone."""
    rng = np.random.default_rng(5)
    H, d, filled, slots = 2, 16, 101, 300
    q = torch.tensor(rng.standard_normal((1, H, 1, d)), dtype=dtype)
    k = torch.tensor(rng.standard_normal((1, H, slots, d)), dtype=dtype)
    v = torch.tensor(rng.standard_normal((1, H, slots, d)), dtype=dtype)
    k[:, :, filled:] = float("nan")
    v[:, :, filled:] = float("inf")
    s = {"none": relpos.NoPosition(), "alibi": relpos.ALiBi(),
         "t5": relpos.T5(torch.tensor(rng.standard_normal((H, 32)), dtype=dtype), bidirectional=False)}[scheme]
    step = rt.attention(q, k, v, s, causal=True, q_offset=filled - 1, algorithm=algorithm)
    alone = rt.attention(q, k[:, :, :filled], v[:, :, :filled], s, causal=True, q_offset=filled - 1,
                         algorithm=algorithm)
    assert torch.isfinite(step).all()
    torch.testing.assert_close(step, alone, rtol=_tol(dtype), atol=_tol(dtype))
