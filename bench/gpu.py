"""relpos.gpu on one NVIDIA GPU, in one command: checks it against the float64 oracle, times
it against SDPA flash, FlexAttention and the PyTorch forms models use, and writes the table.

    python bench/gpu.py            # every step, within about 5.5 minutes on an H100 / H200
    python bench/gpu.py --quick    # correctness at L = 2048, d = 64 timings only (about 2.5 minutes)
    python bench/gpu.py --smoke --out /tmp/gpu.md   # tiny sizes on CPU tensors (Triton's interpreter)
    python bench/gpu.py --schemes rope,t5   # those schemes' checks and rows only (SDPA flash's rows stay)

1. Correctness (B=1, H=4, L=4096, d=64; Shaw and DeBERTa at L=1024 because the oracle
   materialises (H, L, L, d) tables; Transformer-XL with L/4 memory keys; SAM and Swin on a 64 x 64
   grid, gpu_schemes.grid_of), causal and not, every scheme: bfloat16 q, k, v, dout and
   learnable scheme tensors; relpos.gpu's output
   and the gradients of q, k, v and every learnable tensor against tests/python/torch_oracle.py
   run in float64 on the GPU on the same (bfloat16) values. The error rule is FlashAttention's,
   as tests/python/test_gpu.py states it for these kernels: relpos.gpu's max error is at most
   2x the max error of the same oracle computed by PyTorch in bfloat16 throughout (bfloat16
   inputs, products, result; its autograd too), plus 1e-6. The kernels multiply P and dS as
   bfloat16, as FlashAttention does, so the stricter rule of the CPU kernels
   (test_half_storage.py: 2x the exact result rounded once) is reported beside it, not
   required. Then the backward runs twice on one forward: every gradient must be the same
   bits. A scheme relpos.gpu refuses ("no GPU kernel yet") is listed as not served, not failed.
   Attention dropout (bench/gpu_dropout.py): the mask the kernels draw against the layout's, bit
   for bit; plain, T5 and DeBERTa with dropout 0.3 at L = 1024 against the oracle with that mask.
2. Timing (bfloat16, B=4, H=16; d = 64 and 128; causal L = 4096 and 16384, non-causal
   L = 2048): forward and forward+backward medians (triton.testing.do_bench; a call over
   150 ms is timed 3 times by wall clock instead), forwards with autograd recording as in
   training, and the peak memory a forward+backward allocates beyond its inputs. Rows in
   the order they are run, each skipped once the time budget (--budget-s) cannot hold it
   (plain, T5 and DeBERTa also with dropout 0.1, and SDPA flash with it: their cost noted):
   every SDPA / relpos / PyTorch-form row of the d=64 shapes, the flex rows there, the rows
   with dropout there, then the other shapes (first a SAM global layer, B = 1, a 64 x 64 grid,
   H = 12, non-causal: relpos against transformers' SamVisionAttention and SDPA given the dense
   decomposed bias, gpu_grid.py), and last every shape's rows of Shaw at the
   largest k (its kernels took over a minute to compile on an H100); forms whose estimated
   memory exceeds the card's free memory are skipped.
3. bench/results/gpu_<card>.md (or --out): card, versions, command, both tables and the
   targets met / not met; written after the correctness step and after each timing row (a
   run stopped from outside keeps what it measured), printed at the end. Exit status 1 when
   a correctness check fails.

--smoke runs the same code on CPU tensors: TRITON_INTERPRET=1 (set here before Triton is
imported), a wall-clock median instead of do_bench, SDPA's math kernel instead of flash, no
flex rows, no memory column; tests/python/test_bench_gpu.py runs it.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import os
import platform
import re
import statistics
import sys
import time
import traceback
import types
from dataclasses import dataclass, replace
from pathlib import Path

T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parent.parent
# RELPOS_PACKAGE=PATH imports relpos.gpu from another copy of python/relpos (another version
# of the kernels, timed on the same card in the same call); the report names the copy it ran.
PACKAGE = Path(os.environ.get("RELPOS_PACKAGE") or ROOT / "python" / "relpos").resolve()
SMOKE = __name__ == "__main__" and "--smoke" in sys.argv[1:]
if SMOKE:  # Triton reads it when first imported: before torch, which may import Triton
    os.environ["TRITON_INTERPRET"] = "1"
elif __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)  # a GPU run must compile the kernels, not interpret them

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_dropout as dropout  # noqa: E402
import gpu_forms as forms  # noqa: E402
import gpu_grid as grid  # noqa: E402
from gpu_schemes import (DEBERTA_OPTIONS, ROPE_BASE, grid_of, oracle_options, scheme_record,  # noqa: E402
                         scheme_values)


def log(message: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {message}", flush=True)


def import_relpos():
    """relpos.schemes and relpos.gpu from this repository's python/relpos (or RELPOS_PACKAGE's), without running
    python/relpos/__init__.py: that file imports the compiled CPU extension (relpos._relpos),
    which the GPU machines do not build, while relpos.gpu needs only relpos.schemes and its own
    modules (neither imports the extension). A bare package module whose __path__ is
    python/relpos lets the submodules import."""
    package = types.ModuleType("relpos")
    package.__path__ = [str(PACKAGE)]
    package.__file__ = str(PACKAGE / "__init__.py")
    sys.modules["relpos"] = package
    schemes = importlib.import_module("relpos.schemes")
    gpu = importlib.import_module("relpos.gpu")
    return schemes, gpu


CORRECTNESS_SCHEMES = ("none", "alibi", "t5", "kerple", "kerple_power", "rope", "xl", "shaw", "deberta", "sam", "swin")


@dataclass(frozen=True)
class Shape:
    B: int
    H: int
    L: int
    d: int
    causal: bool
    gather: bool = False  # the OpenNMT Shaw form runs here (its (L, L, d) tables fit at L = 2048)
    grid: bool = False  # SAM's global layer (gpu_grid.py): its rows only

    @property
    def label(self) -> str:
        if self.grid:
            return "SAM global layer {} x {} B={} H={} d={}".format(*grid_of(self.L), self.B, self.H, self.d)
        return f"d={self.d} {'causal' if self.causal else 'non-causal'} L={self.L}"


@dataclass
class Plan:
    B: int
    H: int
    L: int
    d: int
    tables_L: int
    shapes: list
    shaw_ks: tuple
    kerple_power_timed: bool
    budget_s: float
    reps: int = 1  # CPU timer only
    warm: bool = True  # a forward+backward before timing (compiles; the interpreter has nothing to compile)
    truncating: bool = False  # the interpreter's float32 -> bfloat16 truncates (round_like_a_gpu failed)
    schemes: tuple = CORRECTNESS_SCHEMES  # the schemes checked and timed (--schemes)


def round_like_a_gpu() -> bool:
    """Make Triton's interpreter convert float32 to bfloat16 to nearest (ties to even), as
    a GPU's conversion does; it truncates, which would double every bfloat16 rounding the
    kernels make in the smoke run and break the error rule for reasons no GPU has. Returns
    whether the interpreter could be patched (its cast method is internal)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = getattr(interpreter, "InterpreterBuilder", None)
    original = getattr(builder, "cast_impl", None)
    if original is None or not hasattr(interpreter, "TensorHandle"):
        return False

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            b = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
            rounded = ((b + (np.uint32(0x7FFF) + ((b >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
            nan = np.isnan(src.data)
            rounded[nan] = ((b[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)  # stays a NaN
            return interpreter.TensorHandle(rounded, dst_type.scalar)
        return original(self, src, dst_type)

    builder.cast_impl = cast_impl
    return True


def plan_for(args) -> Plan:
    if args.smoke:
        shapes = [Shape(1, 1, 32, 16, True), Shape(1, 1, 32, 16, False, gather=True),
                  Shape(**grid.SMOKE, causal=False, grid=True)]
        return Plan(1, 2, 32, 64, 32, shapes, (2,), False, args.budget_s or 1e9, warm=False,
                    truncating=not round_like_a_gpu())
    d64 = [Shape(4, 16, 4096, 64, True), Shape(4, 16, 2048, 64, False, gather=True),
           Shape(**grid.SHAPE, causal=False, grid=True)]
    if args.quick:
        return Plan(1, 4, 2048, 64, 1024, d64, (16, 64), False, args.budget_s or 150)
    rest = [Shape(4, 16, 4096, 128, True), Shape(4, 16, 16384, 64, True), Shape(4, 16, 2048, 128, False, gather=True),
            Shape(4, 16, 16384, 128, True)]
    return Plan(1, 4, 4096, 64, 1024, d64 + rest, (16, 64), True, args.budget_s or 315)


def refused(error: ValueError) -> bool:
    """Whether relpos.gpu refused the scheme as one it does not run on the GPU (yet)."""
    return "no GPU kernel" in str(error) or "GPU path does not" in str(error)


def first_line(error: BaseException, width: int = 140) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}"[:width]


def free_memory(device) -> None:
    """Collect and return cached blocks; never raises: after a kernel's illegal access the CUDA
    context is broken and every call raises, and the report must still be written."""
    gc.collect()
    if device.type == "cuda":
        try:
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - the row that broke the context reports it
            log(f"free_memory: {first_line(e)}")


# ---------------------------------------------------------------------------
# 1. Correctness
# ---------------------------------------------------------------------------

SHAW_CHECK_K = 16
RULE_FLOOR = 1e-6  # absolute, as tests/python/test_gpu.py adds it


def bits(x: torch.Tensor) -> torch.Tensor:
    """x's bytes (a fresh contiguous copy: a gradient of one element may carry any stride)."""
    flat = torch.empty(x.numel(), dtype=x.dtype, device=x.device)
    flat.copy_(x.detach().reshape(-1))
    return flat.view(torch.uint8)


def error_row(scheme, causal, Lq, Lk, tensor, got, exact, torch_half, repeat, truncating=False) -> dict:
    """Max |got - exact| against the error of PyTorch computing in got's dtype (the rule) and
    against the exact result rounded to got's dtype (what rounding alone costs, for the record)."""
    exact = exact.detach()
    diff = (got.detach().double() - exact).abs().max().item()
    err_torch = (torch_half.detach().double() - exact).abs().max().item()
    rounding = (exact.to(got.dtype).double() - exact).abs().max().item()
    reference = err_torch if err_torch == err_torch and err_torch != float("inf") else rounding
    magnitude = exact.abs().max().item()
    same_bits = torch.equal(bits(got), bits(repeat))
    return dict(scheme=scheme, mask="causal" if causal else "full", size=f"{Lq}x{Lk}", tensor=tensor,
                magnitude=magnitude, err=diff, err_torch=err_torch, rounding=rounding,
                met=bool(diff <= (4 if truncating else 2) * reference + RULE_FLOOR),
                ratio=diff / reference if reference > 0 else
                float("inf") if diff > 0 else 0.0, over_rounding=diff / rounding if rounding > 0 else 0.0,
                bitwise=same_bits)


def check_case(S, gpu, O, plan, name, causal, device, dropout_p=0.0) -> tuple[list, str]:
    """Rows of one (scheme, mask), or ([], reason) when relpos.gpu does not serve the scheme;
    with dropout_p, the oracle applies the layout's mask (gpu_dropout.keep)."""
    # Shaw's and DeBERTa's oracles hold (H, L, L, d) rows, dropout's mask is drawn in NumPy
    L = plan.tables_L if name in ("shaw", "deberta") or dropout_p else plan.L
    memory = L // 4 if name == "xl" else 0
    B, H, d, Lq, Lk = plan.B, plan.H, plan.d, L, L + memory
    gen = torch.Generator().manual_seed(7 + 2 * CORRECTNESS_SCHEMES.index(name) + int(causal))
    bf16 = torch.bfloat16

    def leaf(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=bf16).requires_grad_()

    q, k, v = leaf(B, H, Lq, d), leaf(B, H, Lk, d), leaf(B, H, Lk, d)
    dout = torch.randn(B, H, Lq, d, generator=gen).to(device=device, dtype=bf16)
    tensors = {f: t.to(device=device, dtype=bf16).requires_grad_()
               for f, t in scheme_values(name, H, d, SHAW_CHECK_K, L).items()}
    record = scheme_record(S, name, tensors, causal, SHAW_CHECK_K, L)
    scale = d ** -0.5
    drop = dict(dropout_p=dropout_p, dropout_rng=dropout.rng(device)) if dropout_p else {}
    mask = dict(dropout_p=dropout_p, dropout_mask=dropout.keep(O, B, H, Lq, Lk, dropout_p, memory, 0, device)) \
        if dropout_p else {}
    try:
        out = gpu.attention(q, k, v, record, causal=causal, q_offset=memory, scale=scale, **drop)
    except ValueError as e:
        if refused(e):
            return [], first_line(e)
        raise
    leaves = [q, k, v, *tensors.values()]
    grads = torch.autograd.grad(out, leaves, dout, retain_graph=True)
    again = torch.autograd.grad(out, leaves, dout)  # the backward a second time, same forward

    def oracle(dtype):
        """The oracle's output and gradients computed in dtype throughout, on the same values."""
        inputs = [x.detach().to(dtype).requires_grad_() for x in leaves]
        params = {f"{record.name}_{f}": x for f, x in zip(tensors, inputs[3:])}
        with torch.device(device):  # the oracle makes its position tensors with torch's factories
            result, _ = O.attention(*inputs[:3], record.name, oracle_options(name, causal, SHAW_CHECK_K, L), params,
                                    causal=causal, q_offset=memory, k_offset=0, scale=scale, **mask)
        return [result.detach(), *torch.autograd.grad(result, inputs, dout.to(dtype))]

    exact = oracle(torch.float64)
    in_half = oracle(bf16)
    names = ["out", "dq", "dk", "dv", *(f"d{record.name}_{f}" for f in tensors)]
    label = f"{name} + dropout {dropout_p}" if dropout_p else name
    rows = [error_row(label, causal, Lq, Lk, n, g, e, t, a, plan.truncating)
            for n, g, e, t, a in zip(names, [out, *grads], exact, in_half, [out, *again])]
    rows[0]["bitwise"] = None  # the repeat is of the backward
    return rows, ""


DROPOUT_CHECKS = (("none", True), ("t5", True), ("deberta", False))  # (scheme, causal) checked with dropout 0.3


def correctness(S, gpu, O, plan, device) -> tuple[list, dict, list, list]:
    """(rows, {scheme: why not served}, [failures], [dropout mask lines])."""
    rows, not_served, failures = [], {}, []
    cases = [(name, causal, 0.0) for name in plan.schemes for causal in (True, False)]
    cases += [(name, causal, 0.3) for name, causal in DROPOUT_CHECKS if name in plan.schemes]
    for name, causal, dropout_p in cases:
        if name in not_served:
            continue
        what = f"{name}{f' + dropout {dropout_p}' if dropout_p else ''} {'causal' if causal else 'full'}"
        try:
            case_rows, reason = check_case(S, gpu, O, plan, name, causal, device, dropout_p)
        except Exception as e:  # a crash is a failed check, reported with the rest
            traceback.print_exc()
            failures.append(f"{what}: {first_line(e)}")
            case_rows, reason = [], ""
        free_memory(device)
        if reason:
            not_served[name] = reason
            log(f"correctness {name}: not served ({reason})")
            continue
        rows += case_rows
        bad = [r["tensor"] for r in case_rows if not r["met"] or r["bitwise"] is False]
        failures += [f"{what} {t}" for t in bad]
        if case_rows:
            worst = max(case_rows, key=lambda r: r["ratio"])
            log(f"correctness {what}: worst {worst['tensor']} "
                f"{worst['ratio']:.2f}x PyTorch bf16's error, {'ok' if not bad else 'FAILED ' + ', '.join(bad)}")
    masks = []
    if "none" in plan.schemes:
        try:
            masks = dropout.mask_checks(gpu, O, device)
        except Exception as e:  # a crash is a failed check, reported with the rest
            traceback.print_exc()
            masks = [(f"dropout mask: {first_line(e)}", False)]
        failures += [line for line, same in masks if not same]
        for line, _ in masks:
            log(f"correctness {line}")
    return rows, not_served, failures, [line for line, _ in masks]


# ---------------------------------------------------------------------------
# 2. Timing
# ---------------------------------------------------------------------------


class Skip(Exception):
    """A row not run: the reason goes to the table."""


@dataclass
class Row:
    name: str
    group: str  # rows of one group compute the same function (or its key-only part)
    kind: str  # "base", "relpos", "peer", "flex", "dropout" (a row with attention dropout: gpu_dropout.py)
    build: object  # ctx -> (fn returning the output, leaves)
    compare: bool = True  # whether the forward must equal relpos's of the group


@dataclass
class Result:
    fwd: float = None
    fb: float = None
    mem: float = None
    diff: float = None
    note: str = ""


class Ctx:
    """One shape's inputs (seeded, so a shape rebuilt later has the same values), the
    learnable tensors per group (shared by the group's rows), relpos outputs for the
    peers' agreement check."""

    def __init__(self, S, gpu, shape: Shape, device):
        self.S, self.gpu, self.shape, self.device = S, gpu, shape, device
        # drawn on the device: at L = 16384, d = 128 a CPU generator took seconds per tensor (about
        # 1e9 values per shape with XL's keys, and each shape's context is made twice)
        self.gen = torch.Generator(device=device).manual_seed(shape.L * 1000 + shape.d + shape.causal)
        self.q, self.k, self.v = (self.leaf(shape.B, shape.H, shape.L, shape.d) for _ in range(3))
        self.g = torch.randn(shape.B, shape.H, shape.L, shape.d, generator=self.gen, device=device).to(torch.bfloat16)
        self.scale = shape.d ** -0.5
        self.memory = shape.L // 2
        self.tensors, self.outputs, self.extra = {}, {}, {}

    def leaf(self, *size):
        return torch.randn(*size, generator=self.gen, device=self.device).to(torch.bfloat16).requires_grad_()

    def params(self, group: str) -> dict:
        if group not in self.tensors:
            name, _, k = group.partition(":")
            values = scheme_values(name, self.shape.H, self.shape.d, int(k or 0), self.shape.L)
            self.tensors[group] = {f: t.to(self.device, torch.bfloat16).requires_grad_() for f, t in values.items()}
        return self.tensors[group]

    def xl_keys(self):
        if "xl" not in self.extra:
            s = self.shape
            self.extra["xl"] = tuple(self.leaf(s.B, s.H, s.L + self.memory, s.d) for _ in range(2))
        return self.extra["xl"]

    def relpos(self, group: str, dropout_p: float = 0.0):
        """(fn, leaves) of relpos.gpu for a group's scheme (with dropout_p, a new rng per call, drawn
        on the device as relpos.torch draws it)."""
        name, _, k = group.partition(":")
        t = self.params(group)
        record = scheme_record(self.S, name, t, self.shape.causal, int(k or 0), self.shape.L)
        q, (k_, v_), offset = (self.q, self.xl_keys(), self.memory) if name == "xl" else (self.q, (self.k, self.v), 0)
        def fn():
            try:
                return self.gpu.attention(q, k_, v_, record, causal=self.shape.causal, q_offset=offset,
                                          scale=self.scale, dropout_p=dropout_p)
            except ValueError as e:
                if refused(e):
                    raise Skip(f"not served: {first_line(e)}") from None
                raise

        return fn, [q, k_, v_, *t.values()]

    def check_memory(self, need: float):
        if self.device.type == "cuda":
            free = torch.cuda.mem_get_info()[0]
            if need > 0.9 * free:
                raise Skip(f"skipped: needs ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free")

    def block_mask(self):
        return forms.causal_block_mask(self.shape.L, self.device) if self.shape.causal else None


def rows_for(plan: Plan, shape: Shape) -> list:
    """Every row of a shape, SDPA flash first (the other rows' ratios read it)."""
    c = shape.causal

    def plain(x):
        return lambda: forms.sdpa_flash(x.q, x.k, x.v, causal=c, scale=x.scale), [x.q, x.k, x.v]

    def flex_plain(x):
        return lambda: forms.flex_plain(x.q, x.k, x.v, x.block_mask(), scale=x.scale), [x.q, x.k, x.v]

    def flex_alibi(x):
        slopes = x.params("alibi")["slopes"].detach().float()
        return lambda: forms.flex_alibi(x.q, x.k, x.v, slopes, x.block_mask(), scale=x.scale), [x.q, x.k, x.v]

    def flex_t5(x):
        table, rows = x.params("t5")["table"], forms.t5_bucket_row(x.shape.L, x.shape.L, not c, x.device)
        return (lambda: forms.flex_t5(x.q, x.k, x.v, table, rows, x.block_mask(), scale=x.scale),
                [x.q, x.k, x.v, table])

    def hf_t5(x):
        s = x.shape
        x.check_memory(forms.t5_hf_bytes(s.B, s.H, s.L, s.L))
        table = x.params("t5")["table"]
        return (lambda: forms.t5_hf(x.q, x.k, x.v, table, causal=c, scale=x.scale, bidirectional=not c),
                [x.q, x.k, x.v, table])

    def rotation(x):
        cos, sin = forms.rope_cache(x.shape.L, x.shape.d, ROPE_BASE, torch.bfloat16, x.device)
        return lambda: forms.rope_then_flash(x.q, x.k, x.v, cos, sin, causal=c, scale=x.scale), [x.q, x.k, x.v]

    def xl_torch(x):
        s = x.shape
        x.check_memory(forms.xl_torch_bytes(s.B, s.H, s.L, s.L + x.memory))
        t, (k_, v_) = x.params("xl"), x.xl_keys()
        return (lambda: forms.xl_torch(x.q, k_, v_, t["u"], t["v"], t["w_r"], memory=x.memory, causal=c,
                                       scale=x.scale), [x.q, k_, v_, *t.values()])

    def flex_shaw(kk):
        def build(x):
            wk = x.params(f"shaw:{kk}")["wk"]
            return (lambda: forms.flex_shaw_keys(x.q, x.k, x.v, wk, kk, x.block_mask(), scale=x.scale),
                    [x.q, x.k, x.v, wk])
        return build

    def opennmt(kk):
        def build(x):
            s = x.shape
            x.check_memory(forms.shaw_opennmt_bytes(s.B, s.H, s.L, s.L, s.d))
            t = x.params(f"shaw:{kk}")
            return (lambda: forms.shaw_opennmt(x.q, x.k, x.v, t["wk"], t["wv"], kk, causal=c, scale=x.scale),
                    [x.q, x.k, x.v, t["wk"], t["wv"]])
        return build

    def hf_deberta(x):
        s = x.shape
        x.check_memory(forms.deberta_hf_bytes(s.B, s.H, s.L))
        t = x.params("deberta")
        return (lambda: forms.deberta_hf(x.q, x.k, x.v, t["c2p"], t["p2c"], **DEBERTA_OPTIONS, causal=c,
                                         scale=x.scale), [x.q, x.k, x.v, t["c2p"], t["p2c"]])

    def ours(group, dropout_p=0.0):
        return lambda x: x.relpos(group, dropout_p)

    if shape.grid:  # SAM's global layer: its rows only (gpu_grid.py)
        return [Row("SDPA flash", "none", "base", plain), *(r for r in grid.rows(Row, grid_of, ours)
                                                            if "sam" in plan.schemes)]

    rows = [Row("SDPA flash", "none", "base", plain), Row("relpos plain", "none", "relpos", ours("none")),
            Row("flex plain", "none", "flex", flex_plain),
            Row("relpos ALiBi (learned slopes)", "alibi", "relpos", ours("alibi")),
            Row("flex ALiBi (fixed slopes)", "alibi", "flex", flex_alibi),
            Row("relpos T5 (learned table)", "t5", "relpos", ours("t5")),
            Row("flex T5 (table requires grad)", "t5", "flex", flex_t5),
            Row("SDPA + T5 bias (Hugging Face)", "t5", "peer", hf_t5),
            Row("relpos KERPLE (learned)", "kerple", "relpos", ours("kerple"))]
    if plan.kerple_power_timed:
        rows.append(Row("relpos KERPLE power (learned)", "kerple_power", "relpos", ours("kerple_power")))
    rows += [Row("relpos RoPE", "rope", "relpos", ours("rope")),
             Row("rotation + SDPA flash", "rope", "peer", rotation),
             Row("relpos XL, memory L/2", "xl", "relpos", ours("xl")),
             Row("PyTorch XL, memory L/2 (rel-shift + SDPA bias)", "xl", "peer", xl_torch)]
    for kk in plan.shaw_ks:
        rows += [Row(f"relpos Shaw K+V k={kk}", f"shaw:{kk}", "relpos", ours(f"shaw:{kk}")),
                 Row(f"flex Shaw K-only k={kk}", f"shaw:{kk}", "flex", flex_shaw(kk), compare=False)]
        if shape.gather:
            rows.append(Row(f"OpenNMT Shaw K+V k={kk} (L x L x d gathers)", f"shaw:{kk}", "peer", opennmt(kk)))
    rows += [Row("relpos DeBERTa c2p+p2c (span 256)", "deberta", "relpos", ours("deberta")),
             Row("Hugging Face DeBERTa (c2p, p2c gathers; eager softmax)", "deberta", "peer", hf_deberta)]
    rows += dropout.rows(Row, shape, ours)
    return [r for r in rows if r.kind == "base" or r.group.split(":")[0] in plan.schemes]


def time_ms(fn, device, reps: int) -> float:
    """Median ms of fn: do_bench on a GPU (its L2 flush between calls), a few wall-clock
    calls for a call over 150 ms (do_bench would spend seconds on it); the CPU median of reps."""
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)
    import triton.testing

    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = (time.perf_counter() - t) * 1e3
    if once <= 150:
        return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def measure(row: Row, ctx: Ctx, plan: Plan) -> Result:
    fn, leaves = row.build(ctx)
    leaves = [x for x in leaves if x.requires_grad]

    def step():
        return torch.autograd.grad(fn(), leaves, ctx.g)

    out = fn().detach()  # the first calls compile (flex, Triton) and load the kernels
    if plan.warm:
        step()
    result = Result()
    if row.kind == "relpos":
        ctx.outputs[row.group] = out
    elif row.compare and row.kind != "base":
        if row.group not in ctx.outputs:
            try:
                ctx.outputs[row.group] = ctx.relpos(row.group)[0]().detach()
            except Skip:
                pass
        if row.group in ctx.outputs:
            result.diff = (out.float() - ctx.outputs[row.group].float()).abs().max().item()
    del out
    result.fwd = time_ms(fn, ctx.device, plan.reps)
    result.fb = time_ms(step, ctx.device, plan.reps)
    if ctx.device.type == "cuda":
        free_memory(ctx.device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        result.mem = (torch.cuda.max_memory_allocated() - before) / 2**20
    return result


def row_pass(plan: Plan, row: Row) -> str:
    """The timing pass a row runs in: "slow" for Shaw at the largest k (its kernels took over
    a minute to compile on an H100, which ended a run's budget before the other shapes),
    "flex" for FlexAttention's rows, "dropout" for the rows with dropout (after the rows they
    are measured against, so that compiling their kernels costs those nothing), else "main"."""
    if row.group == f"shaw:{max(plan.shaw_ks)}":
        return "slow"
    return row.kind if row.kind in ("flex", "dropout") else "main"


def timing(S, gpu, plan: Plan, device, progress=lambda results: None) -> dict:
    """{(shape label, row name): Result}: the main rows of the d=64 shapes, their flex rows and
    rows with dropout, then the other shapes' rows and theirs, then every shape's slow rows
    (row_pass), each row only while the budget holds it; ``progress(results)`` after each row
    run (the report so far is written)."""
    results = {}
    first, rest = plan.shapes[:2], plan.shapes[2:]
    passes = [(first, "main"), (first, "flex"), (first, "dropout"), (rest, "main"), (rest, "flex"), (rest, "dropout"),
              (plan.shapes, "slow")]
    for shapes, this_pass in passes:
        for shape in shapes:
            ctx = None
            for row in rows_for(plan, shape):
                if row_pass(plan, row) != this_pass:
                    continue
                key = (shape.label, row.name)
                if row.kind == "flex" and device.type != "cuda":
                    results[key] = Result(note="flex: CUDA only")
                    continue
                left = plan.budget_s - (time.perf_counter() - T0)
                need = 60 if row.kind == "flex" else 25 if shape.L > 4096 else 10
                if left < need:
                    results[key] = Result(note="skipped: time budget")
                    continue
                try:
                    ctx = ctx or Ctx(S, gpu, shape, device)
                    results[key] = measure(row, ctx, plan)
                except Skip as e:
                    results[key] = Result(note=str(e))
                except torch.cuda.OutOfMemoryError:
                    results[key] = Result(note="out of memory")
                except Exception as e:  # a form that fails (flex's compile, a kernel) is a row of the table
                    what = "compile/run failed" if row.kind == "flex" else "failed"
                    results[key] = Result(note=f"{what}: {first_line(e)}")
                free_memory(device)
                r = results[key]
                timing_text = f"fwd {r.fwd:.3f} ms, fwd+bwd {r.fb:.3f} ms" if r.fb is not None else r.note
                log(f"{shape.label}: {row.name}: {timing_text}")
                progress(results)
            del ctx
            free_memory(device)
    return results


# ---------------------------------------------------------------------------
# Targets and the report
# ---------------------------------------------------------------------------


def targets(plan: Plan, results: dict) -> list:
    """(shape, target, value, met) with met None where a side of the ratio did not run."""
    out = []

    def get(shape, name):
        return results.get((shape.label, name), Result())

    def ratio(shape, what, num, den, field, threshold, reason=""):
        a, b = getattr(num, field), getattr(den, field)
        if a is None or b is None or b == 0:
            out.append((shape.label, what, "n/a " + (den.note or num.note or reason), None))
        else:
            out.append((shape.label, what, f"{a / b:.2f}x (>= {threshold}x)", a / b >= threshold))

    for shape in plan.shapes:
        flash = get(shape, "SDPA flash")
        for row in rows_for(plan, shape):
            if row.kind == "dropout" and row.name.startswith("relpos"):
                ratio(shape, f"{row.name} fwd+bwd: without / with dropout", get(shape, row.name.removesuffix(
                    dropout.SUFFIX)), get(shape, row.name), "fb", round(1 / dropout.TARGET, 2))
            if row.kind != "relpos":
                continue
            ours = get(shape, row.name)
            if ours.note.startswith("not served"):
                out.append((shape.label, f"{row.name}: every target", ours.note, None))
                continue
            group = row.group.split(":")[0]
            if group == "sam":  # against its peers (its extra memory holds SAM's per-row scores, no flash target)
                grid.targets(shape, ours, get, ratio)
                continue
            if group == "none":
                ratio(shape, f"{row.name} fwd vs SDPA flash", flash, ours, "fwd", 0.8)
                ratio(shape, f"{row.name} fwd+bwd vs SDPA flash", flash, ours, "fb", 0.8)
            elif group in ("alibi", "t5", "kerple", "kerple_power"):
                ratio(shape, f"{row.name} fwd vs SDPA flash", flash, ours, "fwd", 0.65)
                ratio(shape, f"{row.name} fwd+bwd vs SDPA flash", flash, ours, "fb", 0.55)
                if group == "t5":
                    ratio(shape, f"{row.name} fwd+bwd vs flex T5 (table requires grad)",
                          get(shape, "flex T5 (table requires grad)"), ours, "fb", 100)
            elif group == "rope":
                peer = get(shape, "rotation + SDPA flash")
                ratio(shape, f"{row.name} fwd vs rotation + SDPA flash", peer, ours, "fwd", 1.0)
                ratio(shape, f"{row.name} fwd+bwd vs rotation + SDPA flash", peer, ours, "fb", 1.0)
            elif group == "xl":
                ratio(shape, f"{row.name} fwd+bwd vs SDPA flash (no memory)", flash, ours, "fb", 0.3)
            elif group == "deberta":
                ratio(shape, f"{row.name} fwd+bwd vs SDPA flash", flash, ours, "fb", 0.3)
                ratio(shape, f"{row.name} fwd+bwd vs Hugging Face's form",
                      get(shape, "Hugging Face DeBERTa (c2p, p2c gathers; eager softmax)"), ours, "fb", 3.0)
            elif group == "shaw":
                kk = row.group.split(":")[1]
                ratio(shape, f"{row.name} fwd+bwd vs SDPA flash", flash, ours, "fb", 0.35)
                ratio(shape, f"{row.name} fwd+bwd vs flex K-only", get(shape, f"flex Shaw K-only k={kk}"), ours,
                      "fb", 1.5)
            if ours.mem is not None and flash.mem:
                out.append((shape.label, f"{row.name} peak extra memory vs SDPA flash",
                            f"{ours.mem:.0f} / {flash.mem:.0f} MiB = {ours.mem / flash.mem:.2f}x (<= 1.5x)",
                            ours.mem <= 1.5 * flash.mem))
            elif ours.fb is not None:
                out.append((shape.label, f"{row.name} peak extra memory vs SDPA flash", "n/a (no CUDA memory stats)",
                            None))
    return out


def fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def environment(device, script: str = "bench/gpu.py") -> list:
    import triton

    lines = [f"- device: {card_name(device)}"]
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        lines[0] += f" (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB)"
    lines += [f"- torch {torch.__version__}, Triton {triton.__version__}, CUDA {torch.version.cuda}, "
              f"Python {platform.python_version()}",
              f"- command: `python {' '.join([script, *sys.argv[1:]])}`",
              f"- relpos.gpu: {Path(sys.modules['relpos.gpu'].__file__).parent}"]
    return lines


def device_for(args, parser) -> torch.device:
    """The CPU for --smoke (run as a script, which set TRITON_INTERPRET=1), else the GPU;
    a parser error where that cannot be."""
    if args.smoke != (os.environ.get("TRITON_INTERPRET") == "1"):
        parser.error("--smoke sets TRITON_INTERPRET=1 itself; run this file as a script")
    device = torch.device("cpu" if args.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: run on a machine with an NVIDIA GPU, or pass --smoke")
    return device


def results_path(device, prefix: str) -> Path:
    """bench/results/<prefix>_<card>.md"""
    slug = re.sub(r"[^a-z0-9]+", "_", card_name(device).lower()).strip("_")
    return ROOT / "bench" / "results" / f"{prefix}_{slug}.md"


def card_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (Triton interpreter)"


def report(plan, device, corr_rows, not_served, failures, masks, results, target_rows) -> str:
    lines = [f"# relpos.gpu on {card_name(device)}", "", *environment(device),
             f"- total time: {time.perf_counter() - T0:.0f} s (budget {plan.budget_s:.0f} s)", "",
             "## Correctness", "",
             f"bfloat16 q, k, v, dout and learnable scheme tensors, B={plan.B}, H={plan.H}, L={plan.L} "
             f"(Shaw and DeBERTa {plan.tables_L}; XL with L/4 memory keys), d={plan.d}, scale 1/sqrt(d); exact: "
             "tests/python/torch_oracle.py in float64 on the same values; errors are max abs differences from it. "
             "Rule (FlashAttention's, as tests/python/test_gpu.py): err relpos.gpu <= 2 x err of the oracle computed "
             "in bfloat16 throughout + 1e-6. For the record, err / rounding: relpos.gpu's error over that of the "
             "exact result rounded once to bfloat16 (the CPU kernels' stricter rule asks <= 2; P and dS multiplied "
             "as bfloat16 cost more). Bitwise: the backward run twice on one forward."
             + (" Triton's interpreter truncated float32 to bfloat16 here (a GPU rounds to nearest), which doubles "
                "each rounding's error: this run's bound is 4x." if plan.truncating else ""), "",
             "| scheme | mask | Lq x Lk | tensor | max abs exact | err relpos.gpu | err torch bf16 | err / torch bf16 "
             "| rule | err rounding | err / rounding | bitwise repeat |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in corr_rows:
        bits = "-" if r["bitwise"] is None else "identical" if r["bitwise"] else "differs"
        lines.append(f"| {r['scheme']} | {r['mask']} | {r['size']} | {r['tensor']} | {r['magnitude']:.3g} | "
                     f"{r['err']:.3e} | {r['err_torch']:.3e} | {r['ratio']:.2f} | {'met' if r['met'] else 'NOT met'} | "
                     f"{r['rounding']:.3e} | {r['over_rounding']:.2f} | {bits} |")
    lines.append("")
    for name, reason in not_served.items():
        lines.append(f"- not served by relpos.gpu: {name} ({reason})")
    lines += [f"- {line}" for line in masks]
    lines.append(f"- correctness: {'FAILED: ' + '; '.join(failures) if failures else 'every check met'}")
    lines += ["", "## Timing", "",
              "bfloat16, forward with autograd recording (as in training); medians in ms; peak extra = "
              "max_memory_allocated during one forward+backward minus what was allocated before it; "
              "x flash = SDPA flash's time / the row's (same shape, same run); diff = max |out - relpos's out| "
              "of the same scheme and values (a check that the form computes the same function); rows ending "
              f"'{dropout.SUFFIX}': the call with attention dropout, its note the cost.", "",
              "| shape | row | fwd ms | fwd+bwd ms | peak extra MiB | fwd x flash | fwd+bwd x flash | diff | note |",
              "|---|---|---|---|---|---|---|---|---|"]
    for shape in plan.shapes:
        flash = results.get((shape.label, "SDPA flash"), Result())
        for row in rows_for(plan, shape):
            r = results.get((shape.label, row.name), Result(note="not run"))
            rf = flash.fwd / r.fwd if flash.fwd and r.fwd else None
            rb = flash.fb / r.fb if flash.fb and r.fb else None
            note = dropout.cost(results, shape.label, row.name, Result) if row.kind == "dropout" else r.note
            lines.append(f"| {shape.label} | {row.name} | {fmt(r.fwd)} | {fmt(r.fb)} | {fmt(r.mem, '.0f')} | "
                         f"{fmt(rf, '.2f')} | {fmt(rb, '.2f')} | {fmt(r.diff, '.2e')} | {note} |")
    met = sum(1 for t in target_rows if t[3] is True)
    missed = sum(1 for t in target_rows if t[3] is False)
    lines += ["", "## Targets", "", f"{met} met, {missed} not met, {len(target_rows) - met - missed} not measured.", "",
              "| shape | target | value | result |", "|---|---|---|---|"]
    for label, what, value, ok in target_rows:
        lines.append(f"| {label} | {what} | {value} | {'n/a' if ok is None else 'met' if ok else 'not met'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="correctness at L=2048, the d=64 shapes only")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU tensors under Triton's interpreter")
    parser.add_argument("--out", type=Path, help="the markdown file (default bench/results/gpu_<card>.md)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds from start after which no further timing row starts (default 315, quick 150)")
    parser.add_argument("--skip-timing", action="store_true", help="correctness only")
    parser.add_argument("--schemes", type=lambda text: tuple(text.split(",")), default=CORRECTNESS_SCHEMES,
                        help="comma list of the schemes to check and time (default: all; " +
                        ",".join(CORRECTNESS_SCHEMES) + ")")
    args = parser.parse_args(argv)
    device = device_for(args, parser)
    unknown = sorted(set(args.schemes) - set(CORRECTNESS_SCHEMES))
    if unknown:
        parser.error(f"--schemes: unknown {', '.join(unknown)} (known: {', '.join(CORRECTNESS_SCHEMES)})")
    plan = replace(plan_for(args), schemes=args.schemes)
    plan = replace(plan, shapes=[s for s in plan.shapes if not s.grid or "sam" in plan.schemes])
    torch.manual_seed(0)
    S, gpu = import_relpos()
    O = forms.oracle()
    log(f"relpos.gpu from {Path(gpu.__file__).parent}; {card_name(device)}; torch {torch.__version__}")

    out = args.out or results_path(device, "gpu")
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(results) -> str:
        """The report as it stands, written over the file: a run stopped from outside (the
        machine's time running out) leaves the rows measured so far."""
        text = report(plan, device, corr_rows, not_served, failures, masks, results, targets(plan, results))
        out.write_text(text)
        return text

    corr_rows, not_served, failures, masks = correctness(S, gpu, O, plan, device)
    log(f"correctness: {len(corr_rows)} checks, {len(failures)} failed, not served: {', '.join(not_served) or '-'}")
    write({})
    results = {} if args.skip_timing else timing(S, gpu, plan, device, write)
    text = write(results)
    print(text, flush=True)
    log(f"wrote {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
