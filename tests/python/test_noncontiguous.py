"""Inputs of any strides: transposed views of (B, L, H, d) arrays, negative strides,
step slices, Fortran order, broadcast (stride 0). Every result must equal the one
from contiguous inputs holding the same values, and match the torch oracle."""
from __future__ import annotations

import numpy as np
import pytest

from harness import Case, assert_matches_oracle, ids, make_problem, run_oracle, run_relpos

CASES = [
    Case("shaw-KV-perhead-cross5x13-pad", "shaw", B=2, H=3, Lq=5, Lk=13, d=16, dv=6, q_offset=8,
         padding="random", opts=dict(k=4, tables="kv", per_head=True)),
    Case("shaw-KV-shared-zero-L7", "shaw", Lq=7, Lk=7, d=59, opts=dict(k=2, beyond="zero", tables="kv")),
    Case("t5-causal-L9", "t5", Lq=9, Lk=9, causal=True, opts=dict(bidirectional=False, num_buckets=8,
                                                                  max_distance=12)),
    Case("alibi-learned-H3-L11", "alibi", H=3, Lq=11, Lk=11, causal=True, opts=dict(learn=True)),
    Case("rope-interleaved-dims8-d16", "rope", Lq=6, Lk=10, k_offset=2, opts=dict(style="interleaved", dims=8)),
    Case("xl-mem3-L6", "xl", Lq=6, Lk=9, q_offset=3, causal=True, opts=dict(pos_dim=10, clamp_len=5)),
]


def transposed_blhd(x: np.ndarray) -> np.ndarray:
    """The same values as a (B, H, L, d) view of a (B, L, H, d) array."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)


def reversed_view(x: np.ndarray, axes) -> np.ndarray:
    """The same values as a view with negative strides along ``axes``."""
    sl = tuple(slice(None, None, -1) if a in axes else slice(None) for a in range(x.ndim))
    return np.ascontiguousarray(x[sl])[sl]


def step_view(x: np.ndarray, axis: int = -1, step: int = 3) -> np.ndarray:
    """The same values as a slice with a step along ``axis`` of a larger buffer."""
    shape = list(x.shape)
    shape[axis] *= step
    buf = np.full(shape, np.nan, dtype=x.dtype)
    sl = [slice(None)] * x.ndim
    sl[axis] = slice(None, None, step)
    buf[tuple(sl)] = x
    return buf[tuple(sl)]


def layout(name: str, pb, dtype) -> dict:
    """Non-contiguous versions of the problem's arrays, cast to dtype."""
    cast = {n: getattr(pb, n).astype(dtype) for n in ("q", "k", "v", "dout")}
    params = {n: p.astype(dtype) for n, p in pb.params.items()}
    kp = pb.key_padding
    if name == "blhd-transposed":
        arrays = {n: transposed_blhd(x) for n, x in cast.items()}
        params = {n: np.asfortranarray(p) if p.ndim > 1 else reversed_view(p, (0,)) for n, p in params.items()}
    elif name == "negative-strides":
        arrays = {n: reversed_view(x, (2, 3)) for n, x in cast.items()}
        params = {n: reversed_view(p, tuple(range(p.ndim))) for n, p in params.items()}
        kp = None if kp is None else reversed_view(kp, (1,))
        arrays["relayout"] = lambda x: reversed_view(x, (x.ndim - 1,))
    elif name == "step-slices":
        arrays = {n: step_view(x, axis=3 if n != "q" else 2) for n, x in cast.items()}
        params = {n: step_view(p, axis=0) for n, p in params.items()}
        kp = None if kp is None else step_view(kp, axis=1, step=2)
        arrays["relayout"] = lambda x: step_view(x, axis=0, step=2)
    else:
        raise ValueError(name)
    for n, x in list(arrays.items()) + list(params.items()):
        if isinstance(x, np.ndarray) and x.size > 1 and max(x.shape) > 1:
            assert not x.flags.c_contiguous, f"{name}: {n} is still C-contiguous"
            np.testing.assert_array_equal(x, cast[n] if n in cast else pb.params[n].astype(dtype))
    arrays["params"] = params
    arrays["key_padding"] = kp
    return arrays


LAYOUTS = ["blhd-transposed", "negative-strides", "step-slices"]
DTYPES = [pytest.param(np.float64, id="f64"), pytest.param(np.float32, id="f32")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout_name", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_strided_inputs_equal_contiguous(case, layout_name, dtype):
    pb = make_problem(case)
    contiguous = run_relpos(pb, dtype)
    strided = run_relpos(pb, dtype, arrays=layout(layout_name, pb, dtype))
    assert set(strided) == set(contiguous)
    for name in contiguous:
        np.testing.assert_array_equal(strided[name], contiguous[name], err_msg=name)
    assert_matches_oracle(strided, run_oracle(pb, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_stride0_kv_heads(dtype):
    """k and v shared by all heads through a stride-0 broadcast (multi-query style)."""
    pb = make_problem(Case("alibi-mqa-broadcast", "alibi", B=2, H=4, Lq=5, Lk=8, opts=dict(learn=True)))
    pb.k = np.repeat(pb.k[:, :1], 4, axis=1)
    pb.v = np.repeat(pb.v[:, :1], 4, axis=1)
    arrays = {n: np.broadcast_to(getattr(pb, n)[:, :1].astype(dtype), getattr(pb, n).shape) for n in ("k", "v")}
    assert arrays["k"].strides[1] == 0
    contiguous = run_relpos(pb, dtype)
    broadcast = run_relpos(pb, dtype, arrays=arrays)
    for name in contiguous:
        np.testing.assert_array_equal(broadcast[name], contiguous[name], err_msg=name)
    assert_matches_oracle(broadcast, run_oracle(pb, dtype), dtype)
