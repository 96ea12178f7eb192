"""Segments through the NumPy API (``segments=``: a query sees the keys of its own segment):
every scheme x every algorithm serving it against the float64 torch oracle with the mask
written out, one array or a pair of them, and what is refused, by name."""
from __future__ import annotations

import numpy as np
import pytest

import relpos
from harness import Case, assert_matches_oracle, make_problem, run_oracle, run_relpos
from test_attention_vs_torch import expected_algorithms

C = Case
SEGMENT_CASES = [
    C("none-packed-causal", "none", Lq=12, Lk=12, causal=True, segment_length=5),
    C("shaw-packed-cross", "shaw", Lq=6, Lk=13, q_offset=7, segment_length=4, opts=dict(k=3, tables="kv")),
    C("t5-packed-pad", "t5", Lq=11, Lk=11, scale=1.0, padding="random", segment_length=3,
      opts=dict(num_buckets=8, max_distance=20)),
    C("alibi-packed-dropout", "alibi", Lq=9, Lk=9, causal=True, segment_length=4, dropout_p=0.3),
    C("rope-packed", "rope", Lq=8, Lk=8, segment_length=3, opts=dict(style="interleaved", dims=8)),
    C("xl-packed-memory", "xl", Lq=5, Lk=13, q_offset=8, causal=True, segment_length=6, opts=dict(pos_dim=8)),
    C("deberta-packed", "deberta", Lq=10, Lk=10, segment_length=4,
      opts=dict(position_buckets=8, max_relative_positions=20)),
    C("swin-3x4-regions", "swin", H=3, Lq=12, Lk=12, segment_length=5, opts=dict(window_height=3, window_width=4)),
    C("sam-multi-tile-packed", "sam", B=1, Lq=196, Lk=196, d=16, segment_length=60,
      opts=dict(q_height=14, q_width=14)),
]
CASE_ALGORITHMS = [pytest.param(c, a, id=f"{c.id}-{a}") for c in SEGMENT_CASES for a in sorted(expected_algorithms(c))]


@pytest.mark.parametrize("dtype", [pytest.param(np.float64, id="f64"), pytest.param(np.float32, id="f32")])
@pytest.mark.parametrize("case, algorithm", CASE_ALGORITHMS)
def test_segments_match_the_oracle(case, algorithm, dtype):
    pb = make_problem(case)
    assert_matches_oracle(run_relpos(pb, dtype, algorithm), run_oracle(pb, dtype), dtype)


def test_one_array_is_both_and_each_segment_is_its_own_call():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 9, 8)) for _ in range(3))
    ids = np.array([[0, 0, 0, 0, 7, 7, 7, 7, 7]])
    out, _ = relpos.forward(q, k, v, segments=ids)
    pair, _ = relpos.forward(q, k, v, segments=(ids, ids.astype(np.uint8)))
    assert np.array_equal(out, pair)
    for rows in (slice(0, 4), slice(4, 9)):
        alone, _ = relpos.forward(q[:, :, rows], k[:, :, rows], v[:, :, rows])
        np.testing.assert_allclose(out[:, :, rows], alone, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("segments, message", [
    (np.zeros((1, 5), np.int32), "segments: one array of ids serves Lq == Lk only"),
    ((np.zeros((1, 4)),) * 2, "q_segments: expected integer segment ids"),
    ((np.zeros((1, 4), np.int64) + 2**31,) * 2, "q_segments: segment ids must fit in int32"),
    ((np.zeros((1, 4), np.int32), np.zeros((1, 6), np.int32)), "k_segments: expected shape"),
    ((np.zeros((1, 4), np.int32),) * 3, "segments: expected an array of ids or a pair"),
])
def test_bad_segments_are_refused_by_name(segments, message):
    q, k = np.zeros((1, 1, 4, 2)), np.zeros((1, 1, 5, 2))
    with pytest.raises(ValueError, match=message):
        relpos.forward(q, k, k, segments=segments)


def test_a_key_that_is_not_finite_beside_segments_is_refused_unless_padded():
    q = np.zeros((1, 1, 4, 2))
    v = q.copy()
    v[0, 0, 3, 1] = np.nan
    ids = np.array([[0, 0, 1, 1]])
    with pytest.raises(ValueError, match="k, v: key 3 of batch row 0 holds a value that is not finite"):
        relpos.forward(q, q, v, segments=ids)
    out, _ = relpos.forward(q, q, v, segments=ids, key_padding=np.array([[0, 0, 0, 1]], bool))
    assert np.isfinite(out).all()


def test_the_torch_op_takes_segments_through_autograd_and_compile():
    import torch
    import relpos.torch as rt

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 10, 8, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))
    table = torch.randn(3, 8, dtype=torch.float64, generator=g, requires_grad=True)
    ids = torch.tensor([[0] * 4 + [1] * 6, [5] * 10])  # int64: the op takes int32 of them
    scheme = relpos.T5(table, max_distance=20)
    out = rt.attention(q, k, v, scheme, causal=True, segments=ids)
    out.square().sum().backward()
    expected, lse = relpos.forward(*(x.detach().numpy() for x in (q, k, v)), relpos.T5(table.detach().numpy(),
                                   max_distance=20), causal=True, segments=ids.numpy())
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-13, atol=1e-13)
    grads = relpos.backward(*(x.detach().numpy() for x in (q, k, v)), expected, lse, 2 * expected,
                            relpos.T5(table.detach().numpy(), max_distance=20), causal=True, segments=ids.numpy())
    for name, x in (("q", q), ("k", k), ("v", v), ("t5_table", table)):
        np.testing.assert_allclose(x.grad.numpy(), grads[name], rtol=1e-12, atol=1e-12, err_msg=name)
    compiled = torch.compile(lambda q, k, v: rt.attention(q, k, v, scheme, causal=True, segments=ids),
                             backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), out, rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="q_segments: expected a tensor of integer segment ids"):
        rt.attention(q, k, v, segments=ids.double())
