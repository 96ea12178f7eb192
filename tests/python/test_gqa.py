"""Grouped-query and multi-query attention: k and v with Hkv heads, Hkv dividing H.

Every scheme, mask and algorithm that serves the case, forward and every gradient,
against the independent torch oracle run on k and v repeated per query head
(``repeat_interleave``, so torch autograd sums dk and dv over each group), float64;
and the same bits on a second run."""
from __future__ import annotations

import pytest
import torch

import relpos
import relpos.torch as rt
import torch_oracle

B, H, D = 2, 4, 5

SCHEMES = [
    ("none", {}, {}),
    ("shaw", dict(k=3, beyond="clip"), {"shaw_wk": (7, D), "shaw_wv": (H, 7, D)}),
    ("t5", dict(bidirectional=True, max_distance=20), {"t5_table": (H, 12)}),
    ("alibi", {}, {"alibi_slopes": (H,)}),
    ("rope", dict(base=100.0, dims=4, style="interleaved"), {}),
    ("xl", dict(clamp_len=0), {"xl_u": (H, D), "xl_v": (H, D), "xl_w_r": (H, D, 6)}),
    # p2c is read by the key: each query head's table meets its group's shared key head
    ("deberta", dict(position_buckets=4, max_relative_positions=6), {"deberta_c2p": (8, D), "deberta_p2c": (H, 8, D)}),
]
MASKS = ["none", "causal", "padding"]


def record(name: str, opts: dict, params: dict):
    return {
        "none": lambda: relpos.NoPosition(),
        "shaw": lambda: relpos.Shaw(k=opts["k"], wk=params["shaw_wk"], wv=params["shaw_wv"], beyond=opts["beyond"]),
        "t5": lambda: relpos.T5(params["t5_table"], bidirectional=opts["bidirectional"],
                                max_distance=opts["max_distance"]),
        "alibi": lambda: relpos.ALiBi(params["alibi_slopes"]),
        "rope": lambda: relpos.RoPE(base=opts["base"], dims=opts["dims"], style=opts["style"]),
        "xl": lambda: relpos.TransformerXL(params["xl_u"], params["xl_v"], params["xl_w_r"],
                                           clamp_len=opts["clamp_len"]),
        "deberta": lambda: relpos.DeBERTa(c2p=params["deberta_c2p"], p2c=params["deberta_p2c"], **opts),
    }[name]()


def inputs(name: str, shapes: dict, hkv: int, L: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, hkv, L, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    params = {n: (0.5 * torch.randn(s, generator=g, dtype=torch.float64)).requires_grad_() for n, s in shapes.items()}
    if name == "alibi":
        params["alibi_slopes"] = torch.rand(H, generator=g, dtype=torch.float64).add(0.1).requires_grad_()
    return q, k, v, params


def grads(out, tensors):
    g = torch.Generator().manual_seed(7)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)  # the same values in any dtype
    return torch.autograd.grad(out, tensors, dout)


@pytest.mark.parametrize("hkv", [1, 2], ids=["mqa", "gqa2"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("name,opts,shapes", SCHEMES, ids=[s[0] for s in SCHEMES])
def test_grouped_query_attention_equals_the_oracle_on_repeated_heads(name, opts, shapes, mask, hkv):
    L = 9
    q, k, v, params = inputs(name, shapes, hkv, L, seed=hash((name, mask, hkv)) % 1000)
    padding = None
    if mask == "padding":
        padding = torch.zeros(B, L, dtype=torch.bool)
        padding[1, -3:] = True
    causal = mask == "causal"
    tensors = (q, k, v, *params.values())
    group = H // hkv
    expected_out, _ = torch_oracle.attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), name,
                                             opts, params, causal=causal, key_padding=padding, q_offset=2)
    expected = grads(expected_out, tensors)
    scheme = record(name, opts, params)
    constants = record(name, opts, {n: p.detach() for n, p in params.items()})
    algorithms = relpos.available_algorithms(q.detach(), k.detach(), v.detach(), constants, causal=causal,
                                             key_padding=padding, q_offset=2)
    assert "fused" in algorithms and "reference" in algorithms
    for algorithm in algorithms:
        out = rt.attention(q, k, v, scheme, causal=causal, key_padding=padding, q_offset=2, algorithm=algorithm)
        torch.testing.assert_close(out, expected_out, rtol=1e-12, atol=1e-12, msg=f"{algorithm}: out")
        got = grads(out, tensors)
        for what, a, e in zip(["q", "k", "v", *params], got, expected):
            assert a.shape == e.shape
            torch.testing.assert_close(a, e, rtol=1e-11, atol=1e-11, msg=f"{algorithm}: d{what}")
        again = grads(rt.attention(q, k, v, scheme, causal=causal, key_padding=padding, q_offset=2,
                                   algorithm=algorithm), tensors)
        assert all(torch.equal(a, b) for a, b in zip(got, again)), f"{algorithm}: a second run differs"


def test_multi_tile_grouped_query_backward_in_float32():
    """Fused over several tiles with one key head (MQA), float32, against float64."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 300, 16, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 1, 300, 16, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out64 = torch_oracle.attention(q, k.expand(1, 4, 300, 16), v.expand(1, 4, 300, 16), "alibi", {}, {},
                                   causal=True)[0]
    expected = grads(out64, (q, k, v))
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    out = rt.attention(*leaves, relpos.ALiBi(), causal=True)
    got = grads(out, leaves)
    torch.testing.assert_close(out.double(), out64, rtol=0, atol=2e-5)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a.double(), e, rtol=0, atol=2e-4 * max(1.0, e.abs().max().item()))


def test_key_heads_that_do_not_divide_the_query_heads_are_refused():
    q = torch.randn(1, 4, 3, 2)
    k = v = torch.randn(1, 3, 3, 2)
    with pytest.raises(ValueError, match="Hkv=3 must divide q's H=4"):
        rt.attention(q, k, v)
    with pytest.raises(ValueError, match="v"):
        rt.attention(q, torch.randn(1, 2, 3, 2), torch.randn(1, 1, 3, 2))


@pytest.mark.parametrize("scheme", ["t5", "rope", "xl"])
def test_module_with_fewer_key_heads_equals_one_with_repeated_key_projections(scheme):
    """num_kv_heads=2 of 4 equals a multi-head module whose key and value projections
    repeat each key head's rows for its two query heads; input gradients too."""
    torch.manual_seed(0)
    grouped = rt.RelativeMultiheadAttention(16, 4, scheme, num_kv_heads=2).double()
    full = rt.RelativeMultiheadAttention(16, 4, scheme).double()
    full.load_state_dict({n: p for n, p in grouped.state_dict().items() if not n.startswith(("k_proj", "v_proj"))},
                         strict=False)
    d = grouped.head_dim
    for name in ("k_proj", "v_proj"):
        src, dst = getattr(grouped, name), getattr(full, name)
        with torch.no_grad():
            dst.weight.copy_(src.weight.view(2, 1, d, 16).expand(2, 2, d, 16).reshape(4 * d, 16))
            dst.bias.copy_(src.bias.view(2, 1, d).expand(2, 2, d).reshape(4 * d))
    x = torch.randn(2, 11, 16, dtype=torch.float64, requires_grad=True)
    y_grouped, y_full = grouped(x, causal=True), full(x, causal=True)
    torch.testing.assert_close(y_grouped, y_full, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(y_full)
    torch.testing.assert_close(torch.autograd.grad(y_grouped, x, g)[0], torch.autograd.grad(y_full, x, g)[0],
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="num_kv_heads: must divide num_heads 4"):
        rt.RelativeMultiheadAttention(16, 4, scheme, num_kv_heads=3)
