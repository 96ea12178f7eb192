"""Bad input: every case raises ValueError whose message names the argument, in forward
and in backward, and never crashes the process.

The cases first run in a child process (one process for as many as it survives), so
a case that kills its process (a segfault in the core) fails as a test here instead of
taking the whole pytest session down with it; only cases that survived there run again
in-process, where their exception type and message are checked.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import relpos

B, H, LQ, LK, D, DV = 2, 2, 4, 5, 8, 6


def _inputs(dtype=np.float64):
    rng = np.random.default_rng(1234)
    return (rng.standard_normal((B, H, LQ, D)).astype(dtype), rng.standard_normal((B, H, LK, D)).astype(dtype),
            rng.standard_normal((B, H, LK, DV)).astype(dtype))


def _forward(q, k, v, scheme=None, **kw):
    return relpos.forward(q, k, v, scheme, **kw)


def _backward(q, k, v, scheme=None, **kw):
    """backward with out / lse / dout of the shapes the (possibly bad) inputs imply."""
    dt = np.asarray(q).dtype if np.asarray(q).dtype in (np.float32, np.float64) else np.float64
    out_shape = tuple(np.shape(q)[:3]) + tuple(np.shape(v)[3:])
    out, lse = np.zeros(out_shape, dt), np.zeros(out_shape[:3], dt)
    return relpos.backward(q, k, v, out, lse, np.ones(out_shape, dt), scheme, **kw)


def _backward_with(**bad):
    """A backward call whose out / lse / dout are replaced by bad ones."""
    def run(_call):
        q, k, v = _inputs()
        a = dict(out=np.zeros((B, H, LQ, DV)), lse=np.zeros((B, H, LQ)), dout=np.ones((B, H, LQ, DV)))
        a.update(bad)
        return relpos.backward(q, k, v, a["out"], a["lse"], a["dout"])
    return run


def _bad(change=None, scheme=None, **kw):
    """A call on the valid base inputs after ``change(q, k, v) -> (q, k, v)``, with scheme and options."""
    def run(call):
        q, k, v = _inputs()
        if change is not None:
            q, k, v = change(q, k, v)
        return call(q, k, v, scheme() if callable(scheme) else scheme, **kw)
    return run


def _f32(x):
    return x.astype(np.float32)


def _shaw(k=2, wk=(2 * 2 + 1, D), wv=None, **kw):
    return lambda: relpos.Shaw(k=k, wk=None if wk is None else np.ones(wk), wv=None if wv is None else np.ones(wv),
                               **kw)


def _xl(u=(H, D), v=(H, D), w_r=(H, D, 4), **kw):
    return lambda: relpos.TransformerXL(np.zeros(u), np.zeros(v), np.zeros(w_r), **kw)


# (id, case, regex the message must match: the argument's name)
CASES = [
    # shapes and ranks
    ("q-3d", _bad(lambda q, k, v: (q[0], k, v)), r"\bq\b.*dimensions"),
    ("k-5d", _bad(lambda q, k, v: (q, k[None], v)), r"\bk\b.*dimensions"),
    ("v-2d", _bad(lambda q, k, v: (q, k, v[0, 0])), r"\bv\b.*dimensions"),
    ("k-wrong-d", _bad(lambda q, k, v: (q, k[..., :D - 1], v)), r"\bk\b"),
    # 3 key heads for 2 query heads (fewer heads that divide H are grouped-query attention)
    ("k-wrong-heads", _bad(lambda q, k, v: (q, np.concatenate([k, k[:, :1]], 1), np.concatenate([v, v[:, :1]], 1))),
     r"\bk\b.*must divide"),
    ("v-heads-unlike-k", _bad(lambda q, k, v: (q, k[:, :1], v)), r"\bv\b"),
    ("k-wrong-batch", _bad(lambda q, k, v: (q, k[:1], v[:1])), r"\bk\b"),
    ("v-wrong-Lk", _bad(lambda q, k, v: (q, k, v[:, :, :LK - 1])), r"\bv\b"),
    # zero extents: heads and widths are refused; a call without queries, keys or batch
    # entries is valid (test_bad_inputs_again.py) and checked like any other
    ("q-no-heads", _bad(lambda q, k, v: (q[:, :0], k[:, :0], v[:, :0])), r"\bq\b.*>= 1"),
    ("q-k-zero-d", _bad(lambda q, k, v: (q[..., :0], k[..., :0], v)), r"\bq\b.*>= 1"),
    ("v-zero-dv", _bad(lambda q, k, v: (q, k, v[..., :0])), r"\bv\b.*>= 1"),
    ("no-queries-k-wrong-batch", _bad(lambda q, k, v: (q[:, :, :0], k[:1], v[:1])), r"\bk\b.*B=2"),
    ("no-keys-v-wrong-Lk", _bad(lambda q, k, v: (q, k[:, :, :0], v)), r"\bv\b.*Lk=0"),
    ("no-queries-t5-table-heads", _bad(lambda q, k, v: (q[:, :, :0], k, v),
                                       scheme=lambda: relpos.T5(np.zeros((H + 1, 32)))), r"t5[._]table"),
    ("no-batch-shaw-wk-rows", _bad(lambda q, k, v: (q[:0], k[:0], v[:0]), scheme=_shaw(k=2, wk=(4, D))),
     r"shaw[._]wk"),
    # dtypes
    ("q-int32", _bad(lambda q, k, v: (q.astype(np.int32), k, v)), r"\bq\b.*dtype"),
    ("k-int64", _bad(lambda q, k, v: (q, k.astype(np.int64), v)), r"\bk\b.*dtype"),
    ("v-float16", _bad(lambda q, k, v: (q, k, v.astype(np.float16))), r"\bv\b.*dtype"),
    ("q-complex", _bad(lambda q, k, v: (q.astype(complex), k, v)), r"\bq\b.*dtype"),
    ("q-not-an-array", _bad(lambda q, k, v: ("query", k, v)), r"\bq\b"),
    ("mixed-q-f32", _bad(lambda q, k, v: (_f32(q), k, v)), r"\bk\b.*dtype"),
    ("mixed-k-f32", _bad(lambda q, k, v: (q, _f32(k), v)), r"\bk\b.*dtype"),
    ("mixed-v-f32", _bad(lambda q, k, v: (_f32(q), _f32(k), v)), r"\bv\b.*dtype"),
    ("mixed-param-f32", _bad(scheme=lambda: relpos.T5(np.zeros((H, 32), np.float32))), r"t5[._]table.*dtype"),
    # key padding
    ("key-padding-float", _bad(key_padding=np.zeros((B, LK))), r"key_padding.*dtype"),
    ("key-padding-int64", _bad(key_padding=np.zeros((B, LK), np.int64)), r"key_padding.*dtype"),
    ("key-padding-wrong-Lk", _bad(key_padding=np.zeros((B, LK + 1), bool)), r"key_padding"),
    ("key-padding-wrong-B", _bad(key_padding=np.zeros((B + 1, LK), bool)), r"key_padding"),
    ("key-padding-1d", _bad(key_padding=np.zeros(LK, bool)), r"key_padding"),
    # options
    ("algorithm-unknown", _bad(algorithm="flash"), r"algorithm"),
    ("algorithm-None", _bad(algorithm=None), r"algorithm"),
    ("scheme-not-a-scheme", _bad(scheme="shaw"), r"scheme"),
    ("q-offset-negative", _bad(q_offset=-1), r"q_offset"),
    ("k-offset-negative", _bad(k_offset=-3), r"k_offset"),
    ("q-offset-above-2pow40", _bad(q_offset=2**41), r"q_offset"),
    ("k-offset-beyond-int64", _bad(k_offset=2**70), r"k_offset"),
    ("scale-zero", _bad(scale=0.0), r"scale"),
    ("scale-negative", _bad(scale=-0.5), r"scale"),
    ("scale-nan", _bad(scale=float("nan")), r"scale"),
    ("scale-inf", _bad(scale=float("inf")), r"scale"),
    ("scale-not-a-number", _bad(scale="big"), r"scale"),
    ("q-offset-fractional", _bad(q_offset=1.5), r"q_offset"),
    ("k-offset-string", _bad(k_offset="a"), r"k_offset"),
    # Shaw
    ("shaw-k-negative", _bad(scheme=_shaw(k=-1, wk=(1, D))), r"shaw\.k"),
    ("shaw-no-table", _bad(scheme=_shaw(wk=None)), r"shaw"),
    ("shaw-wk-rows", _bad(scheme=_shaw(k=2, wk=(4, D))), r"shaw[._]wk"),
    ("shaw-wk-width", _bad(scheme=_shaw(k=2, wk=(5, D + 1))), r"shaw[._]wk"),
    ("shaw-wk-heads", _bad(scheme=_shaw(k=2, wk=(H + 1, 5, D))), r"shaw[._]wk"),
    ("shaw-wk-1d", _bad(scheme=_shaw(k=2, wk=(5,))), r"shaw[._]wk"),
    ("shaw-wv-width", _bad(scheme=_shaw(k=2, wk=None, wv=(5, D))), r"shaw[._]wv"),  # dv = 6 != d
    ("shaw-beyond-unknown", _bad(scheme=_shaw(beyond="wrap")), r"beyond"),
    ("shaw-beyond-not-a-string", _bad(scheme=_shaw(beyond=0)), r"beyond"),
    # 2k+1 overflows int64 for these k: a check in int64 arithmetic accepts any table
    ("shaw-k-2pow62-table-3-rows", _bad(scheme=_shaw(k=2**62, wk=(3, D))), r"shaw"),
    ("shaw-k-2pow62+2pow50-table-3-rows", _bad(scheme=_shaw(k=2**62 + 2**50, wk=(3, D))), r"shaw"),
    ("shaw-k-beyond-int64", _bad(scheme=_shaw(k=2**64, wk=(3, D))), r"shaw"),
    # T5
    ("t5-num-buckets-bidirectional-3", _bad(scheme=lambda: relpos.T5(np.zeros((H, 3)))), r"num_buckets"),
    ("t5-num-buckets-causal-1", _bad(scheme=lambda: relpos.T5(np.zeros((H, 1)), bidirectional=False)),
     r"num_buckets"),
    ("t5-max-distance-within-exact", _bad(scheme=lambda: relpos.T5(np.zeros((H, 32)), max_distance=8)),
     r"max_distance"),
    ("t5-table-heads", _bad(scheme=lambda: relpos.T5(np.zeros((H + 1, 32)))), r"t5[._]table"),
    ("t5-table-1d", _bad(scheme=lambda: relpos.T5(np.zeros(32))), r"t5[._]table"),
    # ALiBi
    ("alibi-slopes-shape", _bad(scheme=lambda: relpos.ALiBi(np.ones(H + 1))), r"slopes"),
    ("alibi-slopes-2d", _bad(scheme=lambda: relpos.ALiBi(np.ones((H, 1)))), r"slopes"),
    ("alibi-slopes-nan", _bad(scheme=lambda: relpos.ALiBi(np.array([0.5, np.nan]))), r"slopes"),
    # KERPLE
    ("kerple-r1-shape", _bad(scheme=lambda: relpos.KERPLE(np.ones(H + 1), np.ones(H))), r"kerple[._]r1"),
    ("kerple-r2-zero", _bad(scheme=lambda: relpos.KERPLE(np.ones(H), np.zeros(H))), r"kerple[._]r2"),
    ("kerple-r1-negative", _bad(scheme=lambda: relpos.KERPLE(-np.ones(H), np.ones(H))), r"kerple[._]r1"),
    ("kerple-r2-inf", _bad(scheme=lambda: relpos.KERPLE(np.ones(H), np.full(H, np.inf))), r"kerple[._]r2"),
    ("kerple-r2-missing", _bad(scheme=lambda: relpos.KERPLE(np.ones(H), None)), r"kerple[._]r2"),
    # KERPLE, power variant: r2 in (0, 2]
    ("kerple_power-r2-above-two", _bad(scheme=lambda: relpos.KERPLEPower(np.ones(H), np.full(H, 2.5))),
     r"kerple_power[._]r2"),
    ("kerple_power-r1-zero", _bad(scheme=lambda: relpos.KERPLEPower(np.zeros(H), np.ones(H))), r"kerple_power[._]r1"),
    # DeBERTa: tables (1 or H, 2 span, d), span 8 with position_buckets 8
    ("deberta-no-tables", _bad(scheme=lambda: relpos.DeBERTa()), r"deberta: give c2p, p2c or both"),
    ("deberta-c2p-rows", _bad(scheme=lambda: relpos.DeBERTa(c2p=np.zeros((15, D)), position_buckets=8,
                                                            max_relative_positions=40)), r"deberta[._]c2p.*2 span=16"),
    ("deberta-p2c-width", _bad(scheme=lambda: relpos.DeBERTa(p2c=np.zeros((16, D + 1)), position_buckets=8,
                                                             max_relative_positions=40)), r"deberta[._]p2c"),
    ("deberta-p2c-heads", _bad(scheme=lambda: relpos.DeBERTa(p2c=np.zeros((H + 1, 16, D)), position_buckets=8,
                                                             max_relative_positions=40)), r"deberta[._]p2c"),
    # no buckets: span = max_relative_positions
    ("deberta-no-buckets-rows", _bad(scheme=lambda: relpos.DeBERTa(c2p=np.zeros((16, D)), position_buckets=0,
                                                                   max_relative_positions=4)), r"deberta[._]c2p"),
    ("deberta-one-bucket", _bad(scheme=lambda: relpos.DeBERTa(c2p=np.zeros((2, D)), position_buckets=1)),
     r"deberta[._]position_buckets"),
    ("deberta-max-within-exact", _bad(scheme=lambda: relpos.DeBERTa(c2p=np.zeros((16, D)), position_buckets=8,
                                                                    max_relative_positions=5)),
     r"deberta[._]max_relative_positions"),
    ("deberta-max-0", _bad(scheme=lambda: relpos.DeBERTa(c2p=np.zeros((16, D)), position_buckets=-1,
                                                         max_relative_positions=0)),
     r"deberta[._]max_relative_positions"),
    ("deberta-buckets-beyond-2pow40", _bad(scheme=lambda: relpos.DeBERTa(c2p=np.zeros((16, D)),
                                                                         position_buckets=2**40 + 2)),
     r"deberta[._]position_buckets"),
    # RoPE
    ("rope-odd-dims", _bad(scheme=lambda: relpos.RoPE(dims=3)), r"dims"),
    ("rope-dims-above-d", _bad(scheme=lambda: relpos.RoPE(dims=D + 2)), r"dims"),
    ("rope-dims-negative", _bad(scheme=lambda: relpos.RoPE(dims=-2)), r"dims"),
    ("rope-odd-d-all-dims", _bad(lambda q, k, v: (q[..., :7], k[..., :7], v), scheme=lambda: relpos.RoPE()),
     r"dims"),
    ("rope-base-1", _bad(scheme=lambda: relpos.RoPE(base=1.0)), r"base"),
    ("rope-base-nan", _bad(scheme=lambda: relpos.RoPE(base=float("nan"))), r"base"),
    ("rope-style-unknown", _bad(scheme=lambda: relpos.RoPE(style="gptj")), r"style"),
    ("rope-dims-beyond-int64", _bad(scheme=lambda: relpos.RoPE(dims=2**70)), r"dims"),
    ("t5-max-distance-beyond-int64", _bad(scheme=lambda: relpos.T5(np.zeros((H, 32)), max_distance=2**70)),
     r"max_distance"),
    # Transformer-XL
    ("xl-odd-pos-dim", _bad(scheme=_xl(w_r=(H, D, 5))), r"xl[._]w_r.*pos_dim"),
    ("xl-u-shape", _bad(scheme=_xl(u=(H, D - 1))), r"xl[._]u"),
    ("xl-v-heads", _bad(scheme=_xl(v=(1, D))), r"xl[._]v"),
    ("xl-w-r-d", _bad(scheme=_xl(w_r=(H, D + 1, 4))), r"xl[._]w_r"),
    ("xl-w-r-2d", _bad(scheme=_xl(w_r=(H, D))), r"xl[._]w_r"),
    ("xl-clamp-len-negative", _bad(scheme=_xl(clamp_len=-1)), r"clamp_len"),
    ("xl-clamp-len-beyond-int64", _bad(scheme=_xl(clamp_len=2**70)), r"clamp_len"),
]
BACKWARD_ONLY = [
    ("dout-shape", _backward_with(dout=np.ones((B, H, LQ, DV + 1))), r"dout"),
    ("dout-float32", _backward_with(dout=np.ones((B, H, LQ, DV), np.float32)), r"dout.*dtype"),
    ("dout-int", _backward_with(dout=np.ones((B, H, LQ, DV), int)), r"dout.*dtype"),
    ("out-shape", _backward_with(out=np.zeros((B, H, LQ + 1, DV))), r"\bout\b"),
    ("lse-rank", _backward_with(lse=np.zeros((B, H))), r"\blse\b"),
    ("lse-float32", _backward_with(lse=np.zeros((B, H, LQ), np.float32)), r"\blse\b.*dtype"),
]
CALLS = {"forward": _forward, "backward": _backward}
ALL = {f"{call}-{cid}": (fn, CALLS[call], pattern) for cid, fn, pattern in CASES for call in CALLS}
ALL.update({f"backward-{cid}": (fn, _backward, pattern) for cid, fn, pattern in BACKWARD_ONLY})


def _child(ids):
    """Run the given cases, reporting each as one JSON line (a line before it starts, one after)."""
    for cid in ids:
        print(json.dumps({"start": cid}), flush=True)
        fn, call, _ = ALL[cid]
        try:
            fn(call)
            res = {"id": cid, "type": None, "message": ""}
        except BaseException as e:  # noqa: BLE001 - reporting whatever it is
            res = {"id": cid, "type": type(e).__name__, "message": str(e)}
        print(json.dumps(res), flush=True)


@pytest.fixture(scope="module")
def child_outcomes():
    """Each case's outcome in a child process; a case that killed its child is 'crashed'."""
    here = os.path.dirname(os.path.abspath(__file__))
    pending, outcomes = list(ALL), {}
    while pending:
        code = f"import sys; sys.path.insert(0, {here!r}); import test_validation as t; t._child(sys.argv[1:])"
        try:
            proc = subprocess.run([sys.executable, "-c", code, *pending], capture_output=True, text=True, timeout=120)
            stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:  # a hung case counts as crashed
            stdout, stderr, rc = e.stdout or "", e.stderr or "", "timeout"
            stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
        started = None
        for line in stdout.splitlines():
            rec = json.loads(line)
            if "start" in rec:
                started = rec["start"]
            else:
                outcomes[rec["id"]], started = rec, None
        if started is not None:  # it began and never reported: it took the process down
            outcomes[started] = {"id": started, "type": "crashed", "message": f"child exit status {rc}"}
        elif rc != 0:
            pytest.fail(f"validation child failed outside any case (status {rc}): {str(stderr)[-2000:]}")
        pending = [c for c in pending if c not in outcomes]
    return outcomes


@pytest.mark.parametrize("cid", list(ALL))
def test_rejected_with_value_error_naming_argument(cid, child_outcomes):
    child = child_outcomes[cid]
    assert child["type"] != "crashed", f"{cid}: the call crashed the process ({child['message']})"
    fn, call, pattern = ALL[cid]
    with pytest.raises(ValueError, match=pattern):
        fn(call)
    assert child["type"] == "ValueError", f"child process saw {child}"


def test_valid_base_call_passes():
    """The base inputs every case above spoils are valid, in forward and backward, and right:
    their output equals plain softmax attention computed here in NumPy."""
    q, k, v = _inputs()
    for call in CALLS.values():
        call(q, k, v)
    out, lse = relpos.forward(q, k, v)
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    m = logits.max(-1, keepdims=True)
    p = np.exp(logits - m)
    np.testing.assert_allclose(out, (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, (np.log(p.sum(-1, keepdims=True)) + m)[..., 0], rtol=1e-12)
