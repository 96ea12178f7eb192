"""relpos position math against the upstream functions written in torch_oracle:
HF transformers' T5 _relative_position_bucket and the ALiBi paper's get_slopes."""
from __future__ import annotations

import math

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


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance", T5_CONFIGS,
                         ids=[f"{'bidir' if b else 'causal'}-nb{n}-md{m}" for b, n, m in T5_CONFIGS])
def test_t5_bucket_matches_hf(bidirectional, num_buckets, max_distance):
    r = torch.tensor(DISTANCES, dtype=torch.long)
    expected = hf_relative_position_bucket(r, bidirectional=bidirectional, num_buckets=num_buckets,
                                           max_distance=max_distance).tolist()
    got = [relpos.t5_bucket(int(x), bidirectional, num_buckets, max_distance) for x in DISTANCES]
    wrong = [(x, g, e) for x, g, e in zip(DISTANCES, got, expected) if g != e]
    assert not wrong, f"(r, relpos, HF) differ at {wrong[:10]} ({len(wrong)} of {len(DISTANCES)})"
    # the buckets in use: every one of them is reached in this range for the defaults
    assert min(got) == 0 and max(got) <= num_buckets - 1
    if (num_buckets, max_distance) == (32, 128):  # the defaults reach every bucket but the first future one
        assert sorted(set(got)) == [b for b in range(32) if not (bidirectional and b == 16)]


def _bucket_float64(r: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """The same formula with a float64 log: what a port that forgets PyTorch's float32 would give."""
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
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance,distances", [
    (True, 18, 128, [-64, -16, -8, 8, 16, 64]),
    (False, 9, 128, [-64, -16, -8]),
    (True, 38, 288, [-144, -36, -18, 18, 36, 144]),
    (False, 83, 1000, [-796]),
], ids=["bidir-nb18-md128", "causal-nb9-md128", "bidir-nb38-md288", "causal-nb83-md1000"])
def test_t5_bucket_uses_float32_log(bidirectional, num_buckets, max_distance, distances):
    """At these distances log(n / max_exact) / log(max_distance / max_exact) is an integer in exact
    arithmetic; float32 and float64 round it to opposite sides. relpos must follow HF (float32)."""
    for r in distances:
        hf = hf_relative_position_bucket(torch.tensor([r]), bidirectional, num_buckets, max_distance).item()
        assert hf != _bucket_float64(r, bidirectional, num_buckets, max_distance), r
        assert relpos.t5_bucket(r, bidirectional, num_buckets, max_distance) == hf, r


@pytest.mark.parametrize("heads", range(1, 17))
def test_alibi_slopes_match_paper(heads):
    expected = alibi_paper_slopes(heads)
    got = relpos.alibi_slopes(heads)
    assert len(got) == heads
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
