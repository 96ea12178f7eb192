"""Attention dropout through the NumPy API (docs/design.md, "Attention dropout").

* ``relpos.dropout_mask`` against the counter layout restated with a NumPy Philox of
  the tests' own (torch_oracle.philox_keep), bit for bit, at offsets that cross 64-key
  blocks and 2^32, for seeds of all 64 bits;
* forward and every gradient with dropout against the float64 torch oracle applying
  that explicit mask, for every scheme x every algorithm serving it x masks;
* the mask keyed by global positions (a decode step draws the last row of the whole
  call's mask), the statistics of the output (its mean over seeds approaches the output
  without dropout at the 1/sqrt(n) rate), p = 0 bit for bit the call without dropout,
  and bad arguments refused by name.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import relpos
import torch_oracle
from harness import Case, assert_matches_oracle, ids, make_problem, run_oracle, run_relpos
from test_attention_vs_torch import expected_algorithms


@pytest.mark.parametrize("seed, offset, B, H, Lq, Lk, p, q_offset, k_offset", [
    (0, 0, 1, 1, 1, 64, 0.5, 0, 0),
    (1, 7, 2, 3, 5, 200, 0.1, 0, 0),
    (2**64 - 1, 2**32 - 1, 1, 2, 3, 150, 0.9, 17, 45),            # every bit of seed and offset
    (0x0123456789ABCDEF, 12345, 2, 2, 4, 130, 0.3, 2**32 - 2, 2**32 - 70),  # positions wrap past 2^32
    (99, 3, 3, 1, 2, 77, 0.25, 2**40, 5000),                      # the largest offset the kernels accept
])
def test_dropout_mask_is_the_counter_layout(seed, offset, B, H, Lq, Lk, p, q_offset, k_offset):
    got = relpos.dropout_mask(seed, offset, B, H, Lq, Lk, p, q_offset=q_offset, k_offset=k_offset)
    assert got.dtype == np.bool_ and got.shape == (B, H, Lq, Lk)
    expected = torch_oracle.philox_keep(seed, offset, B, H, Lq, Lk, p, q_offset, k_offset)
    assert np.array_equal(got, expected)
    assert 0 < got.mean() < 1


def test_dropout_mask_windows_are_windows_of_the_whole_mask():
    """Entries are keyed by global positions: a window of queries and keys (offsets)
    is that window of a larger call's mask; p = 0 keeps everything."""
    whole = relpos.dropout_mask(5, 9, 2, 3, 40, 300, 0.4)
    window = relpos.dropout_mask(5, 9, 2, 3, 7, 100, 0.4, q_offset=30, k_offset=130)
    assert np.array_equal(window, whole[:, :, 30:37, 130:230])
    assert relpos.dropout_mask(5, 9, 1, 1, 3, 4, 0.0).all()
    assert relpos.dropout_mask(5, 9, 0, 1, 3, 4, 0.5).shape == (0, 1, 3, 4)


C = Case
DROPOUT_CASES = [
    C("none-causal-d", "none", Lq=9, Lk=9, causal=True, dropout_p=0.3),
    C("none-cross-pad-d", "none", Lq=5, Lk=70, k_offset=3, padding="random", dropout_p=0.5),
    C("shaw-kv-causal-offsets-d", "shaw", Lq=9, Lk=9, q_offset=4, k_offset=4, causal=True, padding="random",
      opts=dict(k=2, beyond="zero", tables="kv", per_head=True), dropout_p=0.2),
    C("shaw-v-cross-d", "shaw", Lq=6, Lk=13, dv=5, q_offset=7, opts=dict(k=3, tables="v"), dropout_p=0.4),
    C("t5-bidir-d", "t5", Lq=11, Lk=11, scale=1.0, opts=dict(num_buckets=8, max_distance=20), dropout_p=0.1),
    C("t5-causal-decode-d", "t5", B=1, H=3, Lq=1, Lk=70, q_offset=69, causal=True,
      opts=dict(bidirectional=False, num_buckets=8, max_distance=20), dropout_p=0.3),
    C("alibi-learned-pad-d", "alibi", H=3, Lq=7, Lk=9, padding="batch", opts=dict(learn=True), dropout_p=0.3),
    C("kerple-causal-d", "kerple", H=2, Lq=8, Lk=8, causal=True, dropout_p=0.3),
    C("kerple_power-d", "kerple_power", H=2, Lq=6, Lk=10, k_offset=2, dropout_p=0.3),
    C("rope-interleaved-d", "rope", Lq=7, Lk=7, causal=True, opts=dict(style="interleaved", dims=8), dropout_p=0.3),
    C("xl-memory-causal-d", "xl", Lq=5, Lk=13, q_offset=8, causal=True, opts=dict(pos_dim=8, clamp_len=3),
      dropout_p=0.3),
    C("deberta-cross-pad-d", "deberta", H=3, Lq=5, Lk=13, q_offset=30, padding="random",
      opts=dict(position_buckets=8, max_relative_positions=40, per_head=True), dropout_p=0.3),
    C("deberta-multi-tile-d", "deberta", B=1, H=1, Lq=200, Lk=200, d=16, causal=True,
      opts=dict(position_buckets=16, max_relative_positions=64), dropout_p=0.2),
]
CASE_ALGORITHMS = [pytest.param(c, a, id=f"{c.id}-{a}") for c in DROPOUT_CASES
                   for a in sorted(expected_algorithms(c))]


@pytest.mark.parametrize("dtype", [pytest.param(np.float64, id="f64"), pytest.param(np.float32, id="f32")])
@pytest.mark.parametrize("case, algorithm", CASE_ALGORITHMS)
def test_dropout_matches_the_oracle_with_the_explicit_mask(case, algorithm, dtype):
    pb = make_problem(case)
    assert not pb.dropout_mask().all()
    assert_matches_oracle(run_relpos(pb, dtype, algorithm), run_oracle(pb, dtype), dtype)


def test_dropout_changes_out_but_not_lse():
    case = DROPOUT_CASES[0]
    with_dropout = run_relpos(make_problem(case), np.float64)
    without = run_relpos(make_problem(case.replace(dropout_p=0.0)), np.float64)
    assert np.array_equal(with_dropout["lse"], without["lse"])
    assert not np.allclose(with_dropout["out"], without["out"], atol=1e-3)


def test_a_decode_step_draws_the_last_row_of_the_whole_calls_mask():
    full = make_problem(C("decode-full", "alibi", B=2, H=2, Lq=40, Lk=40, causal=True, dropout_p=0.4))
    kw = full.call_kwargs()
    out, _ = relpos.forward(full.q, full.k, full.v, full.scheme(), **kw)
    step, _ = relpos.forward(full.q[:, :, -1:], full.k, full.v, full.scheme(), **{**kw, "q_offset": 39})
    np.testing.assert_allclose(step[:, :, 0], out[:, :, -1], rtol=1e-13, atol=1e-13)


def test_probability_zero_is_the_call_without_dropout_bit_for_bit():
    case = DROPOUT_CASES[2].replace(dropout_p=0.0)
    pb = make_problem(case)
    plain = run_relpos(pb, np.float32)
    kw = pb.call_kwargs()
    scheme = pb.scheme(np.float32)
    q, k, v = (x.astype(np.float32) for x in (pb.q, pb.k, pb.v))
    out, lse = relpos.forward(q, k, v, scheme, dropout_p=0.0, dropout_seed=123, dropout_offset=4, **kw)
    assert np.array_equal(out, plain["out"]) and np.array_equal(lse, plain["lse"])


def test_the_mean_over_seeds_approaches_the_output_without_dropout():
    """Inverted dropout is unbiased: the mean of n outputs with independent masks differs
    from the output without dropout by a sum of independent zero-mean terms, whose size
    falls as 1/sqrt(n). With a fixed set of seeds, the error at n = 400 must be at most
    3/sqrt(400/25) = 3/4 of that at n = 25 (the expected ratio is 1/4; seeds fixed, so the
    check repeats) and within 4 standard errors estimated from the samples."""
    pb = make_problem(C("mean-over-seeds", "t5", B=1, H=2, Lq=6, Lk=24, scale=1.0,
                        opts=dict(num_buckets=8, max_distance=20)))
    scheme, kw = pb.scheme(), pb.call_kwargs()
    exact, _ = relpos.forward(pb.q, pb.k, pb.v, scheme, **kw)
    samples = np.stack([relpos.forward(pb.q, pb.k, pb.v, scheme, dropout_p=0.3, dropout_seed=seed,
                                       dropout_offset=0, **kw)[0] for seed in range(400)])
    err = {n: float(np.sqrt(np.mean((samples[:n].mean(0) - exact) ** 2))) for n in (25, 400)}
    assert err[400] <= 0.75 * err[25], err
    standard_error = samples.std(0) / math.sqrt(400)
    assert np.all(np.abs(samples.mean(0) - exact) <= 4 * standard_error + 1e-12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(dropout_p=1.0), "dropout_p: must be a number in \\[0, 1\\)"),
    (dict(dropout_p=-0.1), "dropout_p: must be a number in \\[0, 1\\)"),
    (dict(dropout_p=float("nan")), "dropout_p: must be a number in \\[0, 1\\)"),
    (dict(dropout_p="0.1"), "dropout_p: must be a number"),
    (dict(dropout_p=0.1, dropout_seed=2**64), "dropout_seed: expected an integer in \\[0, 2\\^64\\)"),
    (dict(dropout_p=0.1, dropout_seed=1.5), "dropout_seed: expected an integer"),
    (dict(dropout_p=0.1, dropout_offset=2**32), "dropout_offset: must be in \\[0, 2\\^32\\)"),
    (dict(dropout_p=0.1, dropout_offset=-1), "dropout_offset: must be in \\[0, 2\\^32\\)"),
])
def test_bad_dropout_arguments_are_refused_by_name(kwargs, message):
    q = np.zeros((1, 1, 2, 4), np.float32)
    with pytest.raises(ValueError, match=message):
        relpos.forward(q, q, q, **kwargs)
    out, lse = relpos.forward(q, q, q)
    with pytest.raises(ValueError, match=message):
        relpos.backward(q, q, q, out, lse, out, **kwargs)
    with pytest.raises(ValueError, match=message):
        relpos.dropout_mask(kwargs.get("dropout_seed", 0), kwargs.get("dropout_offset", 0), 1, 1, 2, 2,
                            kwargs["dropout_p"])


def test_a_negative_int64_seed_is_its_twos_complement():
    """torch int64 tensors hold seeds as signed words: -1 is 2^64 - 1."""
    assert np.array_equal(relpos.dropout_mask(-1, 0, 1, 1, 3, 70, 0.5), relpos.dropout_mask(2**64 - 1, 0, 1, 1, 3,
                                                                                             70, 0.5))
