"""relpos attention as a registered torch op: torch.compile(fullgraph=True),
torch.export, torch.jit.trace and torch.vmap see one op and give the eager
results (eager calls run the op's body without its dispatch, the same bits); double
backward is refused with a clear error."""
import pytest
import torch

import relpos
import relpos.torch as rt


def model(scheme: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return rt.RelativeMultiheadAttention(32, 4, scheme, **kw).double()


CONFIGS = [("shaw", dict(shaw_k=3, shaw_per_head=True)), ("t5", dict(t5_bidirectional=False)),
           ("alibi", dict(alibi_learnable=True)), ("rope", dict(rope_dims=4)), ("xl", dict(xl_clamp_len=5)),
           ("kerple", {}), ("kerple_power", {}),
           ("deberta", dict(deberta_position_buckets=4, deberta_max_relative_positions=6, deberta_per_head=True))]


class Causal(torch.nn.Module):
    """A module calling relpos with keyword options, as model code does."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x, pad):
        return self.inner(x, causal=True, key_padding=pad)


def inputs():
    torch.manual_seed(1)
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    pad = torch.zeros(2, 11, dtype=torch.bool)
    pad[1, -3:] = True
    return x, pad


def output_and_grads(fn, m, x, pad):
    """fn(x, pad) and the gradients it leaves on m's parameters."""
    m.zero_grad()
    y = fn(x, pad)
    y.square().sum().backward()
    return y.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("scheme,kw", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_compile_fullgraph_equals_eager_with_gradients(scheme, kw):
    m = Causal(model(scheme, **kw))
    x, pad = inputs()
    want_y, want_g = output_and_grads(m, m, x, pad)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    got_y, got_g = output_and_grads(compiled, m, x, pad)
    torch.testing.assert_close(got_y, want_y, rtol=0, atol=0)
    for name, g in want_g.items():
        torch.testing.assert_close(got_g[name], g, rtol=1e-12, atol=1e-12, msg=name)


def test_compile_with_inductor_has_no_graph_break():
    # relpos on its default threads. This graph's transpose after the op
    # aborted the process when inductor's cache held its kernel from a run
    # under ATEN_CPU_CAPABILITY=avx2 (8-lane stores reused with 16-lane
    # vectors); scripts/test.sh gives each stage its own cache (README, Limitations).
    m = Causal(model("shaw", shaw_k=3)).float()
    x, pad = inputs()
    x = x.float()
    explanation = torch._dynamo.explain(m)(x, pad)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    got = torch.compile(m, fullgraph=True)(x, pad)
    torch.testing.assert_close(got, m(x, pad), rtol=1e-5, atol=1e-5)


def test_export_runs_the_op():
    m = Causal(model("t5"))
    x, pad = inputs()
    ep = torch.export.export(m, (x, pad))
    assert any("relpos.attention_forward" in str(n.target) for n in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(x, pad), m(x, pad), rtol=0, atol=0)


def test_jit_trace_keeps_working():
    m = Causal(model("alibi"))
    x, pad = inputs()
    traced = torch.jit.trace(m, (x, pad))
    torch.testing.assert_close(traced(x, pad), m(x, pad), rtol=0, atol=0)


def test_eager_calls_run_the_op_bodies_with_the_ops_results(monkeypatch):
    """An eager call runs the ops' bodies through one autograd.Function (the registered ops'
    Python dispatch cost more host time than a decode step's kernels); sent through the
    registered ops instead (every call seen as traced), it gives the same bits: the output and
    the gradients of the input and of every parameter, Shaw's tables and DeBERTa's included."""
    from relpos.torch import ops

    x, pad = inputs()

    def run(scheme, kw):
        m = Causal(model(scheme, **kw))
        xx = x.clone().requires_grad_()
        out = m(xx, pad)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
        return [out.detach(), xx.grad, *(p.grad for p in m.parameters())]

    def refused(*_):
        raise AssertionError("an eager call reached a registered op")

    for scheme, kw in (CONFIGS[0], CONFIGS[-1]):
        with monkeypatch.context() as m:
            m.setattr(ops, "traced", lambda tensors: True)
            want = run(scheme, kw)
        with monkeypatch.context() as m:
            m.setattr(ops, "attention_forward", refused)
            m.setattr(ops, "attention_backward", refused)
            got = run(scheme, kw)
        assert len(got) == len(want) > 3 and all(g is not None for g in got)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    # Without a gradient (the body alone) and with only some tensors learning.
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, 9, 4, dtype=torch.float64) for _ in range(3))
    table = torch.randn(2, 8, dtype=torch.float64)
    scheme = relpos.T5(table, bidirectional=False)

    def t5(q, k, v):
        return rt.attention(q, k, v, scheme, causal=True)

    with monkeypatch.context() as m:
        m.setattr(ops, "traced", lambda tensors: True)
        want_plain = t5(q, k, v)
        qg = q.clone().requires_grad_()
        want_grad = torch.autograd.grad(t5(qg, k, v).sum(), qg)[0]
    with monkeypatch.context() as m:
        m.setattr(ops, "attention_forward", refused)
        m.setattr(ops, "attention_backward", refused)
        with torch.no_grad():
            assert torch.equal(t5(q, k, v), want_plain)
        with torch.inference_mode():
            assert torch.equal(t5(q, k, v), want_plain)
        qg = q.clone().requires_grad_()
        out = t5(qg, k, v)
        assert torch.equal(out.detach(), want_plain)
        assert torch.equal(torch.autograd.grad(out.sum(), qg)[0], want_grad)


def test_vmap_folds_the_mapped_dimension_into_the_batch():
    torch.manual_seed(2)
    q, k, v = (torch.randn(3, 2, 4, 9, 8, dtype=torch.float64) for _ in range(3))
    table = torch.randn(4, 8, dtype=torch.float64)

    def f(q, k, v):
        return rt.attention(q, k, v, relpos.T5(table, bidirectional=False), causal=True, scale=1.0)

    got = torch.vmap(f)(q, k, v)
    want = torch.stack([f(q[i], k[i], v[i]) for i in range(3)])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # k and v shared by every mapped q
    got = torch.vmap(f, in_dims=(0, None, None))(q, k[0], v[0])
    torch.testing.assert_close(got, torch.stack([f(q[i], k[0], v[0]) for i in range(3)]), rtol=0, atol=0)


def test_vmap_over_positional_parameters_is_refused():
    q = k = v = torch.randn(2, 4, 9, 8)
    tables = torch.randn(3, 4, 8)
    with pytest.raises(ValueError, match="vmap over the scheme's parameters"):
        torch.vmap(lambda t: rt.attention(q, k, v, relpos.T5(t)))(tables)


def test_double_backward_is_refused():
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = rt.attention(q, k, v, relpos.ALiBi(), causal=True)
    (g,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="no double backward"):
        g.sum().backward()


def test_return_lse_gives_the_row_logsumexp_as_a_constant():
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, lse = rt.attention(q, k, v, relpos.ALiBi(), causal=True, return_lse=True)
    logits = q @ k.transpose(-1, -2) / 2.0 - torch.tensor(relpos.alibi_slopes(2)).view(1, 2, 1, 1) * (
        torch.arange(6.0).view(1, 6) - torch.arange(6.0).view(6, 1)).abs()
    logits = logits.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1), rtol=1e-12, atol=1e-12)
    assert not lse.requires_grad and out.requires_grad
    torch.testing.assert_close(out, rt.attention(q, k, v, relpos.ALiBi(), causal=True), rtol=0, atol=0)


def test_autocast_bfloat16_runs_the_op_in_bfloat16():
    """Under torch.autocast("cpu", bfloat16) the op's float inputs (q, k, v and
    the scheme's tables) are cast to bfloat16 and it runs with bfloat16 storage:
    the module runs, trains (its float32 parameters get float32 gradients), and
    stays within bfloat16's rounding of the float32 module."""
    torch.manual_seed(0)
    m = rt.RelativeMultiheadAttention(32, 4, "t5", num_kv_heads=2).float()
    x = torch.randn(2, 9, 32, dtype=torch.float32)
    reference = m(x, causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x, causal=True)
        q = torch.randn(1, 2, 3, 4, dtype=torch.float32)
        out = rt.attention(q, q, q)
    assert y.dtype == torch.bfloat16 and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), rt.attention(q.bfloat16(), q.bfloat16(), q.bfloat16()).float(),
                               rtol=0, atol=0)
    torch.testing.assert_close(y.float(), reference, rtol=0, atol=0.05)
    y.float().square().sum().backward()
    assert m.t5_table.grad is not None and m.t5_table.grad.dtype == torch.float32
    assert m.t5_table.grad.abs().sum() > 0


# ---- attention dropout: the rng is drawn inside the graph (torch.randint), the op saves it for
# the backward; nothing host-side, no graph break.

def dropout_model():
    """A training-mode module with attention dropout, called as Causal calls it."""
    return Causal(model("t5", dropout=0.3, t5_bidirectional=False)).train()


def seeded(fn, m, x, pad, seed):
    torch.manual_seed(seed)
    return output_and_grads(fn, m, x, pad)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_with_dropout_draws_in_the_graph_as_eager_draws(backend):
    """fullgraph with dropout: one graph, no break; under one torch.manual_seed the compiled
    module draws what the eager module draws (on the CPU the 2-element draw runs as aten's
    randint in both backends), so output and gradients equal eager's; another seed, another mask."""
    m = dropout_model()
    x, pad = inputs()
    explanation = torch._dynamo.explain(m)(x, pad)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend=backend)
    want_y, want_g = seeded(m, m, x, pad, 5)
    got_y, got_g = seeded(compiled, m, x, pad, 5)
    torch.testing.assert_close(got_y, want_y, rtol=1e-12, atol=1e-12)
    for name, g in want_g.items():
        torch.testing.assert_close(got_g[name], g, rtol=1e-10, atol=1e-12, msg=name)
    assert not torch.allclose(seeded(compiled, m, x, pad, 6)[0], got_y)
    m.eval()  # eval mode: no dropout, a graph of its own
    torch.testing.assert_close(compiled(x, pad), m(x, pad), rtol=1e-12, atol=1e-12)


def assert_backward_meets_the_forwards_mask(out, v, dout):
    """Without value terms out = (P z) v is linear in v, so <dout, out> = <v, dv> exactly when the
    backward's dv = (P z)^T dout is drawn with the forward's mask z."""
    (dv,) = torch.autograd.grad(out, v, dout)
    torch.testing.assert_close((dout * out).sum(), (v * dv).sum(), rtol=1e-12, atol=1e-12)


def test_compiled_functional_dropout_backward_uses_the_forwards_mask():
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 4, 9, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    f = torch.compile(lambda q, k, v: rt.attention(q, k, v, relpos.ALiBi(), causal=True, dropout_p=0.4),
                      fullgraph=True, backend="aot_eager")
    out = f(q, k, v)
    assert not torch.allclose(out, rt.attention(q, k, v, relpos.ALiBi(), causal=True))
    assert_backward_meets_the_forwards_mask(out, v, torch.randn_like(out))


def test_export_and_jit_trace_with_dropout_draw_as_eager_draws():
    m = dropout_model()
    x, pad = inputs()
    ep = torch.export.export(m, (x, pad))
    targets = [str(n.target) for n in ep.graph.nodes]
    assert any("randint" in t for t in targets) and any("relpos.attention_forward" in t for t in targets)
    torch.manual_seed(8)
    want = m(x, pad)
    torch.manual_seed(8)
    torch.testing.assert_close(ep.module()(x, pad), want, rtol=0, atol=0)
    traced = torch.jit.trace(m, (x, pad), check_trace=False)  # a second trace would draw another mask
    torch.manual_seed(8)
    torch.testing.assert_close(traced(x, pad), want, rtol=0, atol=0)


def test_vmap_with_dropout_follows_vmaps_randomness():
    """vmap's default (randomness="error") refuses the draw, as it refuses SDPA's dropout; "same"
    draws once, and every mapped entry is the unmapped call with that draw (entry by entry: folded
    into the batch, the entries would meet different rows of the mask); "different" gives each
    entry a draw of its own, and each backward its forward's mask."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(3, 2, 4, 9, 8, dtype=torch.float64) for _ in range(3))

    def f(q, k, v):
        return rt.attention(q, k, v, relpos.ALiBi(), causal=True, dropout_p=0.3)

    with pytest.raises(RuntimeError, match="randomness"):
        torch.vmap(f)(q, k, v)
    torch.manual_seed(3)
    same = torch.vmap(f, randomness="same")(q, k, v)
    for i in range(3):
        torch.manual_seed(3)
        torch.testing.assert_close(same[i], f(q[i], k[i], v[i]), rtol=0, atol=0)
    copies = [x[:1].expand(3, *x.shape[1:]) for x in (q, k, v)]
    different = torch.vmap(f, randomness="different")(*copies)
    assert not torch.allclose(different[0], different[1]) and not torch.allclose(different[1], different[2])
    vg = v.clone().requires_grad_()
    out = torch.vmap(f, randomness="different")(q, k, vg)
    assert_backward_meets_the_forwards_mask(out, vg, torch.randn_like(out))


@pytest.mark.parametrize("rng_dim", [0, None], ids=["rng-mapped", "rng-shared"])
def test_the_ops_mapped_with_dropout_run_entry_by_entry(rng_dim):
    """The forward and backward operators under vmap with an rng per entry (or one for all):
    each entry's results are the operators' on that entry with its rng."""
    from relpos.torch.ops import encode

    torch.manual_seed(4)
    q, k, v, dout = (torch.randn(3, 1, 2, 7, 4, dtype=torch.float64) for _ in range(4))
    rngs = torch.tensor([[1, 2], [3, 4], [5, 6]]) if rng_dim == 0 else torch.tensor([7, 8])
    name, params, ints, floats = encode(relpos.ALiBi(), True, 0, 0, None, "auto", None)
    ops = torch.ops.relpos

    def forward(q, k, v, rng):
        return ops.attention_forward(q, k, v, None, params, name, ints, floats, rng, 0.3)

    def backward(q, k, v, out, lse, dout, rng):
        return ops.attention_backward(q, k, v, out, lse, dout, None, params, name, ints, floats, rng, 0.3)[:3]

    out, lse = torch.vmap(forward, in_dims=(0, 0, 0, rng_dim))(q, k, v, rngs)
    grads = torch.vmap(backward, in_dims=(0,) * 6 + (rng_dim,))(q, k, v, out, lse, dout, rngs)
    for i in range(3):
        rng = rngs[i] if rng_dim == 0 else rngs
        want_out, want_lse = forward(q[i], k[i], v[i], rng)
        assert torch.equal(out[i], want_out) and torch.equal(lse[i], want_lse)
        for got, want in zip(grads, backward(q[i], k[i], v[i], want_out, want_lse, dout[i], rng)):
            assert torch.equal(got[i], want)


@pytest.mark.parametrize("grid", ["sam", "swin"])
def test_grid_schemes_compile_and_export_as_eager_with_gradients(grid):
    """Positions on a grid through the CPU op: SAM on 3 x 4 queries against pooled 2 x 4 keys,
    Swin's 3 x 4 window with two segments (a shifted window's regions). torch.compile(fullgraph=True)
    and torch.export give the eager bits, gradients of q, k, v and the tables included."""
    g = torch.Generator().manual_seed(5)
    Lk = 8 if grid == "sam" else 12
    shapes = [(2, 2, 12, 8), (2, 2, Lk, 8), (2, 2, Lk, 8)]
    shapes += [(5, 8), (7, 8)] if grid == "sam" else [(2, 5 * 7)]
    ids = torch.tensor([[0] * 4 + [1] * 8, [2] * 12], dtype=torch.int32)

    def call(q, k, v, *tables):
        if grid == "sam":
            return rt.attention(q, k, v, relpos.SAM(*tables, q_height=3, q_width=4, k_height=2, k_width=4))
        return rt.attention(q, k, v, relpos.Swin(*tables, window_height=3, window_width=4), segments=ids)

    def run(fn):
        leaves = [torch.randn(*s, generator=torch.Generator().manual_seed(n), dtype=torch.float64).requires_grad_()
                  for n, s in enumerate(shapes)]
        out = fn(*leaves)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape))
        return [out.detach(), *(x.grad for x in leaves)]

    eager = run(call)
    assert all(x.abs().sum() > 0 for x in eager)  # every gradient reached
    for a, b in zip(eager, run(torch.compile(call, fullgraph=True, backend="aot_eager"))):
        torch.testing.assert_close(b, a, rtol=0, atol=0)

    class Call(torch.nn.Module):
        def forward(self, *args):
            return call(*args)

    args = [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
    ep = torch.export.export(Call(), tuple(args))
    assert any("relpos.attention_forward" in str(n.target) for n in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(*args), call(*args), rtol=0, atol=0)
