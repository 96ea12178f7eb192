"""relpos position math against the upstream functions written in torch_oracle
(HF transformers' T5 _relative_position_bucket, the ALiBi paper's get_slopes)
and against T5's bucket formula evaluated exactly here."""
from __future__ import annotations

import decimal
import math
from decimal import Decimal

import numpy as np
import pytest
import torch

import relpos
from torch_oracle import alibi_paper_slopes, hf_relative_position_bucket

# (bidirectional, num_buckets, max_distance): T5's defaults for encoder and decoder,
# small and odd bucket counts, max_distance below, inside and far beyond the range.
T5_CONFIGS = [
    (True, 32, 128),
    (False, 32, 128),
    (True, 8, 20),
    (False, 16, 40),
    (True, 6, 9),
    (False, 2, 2),
    (True, 33, 100),
    (False, 7, 50),
    (True, 64, 1000),
    (False, 128, 256),
    (True, 4, 500),
    # configs where float32 and float64 logs truncate to different buckets (at r = +-8, 16, 64, ...)
    (True, 18, 128),
    (False, 9, 128),
    (True, 38, 288),
    (False, 19, 288),
    (True, 108, 125),
    (False, 83, 1000),
]
DISTANCES = list(range(-300, 301)) + [-10**6, -65537, -796, 796, 65537, 10**6, 2**31 + 5, -(2**40)]


def _f32(x) -> np.float32:
    return np.float32(x)


def _log_f32_correctly_rounded(x: np.float32) -> np.float32:
    """The float32 nearest to the exact natural log of x (x > 0), decided with
    50-digit decimal arithmetic among the float32 candidates around it."""
    with decimal.localcontext() as ctx:
        ctx.prec = 50
        exact = Decimal(float(x)).ln()
        guess = np.float32(float(exact))
        candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
        return min(candidates, key=lambda c: abs(Decimal(float(c)) - exact))


def t5_scaled_value(n: int, num_buckets_half: int, max_distance: int) -> np.float32:
    """HF's large-distance value before truncation, each step in float32 as PyTorch
    evaluates it, with the correctly rounded float32 log. n >= max_exact."""
    max_exact = num_buckets_half // 2
    ratio = _f32(_f32(n) / _f32(max_exact))
    return _f32(_f32(_log_f32_correctly_rounded(ratio) / _f32(math.log(max_distance / max_exact)))
                * _f32(num_buckets_half - max_exact))


def _bucket(r: int, bidirectional: bool, num_buckets: int, max_distance: int, scaled) -> int:
    """HF's bucketing with `scaled(n, num_buckets_half, max_distance)` for the value
    that is truncated beyond the exact range."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if r > 0 else 0
        n = abs(r)
    else:
        n = -min(r, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    return bucket + min(max_exact + int(scaled(n, num_buckets, max_distance)), num_buckets - 1)


def t5_bucket_exact(r: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """The bucket relpos promises on every CPU (docs/design.md, section 1)."""
    return _bucket(r, bidirectional, num_buckets, max_distance, t5_scaled_value)


def near_an_integer(r: int, bidirectional: bool, num_buckets: int, max_distance: int) -> bool:
    """Whether the float32 value HF truncates for distance r lies within 4 ulps of a
    (positive) integer: there upstream's bucket depends on how the platform rounds
    its float32 log (a log one ulp off moves the value by up to about 3 ulps through
    the division and the product that follow). (At n = max_exact the value is
    log(1) = 0 on every platform.)"""
    half = num_buckets // 2 if bidirectional else num_buckets
    n = abs(r) if bidirectional else -min(r, 0)
    if n <= half // 2:
        return False
    value = t5_scaled_value(n, half, max_distance)
    near = 4 * float(np.spacing(value))
    if half // 2 + math.floor(float(value) - near) >= half - 1:
        return False  # both sides of the boundary clamp to the last bucket
    return abs(float(value) - round(float(value))) <= near


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance", T5_CONFIGS,
                         ids=[f"{'bidir' if b else 'causal'}-nb{n}-md{m}" for b, n, m in T5_CONFIGS])
def test_t5_bucket_is_the_exactly_rounded_one(bidirectional, num_buckets, max_distance):
    got = [relpos.t5_bucket(x, bidirectional, num_buckets, max_distance) for x in DISTANCES]
    expected = [t5_bucket_exact(x, bidirectional, num_buckets, max_distance) for x in DISTANCES]
    wrong = [(x, g, e) for x, g, e in zip(DISTANCES, got, expected) if g != e]
    assert not wrong, f"(r, relpos, exact) differ at {wrong[:10]} ({len(wrong)} of {len(DISTANCES)})"
    # the buckets in use: every one of them is reached in this range for the defaults
    assert min(got) == 0 and max(got) <= num_buckets - 1
    if (num_buckets, max_distance) == (32, 128):  # the defaults reach every bucket but the first future one
        assert sorted(set(got)) == [b for b in range(32) if not (bidirectional and b == 16)]


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance", T5_CONFIGS,
                         ids=[f"{'bidir' if b else 'causal'}-nb{n}-md{m}" for b, n, m in T5_CONFIGS])
def test_t5_bucket_matches_hf_away_from_float32_boundaries(bidirectional, num_buckets, max_distance):
    compared = [x for x in DISTANCES if not near_an_integer(x, bidirectional, num_buckets, max_distance)]
    assert len(compared) >= 0.98 * len(DISTANCES)  # boundaries are rare: the comparison stays broad
    expected = hf_relative_position_bucket(torch.tensor(compared, dtype=torch.long), bidirectional=bidirectional,
                                           num_buckets=num_buckets, max_distance=max_distance).tolist()
    got = [relpos.t5_bucket(x, bidirectional, num_buckets, max_distance) for x in compared]
    wrong = [(x, g, e) for x, g, e in zip(compared, got, expected) if g != e]
    assert not wrong, f"(r, relpos, HF) differ at {wrong[:10]} ({len(wrong)} of {len(compared)})"


def test_t5_bucket_at_a_platform_dependent_boundary():
    """108 buckets, max_distance 125, r = 45: the scaled value is 35 - 2e-6, one ulp
    from 35. The correctly rounded float32 log(45/27) is 0.51082557 (bucket 35 + 54);
    a log one ulp up (PyTorch's vectorised AVX2 log) gives 36. relpos gives 35."""
    assert near_an_integer(45, True, 108, 125) and near_an_integer(-45, True, 108, 125)
    assert _log_f32_correctly_rounded(_f32(45 / 27)) == _f32(0.51082557)
    assert relpos.t5_bucket(-45, True, 108, 125) == 35 and relpos.t5_bucket(45, True, 108, 125) == 89


# Distances where glibc's float logf (up to 0.82 ulp off) gave another bucket than the
# correctly rounded log: (num_buckets, max_distance, r, the old logf bucket), causal.
LOGF_WAS_WRONG = [(179, 2607, -2161, 174), (195, 3192, -2081, 182), (242, 3005, -1285, 210),
                  (246, 3596, -2733, 236), (255, 3061, -2841, 252)]


@pytest.mark.parametrize("num_buckets,max_distance,r,old", LOGF_WAS_WRONG)
def test_t5_bucket_where_the_platform_float_log_is_off_by_an_ulp(num_buckets, max_distance, r, old):
    exact = t5_bucket_exact(r, False, num_buckets, max_distance)
    assert exact != old and near_an_integer(r, False, num_buckets, max_distance)
    assert relpos.t5_bucket(r, False, num_buckets, max_distance) == exact


@pytest.mark.parametrize("r", [-(2**63), 2**63 - 1, -(2**40) - 1])
def test_t5_bucket_of_extreme_distances_is_the_last_one(r):
    assert relpos.t5_bucket(r, True, 32, 128) == (31 if r > 0 else 15)
    assert relpos.t5_bucket(r, False, 32, 128) == (0 if r > 0 else 31)


def _bucket_float64(r: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """The same formula with a float64 log: what a port that forgets PyTorch's float32 would give."""
    def scaled(n, half, max_distance):
        max_exact = half // 2
        return math.log(n / max_exact) / math.log(max_distance / max_exact) * (half - max_exact)
    return _bucket(r, bidirectional, num_buckets, max_distance, scaled)


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance,distances", [
    (True, 18, 128, [-64, -16, -8, 8, 16, 64]),
    (False, 9, 128, [-64, -16, -8]),
    (True, 38, 288, [-144, -36, -18, 18, 36, 144]),
    (False, 83, 1000, [-796]),
], ids=["bidir-nb18-md128", "causal-nb9-md128", "bidir-nb38-md288", "causal-nb83-md1000"])
def test_t5_bucket_uses_float32_log(bidirectional, num_buckets, max_distance, distances):
    """At these distances log(n / max_exact) / log(max_distance / max_exact) is an integer in exact
    arithmetic; float32 and float64 round it to opposite sides. relpos follows upstream's float32
    (with the correctly rounded log), not a float64 port."""
    for r in distances:
        exact = t5_bucket_exact(r, bidirectional, num_buckets, max_distance)
        assert exact != _bucket_float64(r, bidirectional, num_buckets, max_distance), r
        assert relpos.t5_bucket(r, bidirectional, num_buckets, max_distance) == exact, r


@pytest.mark.parametrize("heads", range(1, 17))
def test_alibi_slopes_match_paper(heads):
    expected = alibi_paper_slopes(heads)
    got = relpos.alibi_slopes(heads)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64 and got.shape == (heads,)
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("heads", [24, 32, 48, 64, 96])
def test_alibi_slopes_match_paper_many_heads(heads):
    np.testing.assert_allclose(relpos.alibi_slopes(heads), alibi_paper_slopes(heads), rtol=1e-14, atol=0)


def test_alibi_slopes_known_values():
    """Paper values: 8 heads 1/2, 1/4, ..., 1/256; the first of n heads is 2^(-8/n) for n a power of two."""
    np.testing.assert_allclose(relpos.alibi_slopes(8), [2.0**-i for i in range(1, 9)], rtol=1e-15)
    for n in (1, 2, 4, 16, 32):
        assert math.isclose(relpos.alibi_slopes(n)[0], 2.0 ** (-8 / n), rel_tol=1e-15)


@pytest.mark.parametrize("heads", [0, -3, 2**20])
def test_alibi_slopes_reject_bad_head_counts(heads):
    with pytest.raises(ValueError, match="num_heads"):
        relpos.alibi_slopes(heads)


@pytest.mark.parametrize(
    "bidirectional, num_buckets, max_distance, argument",
    [(True, 2, 128, "num_buckets"), (False, 1, 128, "num_buckets"), (True, 32, 8, "max_distance")],
)
def test_t5_bucket_rejects_configs_without_buckets(bidirectional, num_buckets, max_distance, argument):
    with pytest.raises(ValueError, match=argument):
        relpos.t5_bucket(5, bidirectional, num_buckets, max_distance)
