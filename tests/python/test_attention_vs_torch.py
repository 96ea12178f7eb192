"""relpos.forward / relpos.backward against the independent torch oracle (float64 autograd).

Every case compares out, lse and the gradients of q, k, v and every learnable
parameter of the scheme, in float64 (to ~1e-10) and float32 (against the float64
oracle, see harness.RTOL32), for every algorithm relpos offers.
"""
from __future__ import annotations

import numpy as np
import pytest

import relpos
from harness import Case, assert_close, assert_matches_oracle, ids, make_problem, run_oracle, run_relpos

DTYPES = [pytest.param(np.float64, id="f64"), pytest.param(np.float32, id="f32")]

C = Case
CASES = [
    # --- no position term -------------------------------------------------
    C("none-L1", "none", Lq=1, Lk=1),
    C("none-L7-d59-dv5", "none", B=3, H=1, d=59, dv=5),
    C("none-L97-d64-causal", "none", B=1, Lq=97, Lk=97, d=64, causal=True),
    C("none-cross5x13-pad", "none", Lq=5, Lk=13, padding="random"),
    C("none-scale0.3-uint8pad", "none", Lq=7, Lk=9, scale=0.3, padding="uint8"),
    # --- Shaw ---------------------------------------------------------------
    C("shaw-K-shared-k3-L7", "shaw", opts=dict(k=3, tables="k")),
    C("shaw-V-shared-k3-L7-dv5", "shaw", dv=5, opts=dict(k=3, tables="v")),
    C("shaw-KV-perhead-k16-L97-d64-causal", "shaw", B=1, Lq=97, Lk=97, d=64, causal=True,
      opts=dict(k=16, tables="kv", per_head=True)),
    C("shaw-KV-perhead-zero-k8-L97-d59", "shaw", B=1, Lq=97, Lk=97, d=59,
      opts=dict(k=8, beyond="zero", tables="kv", per_head=True)),
    C("shaw-KV-shared-zero-k4-cross5x13-endaligned-causal", "shaw", Lq=5, Lk=13, q_offset=8, causal=True,
      opts=dict(k=4, beyond="zero", tables="kv")),
    C("shaw-KV-shared-k0", "shaw", H=3, opts=dict(k=0, tables="kv")),
    C("shaw-KV-perhead-k2-L1-offsets", "shaw", Lq=1, Lk=1, q_offset=4, k_offset=1,
      opts=dict(k=2, tables="kv", per_head=True)),
    C("shaw-KV-perhead-k200-cross9x20-pad", "shaw", Lq=9, Lk=20, d=59, dv=7, k_offset=3, padding="random",
      opts=dict(k=200, tables="kv", per_head=True)),
    C("shaw-K-perhead-zero-k5-offsets-scale", "shaw", H=3, Lq=11, Lk=11, q_offset=2, k_offset=9, scale=0.7,
      opts=dict(k=5, beyond="zero", tables="k", per_head=True)),
    # --- T5 -------------------------------------------------------------------
    C("t5-bidir-nb32-md128-L97-d64", "t5", B=1, Lq=97, Lk=97, d=64, scale=1.0,
      opts=dict(bidirectional=True)),
    C("t5-causal-nb32-md128-L97-causal", "t5", B=1, Lq=97, Lk=97, d=59, scale=1.0, causal=True,
      opts=dict(bidirectional=False)),
    C("t5-bidir-nb8-md20-cross7x40-qoff300", "t5", H=3, Lq=7, Lk=40, q_offset=300, scale=1.0,
      opts=dict(bidirectional=True, num_buckets=8, max_distance=20)),
    C("t5-causalbuckets-nomask-nb16-md40-koff150", "t5", Lq=9, Lk=30, k_offset=150,
      opts=dict(bidirectional=False, num_buckets=16, max_distance=40)),
    C("t5-bidir-nb6-md9-pad", "t5", Lq=13, Lk=13, padding="random",
      opts=dict(bidirectional=True, num_buckets=6, max_distance=9)),
    C("t5-bidir-nb18-md128-float32-edges-L70", "t5", B=1, Lq=70, Lk=70, d=16, scale=1.0,
      opts=dict(bidirectional=True, num_buckets=18, max_distance=128)),
    C("t5-L1", "t5", Lq=1, Lk=1, opts=dict(bidirectional=True)),
    # --- ALiBi ---------------------------------------------------------------
    C("alibi-H3-paper-L97-d64-causal", "alibi", B=1, H=3, Lq=97, Lk=97, d=64, causal=True),
    C("alibi-H8-paper-L7", "alibi", B=1, H=8),
    C("alibi-H5-learned-cross5x13-pad", "alibi", H=5, Lq=5, Lk=13, padding="random", opts=dict(learn=True)),
    C("alibi-H6-learned-L97-d59-offsets", "alibi", B=1, H=6, Lq=97, Lk=97, d=59, q_offset=3, k_offset=40,
      opts=dict(learn=True)),
    C("alibi-H1-paper-L1", "alibi", H=1, Lq=1, Lk=1),
    C("kerple-H4-L7", "kerple", B=1, H=4),
    C("kerple-H3-L97-d64-causal-offsets", "kerple", B=1, H=3, Lq=97, Lk=97, d=64, causal=True, q_offset=5, k_offset=5),
    C("kerple-H5-cross5x13-pad", "kerple", H=5, Lq=5, Lk=13, padding="random", k_offset=20),
    C("kerple-H2-L300-multi-tile", "kerple", B=1, H=2, Lq=300, Lk=300, d=16, causal=True),
    C("kerple_power-H4-L7", "kerple_power", B=1, H=4),
    C("kerple_power-H3-L97-d64-causal-offsets", "kerple_power", B=1, H=3, Lq=97, Lk=97, d=64, causal=True,
      q_offset=5, k_offset=5),
    # (k_offset 8 where KERPLE-log has 20: with r2 up to 2, keys 16-32 away put gaps of ~17 nats
    # between neighbouring keys, each row's softmax is one-hot to 1e-7, and an r1 gradient of
    # 1.6e-6 is left as float32 rounding of a cancellation amplified by |r|^r2 ~ 400)
    C("kerple_power-H5-cross5x13-pad", "kerple_power", H=5, Lq=5, Lk=13, padding="random", k_offset=8),
    C("kerple_power-H2-L300-multi-tile", "kerple_power", B=1, H=2, Lq=300, Lk=300, d=16, causal=True),
    # --- DeBERTa (buckets 8, max 40: exact within +-4, logarithmic to +-39, edge rows past) ---
    C("deberta-shared-b8-m40-L97-d64-causal", "deberta", B=1, Lq=97, Lk=97, d=64, causal=True,
      opts=dict(position_buckets=8, max_relative_positions=40)),
    C("deberta-perhead-c2p-b8-m40-cross5x13-qoff30-pad", "deberta", H=3, Lq=5, Lk=13, q_offset=30,
      padding="random", opts=dict(position_buckets=8, max_relative_positions=40, tables="c2p", per_head=True)),
    C("deberta-perhead-p2c-nobuckets-m12-cross9x30-koff7", "deberta", Lq=9, Lk=30, k_offset=7, d=59,
      opts=dict(position_buckets=-1, max_relative_positions=12, tables="p2c", per_head=True)),
    C("deberta-shared-b2-m3-cross7x40-scale", "deberta", Lq=7, Lk=40, scale=0.4,
      opts=dict(position_buckets=2, max_relative_positions=3)),
    C("deberta-perhead-b256-m512-L300-multi-tile", "deberta", B=1, Lq=300, Lk=300, d=16,
      opts=dict(per_head=True)),
    C("deberta-L1-offsets", "deberta", Lq=1, Lk=1, q_offset=5, k_offset=900,
      opts=dict(position_buckets=16, max_relative_positions=64)),
    # --- RoPE -----------------------------------------------------------------
    C("rope-half-L97-d64-causal", "rope", B=1, Lq=97, Lk=97, d=64, causal=True, opts=dict(style="half_split")),
    C("rope-interleaved-L7-d16", "rope", opts=dict(style="interleaved")),
    C("rope-half-dims16-d59-base500", "rope", Lq=11, Lk=11, d=59,
      opts=dict(style="half_split", dims=16, base=500.0)),
    C("rope-interleaved-dims32-d64-kvcache1x97", "rope", B=1, H=3, Lq=1, Lk=97, d=64, q_offset=96, causal=True,
      opts=dict(style="interleaved", dims=32)),
    C("rope-half-cross5x13-offsets1000", "rope", Lq=5, Lk=13, q_offset=1000, k_offset=990, d=16,
      opts=dict(style="half_split")),
    C("rope-interleaved-d2", "rope", d=2, dv=3, opts=dict(style="interleaved")),
    # --- Transformer-XL ----------------------------------------------------
    C("xl-L7-d16-pos16", "xl", opts=dict(pos_dim=16)),
    C("xl-mem5-L7-d59-pos32-causal", "xl", Lq=7, Lk=12, d=59, q_offset=5, k_offset=0, causal=True,
      opts=dict(pos_dim=32)),
    C("xl-clamp4-L97-d64-causal", "xl", B=1, Lq=97, Lk=97, d=64, causal=True, opts=dict(pos_dim=64, clamp_len=4)),
    C("xl-clamp6-cross5x13-both-signs-pad", "xl", Lq=5, Lk=13, q_offset=3, k_offset=0, padding="random",
      opts=dict(pos_dim=8, clamp_len=6)),
    C("xl-L1-pos2", "xl", Lq=1, Lk=1, opts=dict(pos_dim=2)),
    # --- positions on a grid: SAM's tables (pooled keys both ways), Swin's bias ---
    C("sam-3x4", "sam", Lq=12, Lk=12, opts=dict(q_height=3, q_width=4)),
    C("sam-4x6-keys-2x3-pad", "sam", Lq=24, Lk=6, d=8, padding="random",
      opts=dict(q_height=4, q_width=6, k_height=2, k_width=3)),
    C("sam-2x3-keys-4x6-scale", "sam", Lq=6, Lk=24, d=8, scale=0.4, opts=dict(q_height=2, q_width=3, k_height=4,
                                                                          k_width=6)),
    C("sam-14x14-multi-tile", "sam", B=1, Lq=196, Lk=196, d=16, opts=dict(q_height=14, q_width=14)),
    C("swin-3x4-pad", "swin", H=3, Lq=12, Lk=12, padding="random", opts=dict(window_height=3, window_width=4)),
    C("swin-7x7", "swin", B=3, H=3, Lq=49, Lk=49, d=32, opts=dict(window_height=7, window_width=7)),
    C("swin-12x12-multi-tile-causal", "swin", B=1, Lq=144, Lk=144, d=16, causal=True,
      opts=dict(window_height=12, window_width=12)),
    # --- shapes for the index tricks: skew (causal, aligned) and rel-shift (memory) ---
    C("shaw-KV-perhead-zero-k2-L9-causal-pad-offsets4", "shaw", Lq=9, Lk=9, q_offset=4, k_offset=4, causal=True,
      padding="random", opts=dict(k=2, beyond="zero", tables="kv", per_head=True)),
    C("shaw-V-shared-k30-L33-causal", "shaw", B=1, Lq=33, Lk=33, d=16, dv=9, causal=True, opts=dict(k=30, tables="v")),
    C("xl-mem8-L5-clamp3-causal-pad", "xl", Lq=5, Lk=13, q_offset=8, causal=True, padding="random",
      opts=dict(pos_dim=8, clamp_len=3)),
]

# Each scheme again with rows that are fully masked: causal with keys that all lie
# in the future of the first query rows, plus one batch entry entirely padded.
SCHEME_OPTS = {
    "none": {}, "shaw": dict(k=3, tables="kv"), "t5": dict(bidirectional=False, num_buckets=8, max_distance=16),
    "alibi": dict(learn=True), "rope": dict(dims=8), "xl": dict(pos_dim=8, clamp_len=0), "kerple": {},
    "kerple_power": {}, "deberta": dict(position_buckets=8, max_relative_positions=20),
    "sam": dict(q_height=2, q_width=3, k_height=2, k_width=4), "swin": dict(window_height=2, window_width=4),
}
MASKED_CASES = [C(f"{s}-fully-masked-rows", s, Lq=6 if s != "swin" else 8, Lk=8, k_offset=3, causal=True,
                  padding="batch", opts=o) for s, o in SCHEME_OPTS.items()]


def expected_algorithms(case: Case) -> set[str]:
    """Which algorithms serve a case, stated from the papers (docs/design.md section 2)."""
    algos = {"reference", "fused"}
    if case.scheme in ("none", "rope", "t5", "alibi", "kerple", "kerple_power"):
        algos |= {"gather"}
    if case.scheme == "shaw":
        algos |= {"split", "gather", "generalized_skew"}
        if case.causal and case.Lq == case.Lk and case.q_offset == case.k_offset:
            algos |= {"skew"}
    if case.scheme == "xl":
        algos |= {"generalized_skew"}
        if case.causal and case.k_offset + case.Lk == case.q_offset + case.Lq:
            algos |= {"relshift"}
    return algos


ALL_CASES = CASES + MASKED_CASES
CASE_ALGORITHMS = [pytest.param(c, a, id=f"{c.id}-{a}") for c in ALL_CASES
                   for a in ["auto"] + sorted(expected_algorithms(c))]


def test_index_trick_cases_are_present():
    """The case list exercises every algorithm, skew and rel-shift included."""
    covered = set().union(*(expected_algorithms(c) for c in ALL_CASES))
    assert covered == set(relpos.ALGORITHMS) - {"auto"}


@pytest.mark.parametrize("case", ALL_CASES, ids=ids(ALL_CASES))
def test_available_algorithms_are_the_papers(case):
    pb = make_problem(case)
    got = relpos.available_algorithms(pb.q, pb.k, pb.v, pb.scheme(), **pb.call_kwargs())
    assert set(got) == expected_algorithms(case)


@pytest.mark.parametrize("case", ALL_CASES, ids=ids(ALL_CASES))
def test_unserved_algorithms_are_refused(case):
    pb = make_problem(case)
    for algorithm in set(relpos.ALGORITHMS) - {"auto"} - expected_algorithms(case):
        with pytest.raises(ValueError, match=f"algorithm: '{algorithm}'"):
            run_relpos(pb, np.float64, algorithm)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case, algorithm", CASE_ALGORITHMS)
def test_matches_torch_oracle(case, dtype, algorithm):
    pb = make_problem(case)
    res = run_relpos(pb, dtype, algorithm)
    ref = run_oracle(pb, dtype)
    for name in ("out", "lse"):
        assert res[name].dtype == dtype, f"{name} has dtype {res[name].dtype}"
    assert_matches_oracle(res, ref, dtype)


@pytest.mark.parametrize("case", MASKED_CASES, ids=ids(MASKED_CASES))
def test_fully_masked_rows_are_zero(case):
    """Rows with no visible key: out exactly 0, lse -inf, no gradient into q, and no NaN anywhere."""
    pb = make_problem(case)
    res = run_relpos(pb, np.float64)
    ref = run_oracle(pb)
    dead = np.isneginf(ref["lse"])  # (B, H, Lq) rows the oracle sees as fully masked
    assert dead.any() and not dead.all()
    assert np.array_equal(np.isneginf(res["lse"]), dead)
    assert np.all(res["out"][dead] == 0.0)
    assert np.all(res["dq"][dead] == 0.0)
    for name, g in res.items():
        assert not np.isnan(g).any(), f"NaN in {name}"
    # keys that no live row sees get no gradient either (the padded batch entry)
    assert np.all(res["dk"][-1] == 0.0) and np.all(res["dv"][-1] == 0.0)
    assert_matches_oracle(res, ref, np.float64)


@pytest.mark.parametrize("scheme,opts,default", [
    ("alibi", {}, 1 / np.sqrt(59)), ("t5", dict(bidirectional=True), 1.0),
    # DeBERTa's 1 / sqrt(d (1 + number of position tables)), the root in float32 as in its code
    ("deberta", dict(position_buckets=8, max_relative_positions=20), 1 / float(np.sqrt(np.float32(59 * 3)))),
    ("deberta", dict(position_buckets=8, max_relative_positions=20, tables="p2c"),
     1 / float(np.sqrt(np.float32(59 * 2)))),
])
def test_scale_default_is_the_schemes(scheme, opts, default):
    """scale=None is the scheme's default: T5's 1, DeBERTa's 1/sqrt(d (1 + tables)), 1/sqrt(d)
    for the others; equal to passing it explicitly, and different from the other default (per
    the oracle)."""
    case = Case("scale-default", scheme, Lq=9, Lk=9, d=59, opts=opts)
    res = run_relpos(make_problem(case), np.float64)
    explicit = run_relpos(make_problem(case.replace(scale=default)), np.float64)
    for name in res:
        np.testing.assert_allclose(res[name], explicit[name], rtol=1e-13, atol=1e-13)
    other = make_problem(case.replace(scale=1.0 if default != 1.0 else 1 / np.sqrt(59)))
    assert_matches_oracle(run_relpos(other, np.float64), run_oracle(other), np.float64)
    assert not np.allclose(run_oracle(other)["out"], res["out"], atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_xl_memory_segment_equals_full_sequence_rows(dtype):
    """Transformer-XL with memory (keys = [memory; current], q_offset = mem_len, k_offset = 0)
    equals the last Lq rows of the causal attention over the whole sequence, and the oracle."""
    mem, lq = 6, 7
    full = make_problem(Case("xl-full-seq", "xl", Lq=mem + lq, Lk=mem + lq, d=16, causal=True,
                             opts=dict(pos_dim=16)))
    full.dout[:, :, :mem] = 0.0  # only the current segment's rows carry a loss
    seg = make_problem(full.case.replace(id="xl-segment", Lq=lq, q_offset=mem))
    seg.q, seg.k, seg.v, seg.dout, seg.params = full.q[:, :, mem:], full.k, full.v, full.dout[:, :, mem:], full.params
    r_seg = run_relpos(seg, dtype)
    assert_matches_oracle(r_seg, run_oracle(seg, dtype), dtype)
    ref_full = run_oracle(full, dtype)
    assert_close("out", r_seg["out"], ref_full["out"][:, :, mem:], dtype)
    assert_close("lse", r_seg["lse"], ref_full["lse"][:, :, mem:], dtype)
    for name in ("dk", "dv", "dxl_u", "dxl_v", "dxl_w_r"):
        assert_close(name, r_seg[name], ref_full[name], dtype)
    assert_close("dq", r_seg["dq"], ref_full["dq"][:, :, mem:], dtype)
