"""Threads: every algorithm gives bitwise-identical results for repeated runs with the
same thread count, and the same values (to rounding) for 1 and 2 threads."""
import numpy as np
import pytest

import relpos
from harness import Case, assert_matches_oracle, make_problem, run_oracle

CASES = [
    Case("threads-shaw-shared", "shaw", B=3, H=2, Lq=9, Lk=9, d=16, causal=True, opts=dict(k=3, tables="kv")),
    Case("threads-t5", "t5", B=3, H=2, Lq=9, Lk=11, d=16, opts=dict(bidirectional=True, num_buckets=8, max_distance=20)),
    Case("threads-xl-mem", "xl", B=3, H=2, Lq=5, Lk=9, q_offset=4, d=16, causal=True, opts=dict(pos_dim=8)),
]


def run(pb, algorithm, threads):
    scheme = pb.scheme(np.float32)
    kw = pb.call_kwargs()
    q, k, v, dout = (x.astype(np.float32) for x in (pb.q, pb.k, pb.v, pb.dout))
    out, lse = relpos.forward(q, k, v, scheme, algorithm=algorithm, threads=threads, **kw)
    grads = relpos.backward(q, k, v, out, lse, dout, scheme, algorithm=algorithm, threads=threads, **kw)
    return {"out": out, "lse": lse, **{"d" + n: g for n, g in grads.items()}}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_thread_counts_agree_and_repeat_bitwise(case):
    pb = make_problem(case)
    algos = relpos.available_algorithms(pb.q, pb.k, pb.v, pb.scheme(), **pb.call_kwargs())
    for algorithm in algos:
        one, two, two_again = run(pb, algorithm, 1), run(pb, algorithm, 2), run(pb, algorithm, 2)
        for name in one:
            assert np.array_equal(two[name], two_again[name]), f"{algorithm} {name} not reproducible"
            np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=f"{algorithm} {name}")
        assert_matches_oracle(two, run_oracle(pb, np.float32), np.float32)


@pytest.mark.parametrize("threads", [-1, 5000, 1.5, True, "2"])
def test_bad_thread_counts_are_refused(threads):
    q = np.zeros((1, 1, 2, 4))
    with pytest.raises(ValueError, match="threads"):
        relpos.forward(q, q, q, threads=threads)


def test_zero_threads_means_all_cores_as_on_the_command_line():
    q = np.random.default_rng(0).standard_normal((2, 2, 5, 4))
    out0, _ = relpos.forward(q, q, q, relpos.ALiBi(), threads=0)
    out, _ = relpos.forward(q, q, q, relpos.ALiBi())
    np.testing.assert_array_equal(out0, out)
