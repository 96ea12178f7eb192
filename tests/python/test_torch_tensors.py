"""torch tensors and NumPy arrays go to the core in place: NumPy in -> NumPy out,
torch in -> torch out, and a strided torch view is read where it lies (the address
and strides the core receives are the view's own), giving the result of its
contiguous copy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import relpos
from relpos import _calls, _relpos


def blhd_view(B=2, H=3, L=9, d=8, dtype=torch.float64, seed=0) -> torch.Tensor:
    """A (B, H, L, d) view of a (B, L, H, d) tensor: what a projection reshaped into heads gives."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, H, d, generator=g, dtype=dtype).transpose(1, 2)


def test_core_receives_torch_views_in_place():
    q = blhd_view()
    assert not q.is_contiguous()
    address, shape, strides = _relpos.view_info(q)
    assert address == q.data_ptr()
    assert tuple(shape) == tuple(q.shape) and tuple(strides) == q.stride()
    # A tensor that requires grad goes in through its detached alias: same storage.
    p = q.clone().requires_grad_()
    assert _relpos.view_info(_calls.core_array(p, "q"))[0] == p.data_ptr()
    # Stride-0 (expanded) tensors too: nothing materialises the broadcast.
    e = torch.randn(1, 1, 1, 8).expand(2, 3, 9, 8)
    assert _relpos.view_info(e)[0] == e.data_ptr() and list(_relpos.view_info(e)[2]) == [0, 0, 0, 1]


def test_numpy_arrays_reach_the_core_in_place():
    a = np.random.default_rng(1).standard_normal((2, 9, 3, 8)).transpose(0, 2, 1, 3)
    address, _, strides = _relpos.view_info(a)
    assert address == a.__array_interface__["data"][0]
    assert tuple(s * a.itemsize for s in strides) == a.strides


def test_forward_calls_hand_the_core_the_callers_storage(monkeypatch):
    """What relpos.forward / backward pass to the core is the caller's storage, not a copy."""
    seen = {}
    real_forward, real_backward = _relpos.forward, _relpos.backward

    def record(real):
        def wrapped(args):
            for name in ("q", "k", "v", "t5_table", "dout"):
                if name in args:
                    seen[name] = _relpos.view_info(args[name])[0]
            return real(args)
        return wrapped

    monkeypatch.setattr(_relpos, "forward", record(real_forward))
    monkeypatch.setattr(_relpos, "backward", record(real_backward))
    q, k, v = blhd_view(seed=1), blhd_view(seed=2), blhd_view(seed=3)
    table = torch.randn(8, 3, 32).transpose(0, 1)[:, 2]  # (H, 32), strided
    scheme = relpos.T5(table)
    out, lse = relpos.forward(q, k, v, scheme)
    for name, t in (("q", q), ("k", k), ("v", v), ("t5_table", table)):
        assert seen[name] == t.data_ptr(), name
    dout = blhd_view(seed=4)
    relpos.backward(q, k, v, out, lse, dout, scheme)
    assert seen["dout"] == dout.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_strided_torch_view_equals_contiguous_copy(dtype):
    q, k, v = (blhd_view(dtype=dtype, seed=s) for s in (5, 6, 7))
    wk = torch.randn(3, 9, 8, dtype=dtype)[:, ::2]  # (H, 2k+1=5, d) with a row step
    scheme = relpos.Shaw(k=2, wk=wk)
    out, lse = relpos.forward(q, k, v, scheme, causal=True)
    ref_out, ref_lse = relpos.forward(q.contiguous(), k.contiguous(), v.contiguous(),
                                      relpos.Shaw(k=2, wk=wk.contiguous()), causal=True)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_numpy_in_numpy_out_torch_in_torch_out():
    rng = np.random.default_rng(2)
    qn, kn, vn = (rng.standard_normal((1, 2, 5, 4)).astype(np.float32) for _ in range(3))
    out, lse = relpos.forward(qn, kn, vn, relpos.ALiBi(), causal=True)
    assert type(out) is np.ndarray and type(lse) is np.ndarray and out.dtype == np.float32
    grads = relpos.backward(qn, kn, vn, out, lse, np.ones_like(out), relpos.ALiBi(), causal=True)
    assert all(type(g) is np.ndarray for g in grads.values())

    qt, kt, vt = (torch.from_numpy(x) for x in (qn, kn, vn))
    slopes = torch.tensor(relpos.alibi_slopes(2), dtype=torch.float32)
    out_t, lse_t = relpos.forward(qt, kt, vt, relpos.ALiBi(slopes), causal=True)
    assert isinstance(out_t, torch.Tensor) and isinstance(lse_t, torch.Tensor) and out_t.dtype == torch.float32
    np.testing.assert_allclose(out_t.numpy(), out, rtol=1e-6, atol=1e-7)
    grads_t = relpos.backward(qt, kt, vt, out_t, lse_t, torch.ones_like(out_t), relpos.ALiBi(slopes), causal=True)
    assert set(grads_t) == {"q", "k", "v", "alibi_slopes"}
    assert all(isinstance(g, torch.Tensor) and g.dtype == torch.float32 for g in grads_t.values())
    for name in ("q", "k", "v"):
        np.testing.assert_allclose(grads_t[name].numpy(), grads[name], rtol=1e-5, atol=1e-6)


def test_torch_key_padding_mask_and_bad_tensors():
    q = blhd_view(B=2, L=6)
    pad = torch.tensor([[False] * 5 + [True], [True] * 6])
    out, lse = relpos.forward(q, q, q, key_padding=pad)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.isinf(lse[1]).all()
    ref, _ = relpos.forward(q[:1, :, :, :], q[:1, :, :5], q[:1, :, :5])
    torch.testing.assert_close(out[:1], ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"k: dtype must match q \(float16\)"):
        relpos.forward(q.to(torch.float16), q, q)
    with pytest.raises(ValueError, match="q: dtype must be float32, float64, bfloat16 or float16"):
        relpos.forward(q.to(torch.int32), q, q)
    with pytest.raises(ValueError, match="key_padding: dtype must be bool or uint8"):
        relpos.forward(q, q, q, key_padding=pad.to(torch.int32))
