"""relpos.gpu's kernels compiled ahead of time for sm_80 and sm_90 without a GPU
(relpos.gpu.compile_check): every specialisation of the default covering set compiles
and fits the card's shared memory per block, and the checker does fail on a tile that
cannot fit.

Why a subprocess: conftest.py sets TRITON_INTERPRET=1 for the interpreter tests, which
turns the kernels into interpreter functions for the whole process; compiling needs
them as Triton JIT functions, so the check runs as ``python -m
relpos.gpu.compile_check`` in a process of its own, with the same relpos on its path.
The default run takes about 1.5 to 3 minutes on two cores (bench/results/gpu_compile.md).
"""
from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

import relpos.gpu.compile_check as cc  # noqa: E402  (the pure-Python parts run here)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the directory holding the relpos this process imported (.../relpos/gpu/compile_check.py)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(cc.__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _run(args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(), timeout=timeout)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One default run (covering set, sm_80 and sm_90), shared by the tests below."""
    path = tmp_path_factory.mktemp("compile") / "results.json"
    done = _run(["-m", "relpos.gpu.compile_check", "--arch", "80,90", "--json", str(path)])
    assert path.exists(), f"no results (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done, json.loads(path.read_text())


def test_pairwise_covers_every_pair():
    factors = {**cc.FACTORS, "kernel": cc.ATTENTION_KERNELS}  # the row kernels have none of the switches
    rows = cc.pairwise(factors)
    for a, b in itertools.combinations(factors, 2):
        for va, vb in itertools.product(factors[a], factors[b]):
            assert any(r[a] == va and r[b] == vb for r in rows), (a, va, b, vb)
    assert len(rows) < math.prod(len(v) for v in factors.values()) // 20  # a covering set, not the product


def test_specs_match_the_launcher():
    from relpos.gpu.config import ROW_KERNELS, launch_for

    specs = cc.covering_specs()
    assert len({s.name for s in specs}) == len(specs)
    rows = [s for s in specs if s.kernel in cc.ROW_KERNEL_NAMES]
    assert {(s.kernel, s.dtype, s.head, s.transpose) for s in rows} == {
        *itertools.product(["rotate"], cc.DTYPES, cc.HEADS, (False, True)),
        *itertools.product(["row_dots"], cc.DTYPES, cc.HEADS, (False,))}
    assert all(s.cfg == ROW_KERNELS for s in rows)
    specs = [s for s in specs if s.kernel not in cc.ROW_KERNEL_NAMES]
    assert any(s.dtype == "float32" and not s.tf32 and s.tables for s in specs)  # TF32 x 3, torch's default
    # dropout: none, drawn per key, per four keys (keys on the 64 grid in 64-key tiles), as the launcher sets it
    assert {s.dropout_switch for s in specs} == {0, 1, 2}
    assert all(s.dropout_switch == (s.dropout != "") + (s.dropout == "aligned" and s.cfg.block_n == 64) for s in specs)
    # positions on a grid (each kind, SAM's dq kernel on both widths) and segments, as the launcher sets them
    from relpos.gpu.grid import GRID_AXES, fold_widths

    assert {(s.grid, s.segments) for s in specs} >= {(g, seg) for g in cc.GRIDS for seg in (False, True)} - {
        ("sam_narrow", False)} and any(s.grid == "sam_narrow" and s.kernel == "backward_q" for s in specs)
    for s in specs:
        switches = s.grid_switches
        if switches["GRID"] == GRID_AXES:
            width = cc.SAM_NARROW if s.grid == "sam_narrow" else cc.SAM_WIDE
            assert (switches["GY"], switches["GX"]) == fold_widths(width, s.cfg.block_n)
            assert (switches["GX"] == 0) == (width >= s.cfg.block_n), s.name
    for s in specs:
        assert s.cfg == getattr(launch_for(s.head, True, 4 if s.dtype == "float32" else 2, bool(s.tables), s.has_x,
                                           split_float32=s.dtype == "float32" and not s.tf32), s.kernel)
        consts = s.constexprs(["D", "DV", "DX", "NB", "PRECISION", "X_PRECISION"])
        assert consts["D"] == consts["DV"] == s.head
        assert consts["DX"] == (s.head if s.has_x else 16)
        assert consts["NB"] == (32 if s.bias == 1 else 16)
    with pytest.raises(KeyError, match="NEW_SWITCH"):
        specs[0].constexprs(["D", "NEW_SWITCH"])


def test_spec_precisions_are_the_launchers(monkeypatch):
    """Each specialisation's PRECISION and X_PRECISION are what launch.precisions gives a CUDA
    call of its dtype with torch's TF32 switch as the spec says (the launcher's own rule, run
    here as on a GPU: the interpreter's check left out)."""
    from relpos.gpu import launch

    monkeypatch.setattr(launch, "interpreting", lambda: False)
    seen = set()
    tf32 = torch.backends.cuda.matmul.allow_tf32  # a property of torch's cuBLAS module: set back by hand
    try:
        for s in cc.covering_specs():
            if s.kernel in cc.ROW_KERNEL_NAMES:
                continue
            torch.backends.cuda.matmul.allow_tf32 = s.tf32
            consts = s.constexprs(["PRECISION", "X_PRECISION"])
            got = launch.precisions(getattr(torch, s.dtype), "cuda")
            assert (consts["PRECISION"], consts["X_PRECISION"]) == got, s.name
            seen.add(got)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert seen == {("ieee", "tf32"), ("tf32", "tf32"), ("tf32x3", "tf32x3")}


def test_ptxas_log_parsing():
    log = ("ptxas info    : Function properties for attention_forward_kernel\n"
           "    160 bytes stack frame, 152 bytes spill stores, 148 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 160 bytes cumulative stack size, 1024 bytes smem\n")
    assert cc.parse_ptxas(log) == dict(registers=255, spill_stores=152, spill_loads=148, static_smem=1024)
    with pytest.raises(ValueError):
        cc.parse_ptxas("ptxas fatal   : Unsupported .version 9.4")


def test_default_set_compiles_and_fits(default_run):
    done, doc = default_run
    results = doc["results"]
    specs = cc.covering_specs()
    assert {(r["spec"], r["arch"]) for r in results} == {(s.name, a) for s in specs for a in (80, 90)}
    failed = [f"{r['spec']} sm_{r['arch']}: {r['error'][:2000]}" for r in results if r["error"]]
    assert not failed, "kernels that do not compile:\n" + "\n".join(failed)
    over = [f"{r['spec']} sm_{r['arch']}: {r['shared']} > {r['limit']} bytes" for r in results
            if r["shared"] > r["limit"]]
    assert not over, "shared memory over the card's limit per block:\n" + "\n".join(over)
    unsafe = [f"{r['spec']} sm_{r['arch']}: {r['pipelined_sums']}" for r in results if r["pipelined_sums"]]
    assert not unsafe, "loads of in-place sums pipelined:\n" + "\n".join(unsafe)
    # the dq kernels that add to such sums are in the set (tables of rows per distance, grids), so the zero counts
    assert any("backward_q/" in r["spec"] and "+deberta" in r["spec"] for r in results)
    assert any("backward_q/" in r["spec"] and "+swin" in r["spec"] for r in results)
    assert done.returncode == 0, done.stderr[-3000:]


def test_default_run_numbers_are_parsed(default_run):
    _, doc = default_run
    compiled = [r for r in doc["results"] if not r["error"]]
    assert compiled, "nothing compiled"
    for r in compiled:
        assert r["limit"] == cc.SHARED_LIMIT[r["arch"]]
        # every attention kernel stages tiles through shared memory (the row kernels need not)
        assert r["shared"] > 0 or r["spec"].split("/")[0] in cc.ROW_KERNEL_NAMES, r
        assert 0 < r["registers"] <= 255, r
        assert r["spill_stores"] >= 0 and r["spill_loads"] >= 0, r
        assert r["ptxas_log"] in ("triton", "rerun"), r
        assert 0 <= r["pipelined_sums"] <= r["async_copies"], r
    for arch in (80, 90):  # the pipeliner is on: the forward's tiles arrive by asynchronous copies
        assert any(r["async_copies"] for r in compiled if r["arch"] == arch and r["spec"].startswith("forward/"))


_PIPELINED = """
import json
from relpos.gpu import compile_check as cc, kernels, pipelined
counts = {}
for name, spec in (("forward", cc.Spec("forward", "bfloat16", 0, False, False, False, 64)),
                   ("dq_shaw", cc.Spec("backward_q", "bfloat16", 0, False, True, False, 64, tables="shaw_kv"))):
    ttgir = cc.compiled_kernel(spec, 90).asm["ttgir"]
    counts[name] = dict(copies=len(pipelined.ASYNC_COPY.findall(ttgir)),
                        in_rows=pipelined.copies_in(ttgir, [kernels._rows]),
                        in_kernel=pipelined.copies_in(ttgir, [kernels.attention_forward_kernel]),
                        in_sums=pipelined.copies_in(ttgir, pipelined.IN_PLACE_SUMS))
print(json.dumps(counts))
"""


def test_pipelined_loads_are_found_by_their_source_lines():
    """Every asynchronous copy of the forward (sm_90, bfloat16, d = 64) is located: its key tiles
    in kernels._rows, a helper the kernel inlines (the sums' loads sit in inlined helpers too), its
    value tiles in the kernel's own body; the dq kernel with Shaw's tables has none of its sums'
    loads pipelined. check() names a specialisation that has."""
    done = _run(["-c", _PIPELINED])
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    forward = counts["forward"]
    assert forward["in_rows"] > 0 and forward["in_kernel"] > 0, forward
    assert forward["in_rows"] + forward["in_kernel"] == forward["copies"], forward
    assert forward["in_sums"] == 0 and counts["dq_shaw"]["in_sums"] == 0, counts
    unsafe = cc.Result(spec="backward_q/x", arch=90, limit=cc.SHARED_LIMIT[90], async_copies=2, pipelined_sums=2)
    with pytest.raises(cc.CompileCheckError, match=r"backward_q/x sm_90: 2 loads of the sums"):
        cc.check([unsafe])
    cc.check([cc.Result(spec="forward/x", arch=90, limit=cc.SHARED_LIMIT[90], async_copies=8)])


_OVERSIZED = """
import json, sys
from relpos.gpu import compile_check as cc
from relpos.gpu.config import Launch
spec = cc.Spec("forward", "float32", 0, False, False, False, 128, launch=Launch(128, 64, 8, 3))
results = cc.run([spec], archs=(80,), jobs=1)
try:
    cc.check(results)
    message = ""
except cc.CompileCheckError as e:
    message = str(e)
print(json.dumps(dict(name=spec.name, shared=results[0].shared, error=results[0].error, message=message)))
"""


def test_checker_fails_on_an_oversized_tile():
    """128 x 64 float32 tiles of a 128-wide head in three stages: the q tile and three stages
    of k and v need 196,608 bytes, more than an A100's 166,912, so check() must raise and
    name the specialisation (a configuration that compiles in seconds)."""
    done = _run(["-c", _OVERSIZED])
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert not out["error"], out["error"]
    assert out["shared"] > cc.SHARED_LIMIT[80]
    assert out["name"] in out["message"] and "exceeds" in out["message"] and "sm_80" in out["message"]


def test_cli_exits_nonzero_on_an_oversized_tile():
    done = _run(["-m", "relpos.gpu.compile_check", "--arch", "80", "--launch", "128,64,8,3", "--jobs", "1",
                 "--quiet", "--only", "kernel=forward", "--only", "dtype=float32", "--only", "bias=none",
                 "--only", "has_x=0", "--only", "causal=0", "--only", "has_pad=0", "--only", "head=128",
                 "--only", "tables=none", "--only", "clamp=0", "--only", "rope=0", "--only", "dropout=none",
                 "--only", "grid=none", "--only", "segments=0"])  # one specialisation: the oversized one
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    assert "forward/float32/none/d128/128x64w8s3 sm_80: shared memory" in done.stderr


_TRACE = """
import json
import torch
from torch._library.triton import triton_ops_to_kernels  # torch's registry of triton_op kernels
from torch.fx.experimental.proxy_tensor import make_fx
from relpos.gpu import launch, ops
from relpos.gpu.terms import Terms

B, H, L, d, k_rows = 2, 2, 40, 16, 11
q, k, v, out, dout = (torch.randn(B, H, L, d) for _ in range(5))
lse = torch.randn(B, H, L)
wk, wv = torch.randn(H, k_rows, d), torch.randn(k_rows, d)
ints = ops.call_options(Terms(q, k, wk=wk, wv=wv, shaw_k=5), True, 0, 0)
absent = ("pad", "table", "bucket", "p1", "p2", "qx", "kx", "wq", "row_of", "rot_q", "rot_k", "partner", "qb", "grid",
          "segments")
launches = "torch.ops.higher_order.triton_kernel_wrapper_mutation("
counts = {}
for name, rng, p in (("", None, 0.0), ("_dropout", torch.tensor([-5, 7]), 0.1)):
    shaw = dict(dict.fromkeys(absent), ints=ints, scale=0.25, dropout_p=p)

    def fwd(q, k, v, wk, wv, rng):
        return ops._forward(q, k, v, wk=wk, wv=wv, dropout_rng=rng, **shaw)

    def bwd(q, k, v, out, lse, dout, wk, wv, rng):
        return ops._backward(q, k, v, out, lse, dout, wk=wk, wv=wv, dropout_rng=rng, **shaw)

    counts["forward" + name] = make_fx(fwd, tracing_mode="fake")(q, k, v, wk, wv, rng).code.count(launches)
    counts["backward" + name] = make_fx(bwd, tracing_mode="fake")(q, k, v, out, lse, dout, wk, wv, rng).code.count(
        launches)
print(json.dumps(dict(
    interpreting=launch.interpreting(),
    triton_ops=sorted(n for n in triton_ops_to_kernels if n.startswith("relpos::")), **counts)))
"""


def test_ops_are_triton_ops_whose_kernels_trace_without_a_gpu():
    """With real Triton kernels (no interpreter) the ops are torch.library.triton_ops, and
    tracing their bodies with fake tensors records the kernel launches themselves (one
    forward kernel, the backward's three: its row dots, the dk, dv and the dq kernel), with dropout too (its [seed, offset] a tensor
    argument), which is what torch.compile and torch.export see."""
    done = _run(["-c", _TRACE], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == dict(interpreting=False, triton_ops=["relpos::gpu_attention_backward",
                                                       "relpos::gpu_attention_forward"], forward=1, backward=3,
                   forward_dropout=1, backward_dropout=3)


def test_copies_are_placed_by_the_module_whatever_copy_of_it_compiled():
    """Triton's cache keys a compile by its source, not its path, so a cached TTGIR may name another
    checkout's kernels.py (a CI clone reusing a cache filled elsewhere found no copy at all before):
    a copy is placed by the file's last three path parts and its own line, through its call site."""
    import inspect

    from relpos.gpu import kernels, pipelined

    line = inspect.getsourcelines(getattr(kernels._rows, "fn", kernels._rows))[1] + 2  # in _rows's body
    ttgir = ("    %0 = ttg.async_copy_global_to_local %a, %b : tensor<64x64x!tt.ptr<bf16>> loc(#loc3)\n"
             f'#loc1 = loc("/elsewhere/site-packages/relpos/gpu/kernels.py":{line}:9)\n'
             '#loc2 = loc("/elsewhere/site-packages/relpos/gpu/kernels.py":9999:3)\n'
             '#loc3 = loc(callsite(#loc1 at #loc2))\n')
    assert pipelined.copies_in(ttgir, [kernels._rows]) == 1
    assert pipelined.copies_in(ttgir, pipelined.IN_PLACE_SUMS) == 0
    assert pipelined.copies_in(ttgir.replace("relpos/gpu/kernels.py", "relpos/gpu/grid.py"), [kernels._rows]) == 0
