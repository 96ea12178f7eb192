"""relpos.gpu as registered operators, through Triton's interpreter on CPU tensors:
``torch.compile(fullgraph=True)`` and ``torch.export`` trace ``relpos.gpu.attention`` and
compute what it computes eagerly, gradients included (with dropout too); the backward's query programs
that own several tiles (the partial tables of Shaw's and DeBERTa's tables,
config.TABLE_PROGRAMS) agree with the
float64 oracle; inputs the kernels cannot address are refused by name.

Under the interpreter the ops are custom ops (relpos.gpu.ops says why); the Triton form
they take with real kernels is traced without a GPU in test_gpu_compile.py.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest (conftest.py sets TRITON_INTERPRET=1)"

import relpos  # noqa: E402
from harness import Case, assert_matches_oracle, make_problem, run_oracle  # noqa: E402
from test_gpu import run_gpu  # noqa: E402


def _inputs(seed=3, B=2, H=2, Lq=35, Lk=35, d=16):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, d, generator=g, dtype=torch.float32) for n in (Lq, Lk, Lk))
    return q, k, v, torch.randn(H, 16, generator=g, dtype=torch.float32), torch.randn(B, H, Lq, d, generator=g,
                                                                                       dtype=torch.float32)


class _T5Attention(torch.nn.Module):
    """A T5 attention core whose table learns: what a traced model holds."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, q, k, v):
        import relpos.gpu

        return relpos.gpu.attention(q, k, v, relpos.T5(self.table, max_distance=20), causal=True)


def _run(fn, q, k, v, dout):
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(dout)
    return [out.detach()] + [x.grad for x in leaves]


def test_compiled_fullgraph_equals_eager():
    q, k, v, table, dout = _inputs()
    eager_model, compiled_model = _T5Attention(table), _T5Attention(table)
    want = _run(eager_model, q, k, v, dout) + [eager_model.table.grad]
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    got = _run(compiled, q, k, v, dout) + [compiled_model.table.grad]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _DropoutAttention(_T5Attention):
    """The T5 core with attention dropout, its [seed, offset] an input as relpos.torch draws it."""

    def forward(self, q, k, v, rng):
        import relpos.gpu

        return relpos.gpu.attention(q, k, v, relpos.T5(self.table, max_distance=20), causal=True, dropout_p=0.2,
                                    dropout_rng=rng)


def test_compiled_fullgraph_with_dropout_equals_eager():
    """The dropout rng travels through the op as a tensor: the compiled call reads it on the
    device as the eager one does, and its backward draws the forward's mask."""
    q, k, v, table, dout = _inputs()
    rng = torch.tensor([-3, 17])
    eager_model, compiled_model = _DropoutAttention(table), _DropoutAttention(table)
    want = _run(lambda *x: eager_model(*x, rng), q, k, v, dout) + [eager_model.table.grad]
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    got = _run(lambda *x: compiled(*x, rng), q, k, v, dout) + [compiled_model.table.grad]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _RoPEAttention(torch.nn.Module):
    def forward(self, q, k, v):
        import relpos.gpu

        return relpos.gpu.attention(q, k, v, relpos.RoPE(), causal=True, q_offset=5)


def test_export_first_leaves_eager_calls_real():
    """Exporting traces the position tables with fake tensors; none may stay in the table
    cache for the eager calls after it."""
    from relpos.gpu import terms

    q, k, v, _, _ = _inputs(seed=4)
    terms._TABLES.clear()
    program = torch.export.export(_RoPEAttention(), (q, k, v))
    assert all(not isinstance(t, torch._subclasses.FakeTensor) for t in _flat(terms._TABLES.values()))
    eager = _RoPEAttention()(q, k, v)
    terms._TABLES.clear()
    torch.testing.assert_close(eager, _RoPEAttention()(q, k, v), rtol=0, atol=0)
    torch.testing.assert_close(program.module()(q, k, v), eager, rtol=0, atol=0)


def _flat(values):
    for value in values:
        yield from (value if isinstance(value, tuple) else (value,))


def test_exported_program_equals_eager_and_holds_the_op():
    q, k, v, table, _ = _inputs()
    model = _T5Attention(table)
    program = torch.export.export(model, (q, k, v))
    assert "torch.ops.relpos.gpu_attention_forward" in program.graph_module.code
    torch.testing.assert_close(program.module()(q, k, v), model(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize("scheme, L, opts", [
    ("shaw", 70, dict(k=9, tables="kv", beyond="clip")), ("shaw", 70, dict(k=9, tables="k", beyond="zero")),
    ("shaw", 70, dict(k=9, tables="v", beyond="clip")),
    ("deberta", 70, dict(position_buckets=8, max_relative_positions=20, tables="p2c")),
    # 8 buckets to 1000 positions: bucket 6 spans distances 26 to 157, so at L = 180 far tiles read
    # that middle row, neither the call's first row (bucket 7) nor its last
    ("deberta", 180, dict(position_buckets=8, max_relative_positions=1000))], ids=lambda x: str(x))
def test_programs_that_own_several_tiles_match_the_oracle(monkeypatch, scheme, L, opts):
    """At one program per head every program walks all the query tiles (16 rows each)
    and keeps one partial table (and one pair of running end rows) for them."""
    from relpos.gpu import config

    case = Case(f"{scheme}_owning", scheme, B=1 if L > 100 else 2, H=2, d=16, causal=True, Lq=L, Lk=L,
                opts=dict(opts, per_head=True))
    pb = make_problem(case)
    per_tile = run_gpu(pb)
    monkeypatch.setattr(config, "TABLE_PROGRAMS", 1)
    assert config.query_programs(5, 4, tables=True) == 1
    owning = run_gpu(pb)
    assert_matches_oracle(owning, run_oracle(pb), np.float32)
    for name in per_tile:
        np.testing.assert_allclose(owning[name], per_tile[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_query_programs_bound_the_partial_tables():
    from relpos.gpu.config import TABLE_PROGRAMS, query_programs

    assert query_programs(512, 64, tables=False) == 512  # one per tile without tables to sum
    for tiles, heads in ((512, 64), (256, 16), (3, 2), (1024, 4096)):
        programs = query_programs(tiles, heads, tables=True)
        assert 1 <= programs <= tiles and heads * programs <= max(TABLE_PROGRAMS, heads)
    assert query_programs(512, 64, tables=True) == 16


def test_a_batch_entry_past_int32_offsets_is_refused():
    import relpos.gpu

    q = torch.empty(1, 16, 1 << 20, 128, device="meta", dtype=torch.bfloat16)  # 2^31 elements, no memory
    with pytest.raises(ValueError, match="2\\^31 - 1"):
        relpos.gpu.attention(q, q, q)
    wide = torch.empty(1, 1 << 19, 3 * 16 * 128, device="meta", dtype=torch.bfloat16)[..., :2048]
    q = wide.unflatten(-1, (16, 128)).transpose(1, 2)  # a (B, L, H, d) view of a fused projection
    with pytest.raises(ValueError, match="spans"):
        relpos.gpu.attention(q, q, q)


def test_double_backward_is_refused():
    import relpos.gpu

    q, k, v = (x.requires_grad_() for x in _inputs(seed=5, Lq=9, Lk=9)[:3])
    out = relpos.gpu.attention(q, k, v, relpos.ALiBi(), causal=True)
    (g,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="no double backward"):
        g.sum().backward()


def test_eager_calls_run_the_bodies_and_traces_the_registered_ops(monkeypatch):
    """An eager call runs the ops' bodies through one autograd.Function (the registered ops'
    Python dispatch cost more host time than a short forward kernel); a trace's fake tensors
    and dispatch modes get the registered ops. Both compute the same bits."""
    import relpos.gpu
    from relpos.gpu import ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v, table, dout = _inputs(seed=7, Lq=21, Lk=21)
    with monkeypatch.context() as m:
        m.setattr(ops, "traced", lambda inputs: True)  # every call through the registered ops
        model = _T5Attention(table)
        want = _run(model, q, k, v, dout) + [model.table.grad]

    def refused(*_):
        raise AssertionError("an eager call reached a registered op")

    from relpos.gpu import launch
    from torch._library.triton import is_wrap_triton_enabled

    wrapped = []  # per launch: whether it would go through torch's tracing wrapper (on a GPU)

    def wrap_triton(kernel):
        wrapped.append(is_wrap_triton_enabled())
        return launch_wrap_triton(kernel)

    launch_wrap_triton = launch.wrap_triton
    with monkeypatch.context() as m:
        m.setattr(ops, "_forward_op", refused)
        m.setattr(ops, "_backward_op", refused)
        m.setattr(launch, "wrap_triton", wrap_triton)
        model = _T5Attention(table)
        got = _run(model, q, k, v, dout) + [model.table.grad]
        with torch.no_grad():
            assert torch.equal(relpos.gpu.attention(q, k, v, relpos.T5(table, max_distance=20), causal=True), want[0])
    assert wrapped and not any(wrapped), wrapped  # every eager launch straight to its kernel
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(x) for x in (q, k, v)]
        assert ops.traced(fake) and ops.traced([q])  # the mode is on: every call is a trace's
    assert not ops.traced([q, torch.nn.Parameter(table)])


def test_jit_trace_records_the_registered_op():
    """torch.jit.trace sees the registered op (an eager body's launches would be invisible to it)
    and the traced module computes what the eager call does."""
    import relpos.gpu

    q, k, v, table, _ = _inputs(seed=9, Lq=19, Lk=19)
    model = _T5Attention(table)
    with torch.no_grad():
        traced = torch.jit.trace(model, (q, k, v))
        assert "relpos::gpu_attention_forward" in str(traced.graph)
        assert torch.equal(traced(q, k, v), model(q, k, v))


@pytest.mark.parametrize("scheme", [relpos.RoPE(dims=8), relpos.Swin(torch.randn(2, 7 * 7, dtype=torch.float32),
                                                                      window_height=4, window_width=4)],
                         ids=["rope", "swin"])
def test_batch_x_heads_past_a_launch_axis_continue_on_the_next(monkeypatch, scheme):
    """CUDA's grid axes 1 and 2 hold 65535 programs each; more batch x heads (Swin's windows are
    batch entries) continue along axis 2. With the limit lowered to 4, B x H = 12 launches as 4 x 3
    (every kernel: RoPE's rotation, the forward, both backward kernels) and gives the bits of one
    axis; B x H = 5 has no such split and is refused by name."""
    from relpos.gpu import launch

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(6, 2, 16, 16, generator=g, dtype=torch.float32).requires_grad_() for _ in range(3))
    params = [p for p in vars(scheme).values() if isinstance(p, torch.Tensor)]
    for p in params:
        p.requires_grad_()

    def run():
        out = relpos.gpu.attention(q, k, v, scheme, causal=True)
        grads = torch.autograd.grad(out, [q, k, v, *params], torch.ones_like(out))
        return [out, *grads]

    whole = run()
    monkeypatch.setattr(launch, "MAX_LAUNCH_AXIS", 4)
    assert launch.batch_head_axes(12) == (4, 3)
    for a, b in zip(whole, run()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match=r"batch x heads = 5 does not split into two GPU launch axes of at most 4"):
        relpos.gpu.attention(q[:5, :1], k[:5, :1], v[:5, :1], relpos.RoPE(dims=8))
