"""bfloat16 and float16 storage from Python: NumPy arrays (ml_dtypes' bfloat16,
NumPy's float16) and torch tensors, forward and backward, judged by
FlashAttention's error rule against the float64 torch oracle: a half result's
error is at most 2x that of a float32 computation from the same half inputs
whose results are rounded to the half type at the end (lse stays float32)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import relpos
import relpos.torch as rt
from harness import Case, ids, make_problem, run_oracle

HALF = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}

CASES = [
    Case("none_causal", "none", causal=True),
    Case("shaw_kv_padding", "shaw", padding="random", opts={"k": 3}),
    Case("shaw_per_head_causal", "shaw", causal=True, opts={"k": 2, "per_head": True, "tables": "k"}),
    Case("t5_cross", "t5", Lq=5, Lk=9, q_offset=4, opts={"num_buckets": 8, "max_distance": 16}),
    Case("alibi_learned_causal", "alibi", causal=True, opts={"learn": True}),
    Case("rope_interleaved", "rope", padding="batch", opts={"style": "interleaved", "dims": 8}),
    Case("xl_memory", "xl", Lq=5, Lk=9, q_offset=4, causal=True, opts={"pos_dim": 8}),
    Case("kerple_causal", "kerple", causal=True),
    Case("kerple_power_padding", "kerple_power", padding="random"),
    Case("deberta_cross_padding", "deberta", Lq=5, Lk=9, q_offset=4, padding="random",
         opts={"position_buckets": 4, "max_relative_positions": 6, "per_head": True}),
    Case("t5_multi_tile", "t5", B=1, H=1, Lq=150, Lk=300, q_offset=150, causal=True, d=8,
         opts={"num_buckets": 32, "max_distance": 200}),
    # attention dropout: the float32 and half calls draw one mask, the oracle applies it explicitly
    Case("shaw_kv_dropout", "shaw", causal=True, padding="random", opts={"k": 3}, dropout_p=0.3),
    Case("deberta_multi_tile_dropout", "deberta", B=1, H=1, Lq=150, Lk=150, d=8, dropout_p=0.2,
         opts={"position_buckets": 16, "max_relative_positions": 64}),
]


def _cast(pb, dtype):
    """The problem's inputs in dtype: q, k, v, dout and the scheme's parameters."""
    return dict(q=pb.q.astype(dtype), k=pb.k.astype(dtype), v=pb.v.astype(dtype), dout=pb.dout.astype(dtype),
                params={n: a.astype(dtype) for n, a in pb.params.items()})


def _run(pb, arrays, stored_out_dtype):
    """forward, then backward reading out as the half call stores it (rounded to
    stored_out_dtype); results as float64 arrays."""
    scheme = pb.scheme(params=arrays["params"])
    kw = pb.call_kwargs()
    out, lse = relpos.forward(arrays["q"], arrays["k"], arrays["v"], scheme, **kw)
    stored = out.astype(stored_out_dtype).astype(out.dtype)
    grads = relpos.backward(arrays["q"], arrays["k"], arrays["v"], stored, lse, arrays["dout"], scheme, **kw)
    res = {"out": out, "lse": lse, **{"d" + n: g for n, g in grads.items()}}
    return {n: np.asarray(x).astype(np.float64) for n, x in res.items()}, lse.dtype


def _max_error(got, ref):
    finite = np.isfinite(ref)
    assert np.array_equal(got[~finite], ref[~finite]), "infinite entries differ"
    return float(np.abs(got[finite] - ref[finite]).max()) if finite.any() else 0.0


@pytest.mark.parametrize("storage", list(HALF))
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_numpy_half_meets_the_error_rule(case, storage):
    half_dtype = HALF[storage]
    pb = make_problem(case)
    half_inputs = _cast(pb, half_dtype)
    half, lse_dtype = _run(pb, half_inputs, half_dtype)
    assert lse_dtype == np.float32
    single_inputs = {n: ({p: a.astype(np.float32) for p, a in x.items()} if n == "params" else x.astype(np.float32))
                     for n, x in half_inputs.items()}
    single, _ = _run(pb, single_inputs, half_dtype)
    exact = run_oracle(pb, half_dtype)  # float64 on the half-rounded inputs
    assert set(half) == set(exact)
    for name, ref in exact.items():
        rounded = single[name] if name == "lse" else single[name].astype(half_dtype).astype(np.float64)
        err_half, err_single = _max_error(half[name], ref), _max_error(rounded, ref)
        magnitude = max(1.0, float(np.abs(ref[np.isfinite(ref)]).max(initial=0)))
        assert err_single <= 0.02 * magnitude, f"{name}: float32 rounded error {err_single} (magnitude {magnitude})"
        assert err_half <= 2 * err_single, f"{name}: half error {err_half} > 2 x float32 rounded error {err_single}"


def test_half_outputs_have_the_inputs_dtype_and_lse_is_float32():
    q = np.random.default_rng(0).standard_normal((1, 2, 5, 8)).astype(ml_dtypes.bfloat16)
    out, lse = relpos.forward(q, q, q, relpos.ALiBi(), causal=True)
    assert out.dtype == ml_dtypes.bfloat16 and lse.dtype == np.float32
    grads = relpos.backward(q, q, q, out, lse, out, relpos.ALiBi(), causal=True)
    assert all(g.dtype == ml_dtypes.bfloat16 for g in grads.values())


@pytest.mark.parametrize("bad, message", [
    (lambda q: (q, q.astype(np.float16), q), r"\bk\b: dtype must match q \(bfloat16\)"),
    (lambda q: (q, q, q.astype(np.float32)), r"\bv\b: dtype must match q \(bfloat16\)"),
])
def test_mixed_half_dtypes_are_refused_by_name(bad, message):
    q = np.zeros((1, 1, 3, 4), dtype=ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match=message):
        relpos.forward(*bad(q))


def test_half_lse_must_be_float32():
    q = np.zeros((1, 1, 3, 4), dtype=np.float16)
    out, lse = relpos.forward(q, q, q)
    with pytest.raises(ValueError, match=r"lse: dtype must be float32"):
        relpos.backward(q, q, q, out, lse.astype(np.float16), out)


@pytest.mark.parametrize("storage", ["bfloat16", "float16"])
def test_torch_half_tensors_give_the_numpy_bits_with_autograd(storage):
    """The autograd op on torch half tensors (DLPack, int16 views) computes what
    the NumPy path computes from the same bits, forward and every gradient."""
    pb = make_problem(Case("t5_torch", "t5", causal=True, opts={"num_buckets": 8}))
    dtype = getattr(torch, storage)
    q, k, v = (torch.tensor(x).to(dtype).requires_grad_() for x in (pb.q, pb.k, pb.v))
    table = torch.tensor(pb.params["t5_table"]).to(dtype).requires_grad_()
    dout = torch.tensor(pb.dout).to(dtype)
    out = rt.attention(q, k, v, relpos.T5(table), causal=True)
    out.backward(dout)
    assert out.dtype == dtype and q.grad.dtype == dtype and table.grad.dtype == dtype

    def numpy_of(t):
        return t.detach().float().numpy().astype(HALF[storage])

    scheme = relpos.T5(numpy_of(table))
    n_out, n_lse = relpos.forward(numpy_of(q), numpy_of(k), numpy_of(v), scheme, causal=True)
    grads = relpos.backward(numpy_of(q), numpy_of(k), numpy_of(v), n_out, n_lse, numpy_of(dout), scheme, causal=True)
    for got, want in [(out, n_out), (q.grad, grads["q"]), (k.grad, grads["k"]), (v.grad, grads["v"]),
                      (table.grad, grads["t5_table"])]:
        np.testing.assert_array_equal(got.detach().float().numpy(), want.astype(np.float32))


def test_torch_compile_runs_bfloat16_with_a_float32_lse():
    torch.manual_seed(0)
    q = torch.randn(1, 2, 6, 8, dtype=torch.bfloat16)
    compiled = torch.compile(lambda q: torch.ops.relpos.attention_forward(q, q, q, None, [], "alibi",
                                                                           [1, 0, 0, -1, 0, 0], [float("nan")]),
                             fullgraph=True)
    out, lse = compiled(q)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    eager = rt.attention(q, q, q, relpos.ALiBi(), causal=True)
    torch.testing.assert_close(out, eager, rtol=0, atol=0)


@pytest.mark.parametrize("algorithm", ["fused", "gather"])
def test_grouped_query_half_storage_matches_float32_rounded(algorithm):
    """Grouped-query attention (H = 4 query heads on Hkv = 2): the half call's out
    and gradients (dk, dv summed over each group in float32, rounded once) are
    the float32 call's on the same inputs, to within one bfloat16 rounding."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 9, 8)).astype(ml_dtypes.bfloat16)
    k, v = (rng.standard_normal((2, 2, 9, 8)).astype(ml_dtypes.bfloat16) for _ in range(2))
    dout = rng.standard_normal((2, 4, 9, 8)).astype(ml_dtypes.bfloat16)
    table = rng.standard_normal((4, 8)).astype(ml_dtypes.bfloat16)

    def run(dtype):
        scheme = relpos.T5(table.astype(dtype), max_distance=16)
        x = [a.astype(dtype) for a in (q, k, v)]
        out, lse = relpos.forward(*x, scheme, causal=True, algorithm=algorithm)
        stored = out.astype(ml_dtypes.bfloat16).astype(dtype)
        g = relpos.backward(*x, stored, lse, dout.astype(dtype), scheme, causal=True, algorithm=algorithm)
        return {"out": out, **g}

    half, single = run(ml_dtypes.bfloat16), run(np.float32)
    for name, want in single.items():
        got = half[name].astype(np.float64)
        assert got.shape == want.shape, name
        step = np.ldexp(np.abs(want.astype(np.float64)), -8) + 1e-30  # one bfloat16 rounding
        assert np.all(np.abs(got - want) <= step), f"{name}: {np.abs(got - want).max()}"


@pytest.mark.parametrize("scheme", ["shaw", "t5", "alibi", "rope", "xl", "kerple", "kerple_power", "deberta", "none"])
def test_a_module_moved_to_bfloat16_runs_and_trains(scheme):
    """RelativeMultiheadAttention(...).to(torch.bfloat16): outputs and every
    parameter's gradient in bfloat16, within bfloat16's rounding of the float32
    module on the same (rounded) weights and inputs."""
    torch.manual_seed(1)
    single = rt.RelativeMultiheadAttention(32, 4, scheme).float()
    half = rt.RelativeMultiheadAttention(32, 4, scheme).to(torch.bfloat16)
    half.load_state_dict(single.state_dict())
    single.load_state_dict({n: t.bfloat16().float() for n, t in half.state_dict().items()})
    x = torch.randn(2, 9, 32, dtype=torch.float32).bfloat16()
    y = half(x, causal=True)
    reference = single(x.float(), causal=True)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), reference, rtol=0, atol=0.05)
    y.float().square().sum().backward()
    reference.square().sum().backward()
    for (name, p), (_, p32) in zip(half.named_parameters(), single.named_parameters()):
        assert p.grad is not None and p.grad.dtype == torch.bfloat16, name
        scale = max(1.0, float(p32.grad.abs().max()))
        torch.testing.assert_close(p.grad.float(), p32.grad, rtol=0, atol=0.05 * scale, msg=name)
