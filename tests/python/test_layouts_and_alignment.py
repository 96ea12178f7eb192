"""The layout option ("blhd" read and written in place), q_offset="end" (queries at
the last key positions: KV-cache steps and bottom-right causal alignment), and the
module's one name for key padding. Each against the same call in the default layout
with explicit offsets, which the oracle tests cover."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import relpos
import relpos.torch as rt


def qkv(B=2, H=4, Hkv=2, Lq=5, Lk=9, d=3, seed=0):
    g = np.random.default_rng(seed)
    return (g.standard_normal((B, H, Lq, d)), g.standard_normal((B, Hkv, Lk, d)), g.standard_normal((B, Hkv, Lk, d)))


@pytest.mark.parametrize("scheme", [relpos.NoPosition(), relpos.ALiBi(), relpos.RoPE(dims=2),
                                    relpos.T5(np.linspace(-1, 1, 32).reshape(4, 8), bidirectional=False)])
def test_blhd_layout_equals_the_default_layout_numpy(scheme):
    q, k, v = qkv()
    out, lse = relpos.forward(q, k, v, scheme, causal=True, q_offset=4)
    blhd = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v)]
    out_blhd, lse_blhd = relpos.forward(*blhd, scheme, causal=True, q_offset=4, layout="blhd")
    assert out_blhd.shape == (2, 5, 4, 3) and out_blhd.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(out_blhd.transpose(0, 2, 1, 3), out)
    np.testing.assert_array_equal(lse_blhd, lse)
    dout = np.random.default_rng(1).standard_normal(out.shape)
    grads = relpos.backward(q, k, v, out, lse, dout, scheme, causal=True, q_offset=4)
    grads_blhd = relpos.backward(*blhd, out_blhd, lse_blhd, np.ascontiguousarray(dout.transpose(0, 2, 1, 3)), scheme,
                                 causal=True, q_offset=4, layout="blhd")
    for name in ("q", "k", "v"):
        np.testing.assert_array_equal(grads_blhd[name].transpose(0, 2, 1, 3), grads[name])
    assert relpos.available_algorithms(*blhd, scheme, causal=True, q_offset=4, layout="blhd") == \
        relpos.available_algorithms(q, k, v, scheme, causal=True, q_offset=4)


def test_blhd_layout_in_torch_with_autograd():
    q, k, v = (torch.tensor(x, requires_grad=True) for x in qkv(seed=2))
    out = rt.attention(q, k, v, relpos.ALiBi(), causal=True, q_offset="end")
    blhd = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
    out_blhd = rt.attention(*blhd, relpos.ALiBi(), causal=True, q_offset="end", layout="blhd")
    assert out_blhd.shape == (2, 5, 4, 3)
    torch.testing.assert_close(out_blhd.transpose(1, 2), out, rtol=0, atol=0)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(out_blhd, blhd, g.transpose(1, 2))):
        torch.testing.assert_close(b.transpose(1, 2), a, rtol=0, atol=0)
    with pytest.raises(ValueError, match="layout: must be one of bhld, blhd"):
        rt.attention(q, k, v, layout="bshd")


def test_q_offset_end_places_the_queries_at_the_last_key_positions():
    q, k, v = qkv(Lq=3, Lk=10)
    for k_offset in (0, 6):
        explicit = relpos.forward(q, k, v, relpos.ALiBi(), causal=True, q_offset=k_offset + 7, k_offset=k_offset)
        end = relpos.forward(q, k, v, relpos.ALiBi(), causal=True, q_offset="end", k_offset=k_offset)
        for a, b in zip(end, explicit):
            np.testing.assert_array_equal(a, b)
    # bottom-right causal: the last query sees every key, the first all but the last Lq - 1
    out, _ = relpos.forward(q, k, v, causal=True, q_offset="end")
    full, _ = relpos.forward(q[:, :, -1:], k, v)
    np.testing.assert_allclose(out[:, :, -1:], full, rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="q_offset='end': 12 queries cannot end with 10 keys"):
        relpos.forward(qkv(Lq=12, Lk=10)[0], k, v, q_offset="end")
    with pytest.raises(ValueError, match="q_offset: expected an integer or 'end'"):
        relpos.forward(q, k, v, q_offset="start")


def test_kv_cache_decoding_with_q_offset_end_equals_the_whole_sequence():
    """Token by token with the module and q_offset='end' over the growing keys equals
    one causal call on the whole sequence (T5 decoder buckets, grouped-query heads)."""
    torch.manual_seed(0)
    m = rt.RelativeMultiheadAttention(8, 4, "t5", num_kv_heads=2, t5_bidirectional=False).double()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    whole = m(x, causal=True)
    steps = [m(x[:, t:t + 1], x[:, :t + 1], causal=True, q_offset="end") for t in range(7)]
    torch.testing.assert_close(torch.cat(steps, 1), whole, rtol=1e-12, atol=1e-12)


def test_module_key_padding_has_one_name():
    torch.manual_seed(0)
    m = rt.RelativeMultiheadAttention(8, 2, "alibi").double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    out = m(x, key_padding=pad)
    with pytest.warns(DeprecationWarning, match="key_padding_mask is deprecated; pass key_padding"):
        old = m(x, key_padding_mask=pad)
    torch.testing.assert_close(old, out, rtol=0, atol=0)
    assert not torch.allclose(m(x), out)
    with pytest.raises(ValueError, match="pass one"):
        m(x, key_padding=pad, key_padding_mask=pad)


def test_backward_adds_into_given_arrays_in_place():
    q, k, v = qkv(seed=4)
    scheme = relpos.ALiBi(np.array([0.5, 0.25, 0.125, 0.0625]))
    out, lse = relpos.forward(q, k, v, scheme, causal=True)
    dout = np.random.default_rng(5).standard_normal(out.shape)
    fresh = relpos.backward(q, k, v, out, lse, dout, scheme, causal=True)
    base = np.random.default_rng(6).standard_normal((2, 4, 5, 3))
    dq = base.copy()
    dk_whole = np.zeros((2, 2, 12, 3))
    view = dk_whole[:, :, 3:]  # a strided view: written through
    slopes = np.ones(4)
    got = relpos.backward(q, k, v, out, lse, dout, scheme, causal=True,
                          add_into={"q": dq, "k": view, "alibi_slopes": slopes})
    assert got["q"] is dq and got["k"] is view and got["alibi_slopes"] is slopes
    np.testing.assert_allclose(dq, base + fresh["q"], rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(dk_whole[:, :, 3:], fresh["k"])
    np.testing.assert_allclose(slopes, 1 + fresh["alibi_slopes"], rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(got["v"], fresh["v"])
    with pytest.raises(ValueError, match=r"add_into\['q'\]: expected an array of shape \(2, 4, 5, 3\)"):
        relpos.backward(q, k, v, out, lse, dout, add_into={"q": np.zeros((2, 4, 5))})
