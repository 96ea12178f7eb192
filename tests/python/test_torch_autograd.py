"""relpos.torch: autograd through the library (gradcheck by central differences in
float64) and RelativeMultiheadAttention against the same module computed with the
independent torch oracle and torch autograd."""
from __future__ import annotations

import pytest
import torch

import relpos
import relpos.torch as rt
import torch_oracle

# (scheme, call options, parameter shapes) on B=1, H=2, Lq=4, Lk=5, d=3: small enough
# for gradcheck's two evaluations per input element.
GRADCHECK = [
    ("none", dict(causal=True), {}),
    ("shaw", dict(q_offset=1), {"wk": (5, 3), "wv": (2, 5, 3)}),
    ("t5", dict(causal=True, scale=1.0, q_offset=1), {"table": (2, 8)}),
    ("alibi", dict(), {"slopes": (2,)}),
    ("rope", dict(k_offset=2), {}),
    ("xl", dict(causal=True, q_offset=1), {"u": (2, 3), "v": (2, 3), "w_r": (2, 3, 4)}),
    ("kerple", dict(causal=True, q_offset=1), {"r1": (2,), "r2": (2,)}),
    ("kerple_power", dict(causal=True, q_offset=1), {"r1": (2,), "r2": (2,)}),
    # buckets 4, max 6: distances 0-2 exact, 3-5 logarithmic, edge rows past (keys 5 away from queries)
    ("deberta", dict(causal=False, q_offset=1), {"c2p": (8, 3), "p2c": (2, 8, 3)}),
]


def scheme_of(name: str, params: dict):
    return {
        "none": lambda: relpos.NoPosition(),
        "shaw": lambda: relpos.Shaw(k=2, **params),
        "t5": lambda: relpos.T5(params["table"], bidirectional=False, max_distance=6),
        "alibi": lambda: relpos.ALiBi(params["slopes"]),
        "rope": lambda: relpos.RoPE(dims=2),
        "xl": lambda: relpos.TransformerXL(params["u"], params["v"], params["w_r"]),
        "kerple": lambda: relpos.KERPLE(params["r1"], params["r2"]),
        "kerple_power": lambda: relpos.KERPLEPower(params["r1"], params["r2"]),
        "deberta": lambda: relpos.DeBERTa(**params, position_buckets=4, max_relative_positions=6),
    }[name]()


@pytest.mark.parametrize("name,call,shapes", GRADCHECK, ids=[g[0] for g in GRADCHECK])
def test_gradcheck_float64(name, call, shapes):
    g = torch.Generator().manual_seed(len(name))
    q = torch.randn(1, 2, 4, 3, generator=g, requires_grad=True)
    k, v = (torch.randn(1, 2, 5, 3, generator=g, requires_grad=True) for _ in range(2))
    params = {n: (0.5 * torch.randn(s, generator=g)).requires_grad_() for n, s in shapes.items()}
    if name == "alibi":
        params["slopes"] = torch.rand(2, generator=g).add(0.1).requires_grad_()
    if name in ("kerple", "kerple_power"):  # r1, r2 > 0 (and r2 <= 2 for the power)
        params = {n: torch.rand(2, generator=g).add(0.2).requires_grad_() for n in ("r1", "r2")}
    names = list(params)

    def f(q, k, v, *ps):
        return rt.attention(q, k, v, scheme_of(name, dict(zip(names, ps))), **call)

    assert torch.autograd.gradcheck(f, (q, k, v, *params.values()), eps=1e-6, atol=1e-7, rtol=1e-5)


def oracle_module_forward(m: rt.RelativeMultiheadAttention, x, kv, *, causal, key_padding, mems=None):
    """The module's computation with torch_oracle.attention in place of the relpos kernels."""
    q_offset = 0
    if mems is not None:
        kv = torch.cat([mems.detach(), kv], 1)
        q_offset = mems.shape[1]
        if key_padding is not None:
            key_padding = torch.cat([key_padding.new_zeros(x.shape[0], mems.shape[1]), key_padding], 1)
    heads = m._heads
    q, k, v = heads(m.q_proj(x)), heads(m.k_proj(kv)), heads(m.v_proj(kv))
    s = m.position_scheme()
    opts, params = {}, {}
    if m.scheme == "shaw":
        opts = dict(k=s.k, beyond=s.beyond)
        params = {n: p for n, p in (("shaw_wk", s.wk), ("shaw_wv", s.wv)) if p is not None}
    elif m.scheme == "t5":
        opts, params = dict(bidirectional=s.bidirectional, max_distance=s.max_distance), {"t5_table": s.table}
    elif m.scheme == "alibi" and s.slopes is not None:
        params = {"alibi_slopes": s.slopes}
    elif m.scheme == "rope":
        opts = dict(base=s.base, dims=s.dims, style=s.style)
    elif m.scheme == "xl":
        opts, params = dict(clamp_len=s.clamp_len), {"xl_u": s.u, "xl_v": s.v, "xl_w_r": s.w_r}
    elif m.scheme in ("kerple", "kerple_power"):
        params = {f"{m.scheme}_r1": s.r1, f"{m.scheme}_r2": s.r2}
    elif m.scheme == "deberta":
        opts = dict(position_buckets=s.position_buckets, max_relative_positions=s.max_relative_positions)
        params = {f"deberta_{n}": t for n, t in (("c2p", s.c2p), ("p2c", s.p2c)) if t is not None}
    out, _ = torch_oracle.attention(q, k, v, m.scheme, opts, params, causal=causal, key_padding=key_padding,
                                    q_offset=q_offset, scale=m.scale)
    B, _, Lq, _ = out.shape
    return m.out_proj(out.transpose(1, 2).reshape(B, Lq, -1))


MODULES = [
    ("shaw-kv-shared", dict(scheme="shaw", shaw_k=3), dict(causal=True)),
    ("shaw-k-perhead", dict(scheme="shaw", shaw_k=2, shaw_tables="k", shaw_per_head=True), dict(pad=True)),
    ("shaw-tied", dict(scheme="shaw", shaw_k=2, shaw_tied=True), dict()),
    ("t5-encoder", dict(scheme="t5", t5_num_buckets=8, t5_max_distance=10, scale=1.0), dict(pad=True)),
    ("t5-decoder", dict(scheme="t5", t5_bidirectional=False, t5_num_buckets=8, t5_max_distance=10), dict(causal=True)),
    ("alibi", dict(scheme="alibi"), dict(causal=True)),
    ("alibi-learnable", dict(scheme="alibi", alibi_learnable=True, head_dim=5), dict()),
    ("rope", dict(scheme="rope", rope_dims=4, rope_style="interleaved"), dict(causal=True)),
    ("xl-mems", dict(scheme="xl", xl_pos_dim=6, xl_clamp_len=4), dict(causal=True, mems=3)),
    ("none-cross", dict(scheme="none", kdim=7, vdim=7), dict(cross=7, pad=True)),
    ("kerple", dict(scheme="kerple"), dict(causal=True, pad=True)),
    ("kerple_power", dict(scheme="kerple_power"), dict(causal=True, pad=True)),
    ("deberta-shared", dict(scheme="deberta", deberta_position_buckets=4, deberta_max_relative_positions=5),
     dict(pad=True)),
    ("deberta-p2c-perhead", dict(scheme="deberta", deberta_position_buckets=-1, deberta_max_relative_positions=3,
                                 deberta_pos_att_type="p2c", deberta_per_head=True), dict(causal=True)),
]


@pytest.mark.parametrize("mid,ctor,call", MODULES, ids=[m[0] for m in MODULES])
def test_module_matches_oracle_and_autograd(mid, ctor, call):
    torch.manual_seed(len(mid))
    E, H, B, L = 12, 3, 2, 6
    m = rt.RelativeMultiheadAttention(E, H, **ctor)
    x = torch.randn(B, L, E, requires_grad=True)
    kv = torch.randn(B, 9, call["cross"], requires_grad=True) if "cross" in call else x
    Lk = kv.shape[1]
    pad = (torch.rand(B, Lk) < 0.3) if call.get("pad") else None
    mems = torch.randn(B, call["mems"], E) if "mems" in call else None
    kw = dict(causal=call.get("causal", False), key_padding=pad, mems=mems)

    got = m(x, kv if "cross" in call else None, **kw)
    ref = oracle_module_forward(m, x, kv, **kw)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)

    dy = torch.randn_like(got)
    leaves = [x] + ([kv] if "cross" in call else []) + list(m.parameters())
    g_got = torch.autograd.grad(got, leaves, dy)
    g_ref = torch.autograd.grad(ref, leaves, dy, allow_unused=True)
    names = ["x"] + (["kv"] if "cross" in call else []) + [n for n, _ in m.named_parameters()]
    for n, a, b in zip(names, g_got, g_ref):
        torch.testing.assert_close(a, b if b is not None else torch.zeros_like(a), rtol=1e-9, atol=1e-10, msg=n)


def test_kerple_module_clamps_its_parameters_at_the_floor():
    """A KERPLE parameter stepped below KERPLE_MIN acts as KERPLE_MIN and gets no gradient;
    the others still learn."""
    torch.manual_seed(3)
    m = rt.RelativeMultiheadAttention(8, 2, "kerple")
    x = torch.randn(1, 5, 8)
    with torch.no_grad():
        m.kerple_r1[0] = -1.0
    y = m(x, causal=True)
    with torch.no_grad():
        m.kerple_r1[0] = rt.KERPLE_MIN
    torch.testing.assert_close(y, m(x, causal=True), rtol=0, atol=0)
    with torch.no_grad():
        m.kerple_r1[0] = -1.0
    m(x, causal=True).square().sum().backward()
    assert m.kerple_r1.grad[0] == 0 and m.kerple_r1.grad[1] != 0 and (m.kerple_r2.grad != 0).all()


def test_kerple_power_module_clamps_its_exponent_into_its_range():
    """The power variant's r2 stepped above 2 acts as 2 and gets no gradient; r1 still learns."""
    torch.manual_seed(4)
    m = rt.RelativeMultiheadAttention(8, 2, "kerple_power")
    x = torch.randn(1, 6, 8)
    with torch.no_grad():
        m.kerple_power_r2[0] = 3.0
    y = m(x, causal=True)
    with torch.no_grad():
        m.kerple_power_r2[0] = 2.0
    torch.testing.assert_close(y, m(x, causal=True), rtol=0, atol=0)
    with torch.no_grad():
        m.kerple_power_r2[0] = 3.0
    m(x, causal=True).square().sum().backward()
    assert m.kerple_power_r2.grad[0] == 0 and m.kerple_power_r2.grad[1] != 0 and (m.kerple_power_r1.grad != 0).all()


def test_module_float32_and_bad_configuration():
    torch.manual_seed(0)
    m = rt.RelativeMultiheadAttention(16, 4, "xl").float()
    x = torch.randn(2, 5, 16, dtype=torch.float32)
    y = m(x, causal=True)
    assert y.dtype == torch.float32 and y.shape == (2, 5, 16)
    with pytest.raises(ValueError, match="scheme: must be one of"):
        rt.RelativeMultiheadAttention(16, 4, "sinusoid")
    with pytest.raises(ValueError, match="not divisible"):
        rt.RelativeMultiheadAttention(10, 4)
    with pytest.raises(ValueError, match="shaw_wk: expected a torch tensor"):
        import numpy as np
        rt.attention(x.view(2, 5, 4, 4), x.view(2, 5, 4, 4), x.view(2, 5, 4, 4), relpos.Shaw(1, wk=np.zeros((3, 4))))
