"""Attention dropout in relpos.gpu's Triton kernels (docs/design.md, "Attention dropout"),
run in Triton's interpreter as test_gpu.py runs them:

* the mask the kernels draw is relpos.dropout_mask's (the C++ kernels') bit for bit: with
  q = k = 0 every visible key has probability 1 / Lk and v = I, so out * Lk * (1 - p) is the
  kept mask itself; per key (16-key tiles, keys off the 64 grid) and per four keys (64-key
  tiles on the grid), grouped-query heads, positions that wrap at 2^32;
* every scheme's output and gradients with dropout against the float64 oracle applying that
  mask and against the C++ kernels with the same seed and offset;
* p = 0 is the call without dropout bit for bit, lse is the softmax's, the backward and a
  drawn rng repeat, relpos.gpu.gradients is the autograd's, bad arguments are refused by name.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest (conftest.py sets TRITON_INTERPRET=1)"

import relpos  # noqa: E402
from harness import Case, assert_close, assert_matches_oracle, make_problem, run_oracle, run_relpos  # noqa: E402
from test_gpu import dropout_rng, gpu, run_gpu  # noqa: E402

# 64-key tiles in the interpreter (its default is 16 x 16): the kernels then draw one Philox
# per four keys where the keys start on the 64 grid, as the GPU's 64 x 64 tiles do.
WIDE_KEYS = (16, 64)
SQUARE_64 = (64, 64)  # the tables per distance need BM + BN a power of two


@pytest.fixture
def tiles(monkeypatch):
    """Sets the interpreter's tiles (BM, BN) for the test."""
    from relpos.gpu import config

    def use(shape):
        monkeypatch.setattr(config, "INTERPRETER", config.Launch(*shape, 4, 1))

    return use


def float32(*shape):
    return torch.zeros(*shape, dtype=torch.float32)


@pytest.mark.parametrize("B, H, Hkv, Lq, Lk, p, q_offset, k_offset, seed, offset, shape, per_4_keys", [
    (2, 4, 2, 37, 45, 0.3, 29, 13, -0x123456789ABCDEF, -5, None, False),  # GQA, keys off the grid, 16-key tiles
    (2, 2, 1, 20, 150, 0.7, 2**32 - 3, 2**32 - 64, 0x7EDCBA9876543210, 977, WIDE_KEYS, True),  # wrap past 2^32
    (1, 3, 3, 18, 130, 0.5, 5, 100, 12345, 0, WIDE_KEYS, False),  # 64-key tiles off the grid: per key
])
def test_the_kernels_draw_relpos_dropout_mask(B, H, Hkv, Lq, Lk, p, q_offset, k_offset, seed, offset, shape,
                                              per_4_keys, tiles):
    from relpos.gpu import config, dropout

    if shape:
        tiles(shape)
    assert (dropout.mode(p, k_offset, config.INTERPRETER.block_n) == dropout.PER_4_KEYS) == per_4_keys
    v = torch.eye(Lk, dtype=torch.float32).expand(B, Hkv, Lk, Lk).contiguous()
    out = gpu().attention(float32(B, H, Lq, 16), float32(B, Hkv, Lk, 16), v, q_offset=q_offset, k_offset=k_offset,
                          dropout_p=p, dropout_rng=torch.tensor([seed, offset]))
    revealed = (out * Lk * (1 - p)).double().numpy()
    kept = np.round(revealed)
    assert np.abs(revealed - kept).max() < 1e-4 and set(np.unique(kept)) <= {0.0, 1.0}
    expected = relpos.dropout_mask(seed % 2**64, offset % 2**32, B, H, Lq, Lk, p, q_offset=q_offset,
                                   k_offset=k_offset)
    assert np.array_equal(kept == 1, expected)


C = Case
SCHEME_CASES = [
    (C("gd-none-causal", "none", Lq=37, Lk=37, causal=True, dropout_p=0.3), None),
    (C("gd-alibi-pad", "alibi", Lq=33, Lk=33, padding="random", opts={"learn": True}, dropout_p=0.2), None),
    (C("gd-t5-cross-offsets", "t5", Lq=20, Lk=45, q_offset=70, k_offset=40, opts={"num_buckets": 16,
                                                                                 "max_distance": 40},
       dropout_p=0.3), None),
    (C("gd-kerple-causal-pad", "kerple", Lq=30, Lk=30, causal=True, padding="random", dropout_p=0.4), None),
    (C("gd-kerple_power-cross", "kerple_power", Lq=40, Lk=25, q_offset=3, k_offset=11, dropout_p=0.3), None),
    (C("gd-rope-causal", "rope", Lq=21, Lk=50, q_offset=29, causal=True, opts={"dims": 8, "style": "interleaved"},
       dropout_p=0.3), None),
    (C("gd-xl-memory", "xl", Lq=20, Lk=45, q_offset=25, causal=True, opts={"pos_dim": 12, "clamp_len": 7},
       dropout_p=0.3), None),
    (C("gd-shaw-kv-causal-pad", "shaw", Lq=37, Lk=37, causal=True, padding="random",
       opts={"k": 5, "per_head": True, "tables": "kv"}, dropout_p=0.3), None),
    (C("gd-deberta-cross-pad", "deberta", Lq=21, Lk=50, q_offset=29, padding="batch",
       opts={"position_buckets": 8, "max_relative_positions": 20, "per_head": True}, dropout_p=0.3), None),
    # per four keys: 64-key tiles from key position 0 (a plain call, tables of both kinds)
    (C("gd-none-wide", "none", B=1, Lq=40, Lk=150, causal=True, q_offset=110, dropout_p=0.5), WIDE_KEYS),
    (C("gd-shaw-v-64", "shaw", B=1, Lq=70, Lk=130, q_offset=60, causal=True, padding="random",
       opts={"k": 40, "tables": "v", "beyond": "zero"}, dropout_p=0.3), SQUARE_64),
    (C("gd-deberta-64", "deberta", B=1, Lq=70, Lk=130, padding="random",
       opts={"position_buckets": 16, "max_relative_positions": 64}, dropout_p=0.2), SQUARE_64),
]


@pytest.mark.parametrize("case, shape", SCHEME_CASES, ids=[c.id for c, _ in SCHEME_CASES])
def test_every_scheme_with_dropout_matches_the_oracle_and_the_cpu_kernels(case, shape, tiles):
    """Forward and every gradient (q, k, v, the positional parameters) in float32 against the
    float64 oracle with relpos.dropout_mask's mask, and against the C++ kernels (float32, same
    seed and offset) within two float32 tolerances: a single entry drawn otherwise moves a
    result by a probability's share (about 1e-2 here), far beyond them."""
    if shape:
        tiles(shape)
    pb = make_problem(case)
    mask = pb.dropout_mask()
    assert not mask.all() and mask.any()
    got = run_gpu(pb)
    assert_matches_oracle(got, run_oracle(pb), np.float32)
    cpu = run_relpos(pb, np.float32)
    for name, ref in cpu.items():
        finite = np.isfinite(ref)
        assert_close(name, got[name], ref, np.float32,
                     magnitude=2 * max(float(np.abs(ref[finite]).max(initial=0.0)), 1.0))


def _call(dropout_p=0.0, rng=None, dtype=torch.float32, grads=True):
    """A T5 call with padding and offsets: (out, lse, dq, dk, dv, dtable)."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 2, n, 16, generator=g, dtype=dtype).requires_grad_() for n in (25, 40, 40))
    table = torch.randn(2, 16, generator=g, dtype=dtype).requires_grad_()
    padding = torch.rand(2, 40, generator=g) < 0.2
    extra = {} if rng is None else {"dropout_rng": rng}
    out, lse = gpu().attention(q, k, v, relpos.T5(table, max_distance=40), key_padding=padding, q_offset=9,
                               k_offset=3, dropout_p=dropout_p, return_lse=True, **extra)
    if not grads:
        return out, lse
    out.backward(torch.randn(out.shape, generator=g, dtype=dtype))
    return out.detach(), lse, q.grad, k.grad, v.grad, table.grad


def test_probability_zero_is_the_call_without_dropout_bit_for_bit():
    plain = _call()
    for result in (_call(0.0, torch.tensor([5, 6])), _call(0)):
        for a, b in zip(plain, result):
            assert torch.equal(a, b)


def test_lse_is_the_softmaxs_and_the_backward_repeats_bit_for_bit():
    plain = _call(grads=False)
    rng = torch.tensor([-7, 2**40 + 3])  # the offset is the low 32 bits
    first, second = _call(0.25, rng), _call(0.25, rng.clone())
    assert torch.equal(first[1], plain[1]) and not torch.allclose(first[0], plain[0], atol=1e-3)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    assert torch.equal(_call(0.25, torch.tensor([-7, 3]), grads=False)[0], first[0])


def test_a_drawn_rng_follows_torchs_generator():
    torch.manual_seed(3)
    first = _call(0.25, grads=False)[0]
    torch.manual_seed(3)
    assert torch.equal(_call(0.25, grads=False)[0], first)
    assert not torch.equal(_call(0.25, grads=False)[0], first)


def test_gradients_with_dropout_are_the_autograds():
    """relpos.gpu.gradients (ring attention's backward) with the forward's rng: the gradients
    autograd takes through relpos.gpu.attention, bit for bit."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g, dtype=torch.float32).requires_grad_() for n in (20, 30, 30))
    rng = dropout_rng(2**64 - 99, 12)
    out, lse = gpu().attention(q, k, v, causal=True, q_offset="end", dropout_p=0.4, dropout_rng=rng, return_lse=True)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float32)
    out.backward(dout)
    grads = gpu().gradients(q, k, v, out.detach(), lse, dout, causal=True, q_offset="end", dropout_p=0.4,
                            dropout_rng=rng)
    for name, x in (("q", q), ("k", k), ("v", v)):
        assert torch.equal(grads[name], x.grad), name
    with pytest.raises(ValueError, match="dropout_rng: the gradients of a call with dropout need"):
        gpu().gradients(q, k, v, out.detach(), lse, dout, dropout_p=0.4)


def test_grouped_query_heads_with_dropout_match_the_cpu_kernels():
    """Query head h of a key head's group draws its own mask (keyed by h, not the key head), and
    the key head's gradients sum its query heads': against relpos.forward / backward in float64."""
    g = torch.Generator().manual_seed(8)
    B, H, Hkv, Lq, Lk, d = 2, 4, 2, 29, 35, 16
    q, k, v, dout = (torch.randn(*s, generator=g, dtype=torch.float32)
                     for s in ((B, H, Lq, d), (B, Hkv, Lk, d), (B, Hkv, Lk, d), (B, H, Lq, d)))
    seed, offset, p = 0xFEDCBA9876543210, 77, 0.3
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = gpu().attention(*leaves, causal=True, q_offset="end", dropout_p=p, dropout_rng=dropout_rng(seed, offset))
    out.backward(dout)
    kw = dict(causal=True, q_offset=Lk - Lq, dropout_p=p, dropout_seed=seed, dropout_offset=offset)
    arrays = [x.double().numpy() for x in (q, k, v)]
    ref_out, ref_lse = relpos.forward(*arrays, None, **kw)
    ref = relpos.backward(*arrays, ref_out, ref_lse, dout.double().numpy(), None, **kw)
    for got, want in ((out.detach(), ref_out), *((x.grad, ref[n]) for x, n in zip(leaves, "qkv"))):
        assert np.abs(got.double().numpy() - want).max() <= 2e-5 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("kwargs, message", [
    (dict(dropout_p=1.0), r"dropout_p: must be a number in \[0, 1\)"),
    (dict(dropout_p=-0.1), r"dropout_p: must be a number in \[0, 1\)"),
    (dict(dropout_p=math.nan), r"dropout_p: must be a number in \[0, 1\)"),
    (dict(dropout_p=True), "dropout_p: must be a number"),
    (dict(dropout_p="0.1"), "dropout_p: must be a number"),
    (dict(dropout_p=torch.tensor(0.1)), "dropout_p: must be a number"),
    (dict(dropout_p=0.1, dropout_rng=torch.tensor([1, 2], dtype=torch.int32)), "dropout_rng: expected an int64"),
    (dict(dropout_p=0.1, dropout_rng=torch.tensor([1, 2, 3])), "dropout_rng: expected an int64 tensor"),
    (dict(dropout_p=0.1, dropout_rng=(1, 2)), "dropout_rng: expected an int64 tensor .* got tuple"),
    (dict(dropout_p=0.1, dropout_rng=torch.tensor([1, 2], device="meta")), "dropout_rng: .* on meta"),
])
def test_bad_dropout_arguments_are_refused_by_name(kwargs, message):
    q = float32(1, 2, 4, 16)
    with pytest.raises(ValueError, match=message):
        gpu().attention(q, q, q, **kwargs)
