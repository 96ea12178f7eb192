"""Ahead-of-time compile check of relpos.gpu's Triton kernels, without a GPU.

Why: a kernel that compiles in Triton's interpreter (the CPU tests) can still fail
on a card: the NVIDIA backend may reject it, or its tiles may need more shared
memory than the card gives one block (Triton raises ``OutOfResources`` only at the
first launch, on the user's GPU). Triton compiles to a cubin on any machine, so
this module compiles every specialisation the launcher (launch.py with
config.launch_for) makes for sm_80 (A100) and sm_90 (H100/H200), reads the shared
memory of each (the compiled metadata's ``shared``, the number Triton compares
with the device's limit at launch) and its registers and spills (the ptxas that
Triton uses for that arch, run with ``-v`` on the kernel's PTX), and fails when a
specialisation does not compile, does not fit, or has the loads of the sums it adds to in
global memory pipelined (pipelined.py: counted from the TTGIR's asynchronous copies).

The specialisations: kernel (forward, backward_kv, backward_q) x dtype (bfloat16,
float16, float32) x bias kind (0..4) x HAS_X (with QUERY_BIAS: Transformer-XL has both) x
CAUSAL x HAS_PAD x head size (64,
128; D = DV, DX = the head size when HAS_X as the Transformer-XL features use,
else padded(1)) x tables of rows per distance (none; Shaw's K+V, K, V with k = SHAW_K;
DeBERTa's c2p + p2c through a row map) x Transformer-XL's
clamp (with HAS_X) x RoPE (the backward writes the gradients of the rotated q and k as
float32) x attention dropout (none; its mask drawn per key, for keys off the 64 grid; per
four keys, where the tiles are whole 64-key blocks: dropout.mode as the launcher applies it,
so narrower tiles draw per key either way) x positions on a grid (none; SAM's tables per axis on a
grid at least a tile wide, SAM's on a grid narrower than a tile (SAM's windows of 14, the dq kernel
summing the columns by a 0/1 product), Swin's bias per offset pair; grid.py) x segments, each
with config.launch_for(head, on_gpu=True, the dtype's size, the tables), NB = 32 for the bucketed table (16 otherwise), PRECISION tf32 for float32
(torch's TF32 switch on; tf32x3 with it off), ieee otherwise, and X_PRECISION tf32 (tf32x3 for float32
with the switch off; the float32
features' product). The full product is 345,600 per arch; by default (CI) a
covering set chosen by pairs (every pair of switch values in at least one
specialisation) and CORNERS (among them float32 with TF32 off), ``--full`` for the product.
Beside them the kernels that go row by row (row_kernels.py), with config.ROW_KERNELS: RoPE's
rotate_kernel (run before the attention kernels, and on the gradients after them) per dtype x head
x direction, and the backward's row_dots_kernel per dtype x head.

The integer arguments are specialised as Triton's launcher does for contiguous,
16-byte-aligned tensors with these head sizes (``--generic`` for no hints):
pointers divisible by 16, unit strides (the last dimension's) as the constant 1,
row / head / batch strides and d, dv, dx divisible by 16, the other sizes plain
``i32`` (strides may be ``i64`` in real launches when over 2**31; i32 is what
Triton specialises for the usual ones), ``delta`` and ``r_min`` ``i64``. The
alignment hints matter: without them Triton cannot pipeline loads with
asynchronous copies, so shared memory would be under-counted.

Run: ``python -m relpos.gpu.compile_check [--arch 80,90] [--full] [--json PATH]``.
Needs Triton (no torch GPU, no CUDA driver); not under TRITON_INTERPRET=1, which
makes the kernels interpreter functions that cannot be compiled.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import inspect
import io
import itertools
import json
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Iterable, Optional, Sequence

from . import dropout, kernels, pipelined, row_kernels
from .config import ROW_KERNELS, Launch, launch_for, padded
from .grid import GRID_AXES, GRID_NONE, GRID_TABLE, fold_widths

__all__ = ["Spec", "Result", "CompileCheckError", "SHARED_LIMIT", "covering_specs", "full_specs", "pairwise",
           "compiled_kernel", "compile_spec", "run", "check", "table", "main"]

# Shared memory one block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin): what
# Triton compares metadata.shared with before a launch.
SHARED_LIMIT = {80: 166_912, 90: 232_448}
ARCH_NAMES = {80: "sm_80 (A100)", 90: "sm_90 (H100/H200)"}

KERNELS = ("forward", "backward_kv", "backward_q", "rotate", "row_dots")
ATTENTION_KERNELS = KERNELS[:3]  # the pairwise set's; the row kernels have none of their switches
ROW_KERNEL_NAMES = KERNELS[3:]
_KERNEL_FN = {"forward": (kernels, "attention_forward_kernel"),
              "backward_kv": (kernels, "attention_backward_kv_kernel"),
              "backward_q": (kernels, "attention_backward_q_kernel"),
              "rotate": (row_kernels, "rotate_kernel"), "row_dots": (row_kernels, "row_dots_kernel")}
DTYPES = ("bfloat16", "float16", "float32")
_TRITON_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
BIAS_NAMES = ("none", "row", "alibi", "kerple_log", "kerple_power")  # kernels.BIAS_* in order
HEADS = (64, 128)

# The switches the covering set is built over, with their values.
# The tables of rows per distance a call has: none; Shaw's keys and values, keys only, values
# only (k = SHAW_K); DeBERTa's c2p and p2c, read through a per-distance row map.
TABLES = ("", "shaw_kv", "shaw_k", "shaw_v", "deberta")
SHAW_K = 16  # the smaller k of the GPU targets

# Attention dropout: none; keys starting off the 64 grid (a mask drawn per key); keys on it (per
# four keys where the tiles allow: dropout.mode).
DROPOUT = ("", "unaligned", "aligned")

# Positions on a grid: none; SAM's tables per axis on a key grid SAM_WIDE wide (at least a tile: the
# dq kernel adds dS by column as it is) and SAM_NARROW wide (a 0/1 product sums the columns a tile's
# keys share); Swin's bias per offset pair.
GRIDS = ("", "sam", "sam_narrow", "swin")
SAM_WIDE, SAM_NARROW = 64, 14  # SAM's global layers (64 x 64 at 1024 pixels) and its windows of 14

FACTORS = {"kernel": KERNELS, "dtype": DTYPES, "bias": tuple(range(5)), "has_x": (False, True),
           "causal": (False, True), "has_pad": (False, True), "head": HEADS, "tables": TABLES,
           "clamp": (False, True), "rope": (False, True), "dropout": DROPOUT, "grid": GRIDS,
           "segments": (False, True)}


class CompileCheckError(RuntimeError):
    """A specialisation failed to compile or does not fit a card's shared memory; the
    message names each."""


@dataclass(frozen=True)
class Spec:
    """One specialisation of one kernel, as attention.py would launch it on a GPU."""

    kernel: str
    dtype: str
    bias: int
    has_x: bool
    causal: bool
    has_pad: bool
    head: int
    tables: str = ""  # one of TABLES
    clamp: bool = False  # Transformer-XL's clamp_len > 0 (with has_x)
    rope: bool = False  # RoPE: the backward writes dq and dk as float32 (launch.py rotates them back)
    tf32: bool = True  # float32 products in TF32 (torch's allow_tf32 on); False: TF32 x 3, torch's default
    transpose: bool = False  # rotate_kernel: the rotation's transpose (a gradient's; X float32)
    dropout: str = ""  # one of DROPOUT
    grid: str = ""  # one of GRIDS
    segments: bool = False
    launch: Optional[Launch] = None  # None: config.launch_for's for the kernel, as the launcher calls it
    aligned: bool = True  # the launcher's hints for contiguous, aligned tensors (see the module doc)

    @property
    def cfg(self) -> Launch:
        if self.kernel in ROW_KERNEL_NAMES:
            return ROW_KERNELS
        if self.launch is not None:
            return self.launch
        launches = launch_for(self.head, True, 4 if self.dtype == "float32" else 2, bool(self.tables), self.has_x,
                              split_float32=self.precision == "tf32x3")
        return getattr(launches, self.kernel)

    @property
    def precision(self) -> str:
        """PRECISION as launch.precisions sets it on a GPU."""
        if self.dtype != "float32":
            return "ieee"
        return "tf32" if self.tf32 else "tf32x3"

    @property
    def table_flags(self) -> dict:
        """KEMB, VEMB, QEMB and ROW_MAP, the kernels' table switches, of the spec's tables."""
        shaw = self.tables[5:] if self.tables.startswith("shaw_") else ""
        deberta = self.tables == "deberta"
        return dict(KEMB="k" in shaw or deberta, VEMB="v" in shaw, QEMB=deberta, ROW_MAP=deberta)

    @property
    def dropout_switch(self) -> int:
        """DROPOUT as the launcher sets it (dropout.mode) in the spec's tiles: 0 without dropout; for a
        call with it whose keys start on the 64 grid ("aligned") or off it ("unaligned")."""
        return dropout.mode(0.1 if self.dropout else 0.0, 0 if self.dropout == "aligned" else 1, self.cfg.block_n)

    @property
    def _grid_name(self) -> str:
        """The grid's name; SAM's grids compile alike but in the dq kernel (one name, compiled once)."""
        return "sam" if self.grid == "sam_narrow" and self.kernel != "backward_q" else self.grid

    @property
    def grid_switches(self) -> dict:
        """GRID, and the dq kernel's GY, GX as the launcher sets them (grid.fold_widths)."""
        kind = {"": GRID_NONE, "swin": GRID_TABLE}.get(self.grid, GRID_AXES)
        gy, gx = fold_widths(SAM_NARROW if self.grid == "sam_narrow" else SAM_WIDE, self.cfg.block_n) \
            if kind == GRID_AXES else (16, 0)
        return dict(GRID=kind, GY=gy, GX=gx)

    @property
    def nb(self) -> int:
        return 32 if self.bias == 1 else 16

    @property
    def name(self) -> str:
        c = self.cfg
        flags = "".join(f for f, on in (("+x", self.has_x), ("+causal", self.causal), ("+pad", self.has_pad),
                                        (f"+{self.tables}", bool(self.tables)),
                                        ("+clamp", self.has_x and self.clamp), ("+rope", self.rope),
                                        ("+transpose", self.transpose),
                                        (("", "+dropout", "+dropout4")[self.dropout_switch], self.dropout != ""),
                                        (f"+{self._grid_name}", bool(self.grid)), ("+segments", self.segments),
                                        ("+tf32x3", self.dtype == "float32" and not self.tf32)) if on)
        tail = "" if self.aligned else "/generic"
        return (f"{self.kernel}/{self.dtype}/{BIAS_NAMES[self.bias]}{flags}/d{self.head}/"
                f"{c.block_m}x{c.block_n}w{c.num_warps}s{c.num_stages}{tail}")

    def constexprs(self, names: Iterable[str]) -> dict:
        """The values of the kernel's ``tl.constexpr`` switches ``names``, as launch.py's
        Call.switches sets them on a GPU, for float32 with torch's TF32 switch on (PRECISION
        tf32) unless the spec says off (tf32x3, torch's default), ieee for half types; the float32
        features' X_PRECISION tf32, tf32x3 where the spec's float32 has TF32 off. A switch
        this module does not know raises, so a new one cannot be compiled with a default."""
        c = self.cfg
        known = dict(D=padded(self.head), DV=padded(self.head), DX=padded(self.head if self.has_x else 1),
                     BM=c.block_m, BN=c.block_n, NB=self.nb, BIAS=self.bias, HAS_X=self.has_x, CAUSAL=self.causal,
                     HAS_PAD=self.has_pad, PRECISION=self.precision,
                     X_PRECISION="tf32x3" if self.precision == "tf32x3" else "tf32", **self.table_flags,
                     ZERO_BEYOND=False,
                     X_CLAMP=self.has_x and self.clamp, QUERY_BIAS=self.has_x,
                     BR=c.block_m, TRANSPOSE=self.transpose, DROPOUT=self.dropout_switch,
                     HAS_SEG=self.segments, **self.grid_switches)
        unknown = [n for n in names if n not in known]
        if unknown:
            raise KeyError(f"{self.kernel}: switches {unknown} unknown to compile_check.Spec.constexprs: "
                           "add them there as launch.py sets them")
        return {n: known[n] for n in names}

    def arguments(self, arg_names: Sequence[str], constexpr_names: Iterable[str]):
        """(signature, extra constexprs, divisibility-16 argument names) of the kernel's
        arguments: the types attention.py passes, and what Triton's launcher makes of
        them for contiguous aligned tensors when ``aligned``."""
        t = "*" + _TRITON_DTYPE[self.dtype]
        present = {"PAD": self.has_pad, "BIAS_ROWS": self.bias == 1, "BUCKET": self.bias == 1,
                   "P1": self.bias >= 2, "P2": self.bias >= 3, "QX": self.has_x, "KX": self.has_x,
                   "DQX": self.has_x, "DQ": self.rope, "DK": self.rope, "X": self.transpose, "QB": self.has_x,
                   "RNG": bool(self.dropout), "GT": bool(self.grid), "SEG": self.segments,
                   "DG": self.grid_switches["GRID"] == GRID_AXES}
        flags = self.table_flags
        present.update(WK=flags["KEMB"], DWK=flags["KEMB"], WV=flags["VEMB"], DWV=flags["VEMB"], WQ=flags["QEMB"],
                       DWQ=flags["QEMB"], ROW_OF=flags["ROW_MAP"])
        # float32 whatever q's dtype: row sums, partial gradients, bias parameters and the
        # Transformer-XL features (terms.py keeps them float32; dqx is made like qx)
        own_type = {"LSE": "*fp32", "DLT": "*fp32", "PARTS": "*fp32", "PAD": "*u8", "BIAS_ROWS": "*fp32",
                    "BUCKET": "*i32", "P1": "*fp32", "P2": "*fp32", "QX": "*fp32", "KX": "*fp32", "DQX": "*fp32",
                    "WK": t, "WV": t, "WQ": t, "ROW_OF": "*i32", "DWK": "*fp32", "DWV": "*fp32", "DWQ": "*fp32",
                    "DQ": "*fp32", "DK": "*fp32", "X": "*fp32",
                    "ROT": "*fp32", "PARTNER": "*i32", "QB": "*fp32", "RNG": "*i64", "GT": "*fp32", "SEG": "*i64",
                    "DG": "*fp32"}
        # absent outputs: launch.py passes dq (float32 with RoPE) for DQX, the partial sums for DWK, DWV, DWQ, DG
        absent = {"DQX": "*fp32" if self.rope else t, "DWK": "*fp32", "DWV": "*fp32", "DWQ": "*fp32", "DG": "*fp32"}
        n_parts = {0: 1, 1: self.nb, 2: 1}.get(self.bias, 2) if self.grid != "swin" else 169  # Swin's 7 x 7
        sig, ones, div16 = {}, {}, []
        constexpr_names = set(constexpr_names)
        first_int = next(i for i, n in enumerate(arg_names) if n.startswith("stride_"))
        pointers = set(arg_names[:first_int])  # every kernel takes its tensors first, then the strides
        for name in arg_names:
            if name in constexpr_names:
                sig[name] = "constexpr"
            elif name in pointers:  # an absent input gets q's, an absent output the buffer launch.py gives
                sig[name] = own_type[name] if present.get(name, name in own_type) else absent.get(name, t)
                div16.append(name)
            elif name in ("qk_scale", "scale", "keep_scale"):
                sig[name] = "fp32"
            elif name in ("delta", "r_min"):
                sig[name] = "i64"
            else:
                sig[name] = "i32"
                value = self._typical_int(name, n_parts)
                if value == 1:
                    sig[name], ones[name] = "constexpr", 1
                elif value is not None and value % 16 == 0:
                    div16.append(name)
        if not self.aligned:
            return {n: ("i32" if v == "constexpr" and n in ones else v) for n, v in sig.items()}, {}, []
        return sig, ones, div16

    def _typical_int(self, name: str, n_parts: int) -> Optional[int]:
        """The value of an integer argument in a typical launch when Triton's launcher would
        specialise on it (1, or a multiple of 16), None where it varies (lengths, heads)."""
        if name == "n_parts":
            return n_parts
        if name in ("d", "dv"):
            return self.head
        if name == "dx":
            return self.head if self.has_x else 0
        if name.startswith("stride_x") or name.startswith("stride_kx"):
            if not self.has_x:
                return 0  # _strides of an absent tensor
            return 1 if name[-1] == "d" else 16 * self.head
        if name.startswith("stride_p"):
            if not self.has_pad:
                return 0
            return 1 if name == "stride_pn" else None  # stride_pb is Lk
        if name.startswith("stride_"):
            return 1 if name[-1] == "d" else 16 * self.head  # contiguous (B, H, L, d): multiples of d
        return None


@dataclass
class Result:
    """What one compile of one specialisation for one arch gave."""

    spec: str
    arch: int
    shared: int = 0  # bytes of shared memory per block (metadata.shared)
    limit: int = 0
    static_smem: int = 0  # ptxas's "bytes smem" (part of the block's reservation, not of metadata.shared)
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    async_copies: int = 0  # loads Triton pipelined (asynchronous copies in the TTGIR)
    pipelined_sums: int = 0  # of them, loads of sums a program adds to in global memory (pipelined.py): must be 0
    seconds: float = 0.0
    ptxas_log: str = ""  # "triton": Triton's own ptxas run; "rerun": run_ptxas on the PTX
    error: str = ""

    @property
    def fits(self) -> bool:
        return not self.error and self.shared <= self.limit


def pairwise(factors: dict) -> list[dict]:
    """A covering set by pairs, greedily: each step takes the first row of the full product
    (in its order) that covers the most pairs of switch values not yet covered, until every
    pair is; deterministic, so CI compiles the same set every run. The product's rows are an
    index matrix and each step's gains one gather per pair of switches (NumPy): the product of
    the switches has 345,600 rows, which a loop over rows and pairs took minutes to score."""
    import numpy as np

    names, sizes = list(factors), [len(v) for v in factors.values()]
    rows = np.indices(sizes, dtype=np.int16).reshape(len(sizes), -1)  # column r: row r of the product, in order
    uncovered = {(a, b): np.ones((sizes[a], sizes[b]), bool) for a, b in itertools.combinations(range(len(names)), 2)}
    chosen = []
    while any(u.any() for u in uncovered.values()):
        gain = np.zeros(rows.shape[1], np.int32)
        for (a, b), u in uncovered.items():
            gain += u[rows[a], rows[b]]
        best = rows[:, int(np.argmax(gain))]  # the first row of the largest gain
        chosen.append({n: factors[n][best[i]] for i, n in enumerate(names)})
        for (a, b), u in uncovered.items():
            u[best[a], best[b]] = False
    return chosen


# The largest tiles of each kernel, added to the pairs: the widest dtype with every input
# present (shared memory grows with dtype, head and the features' tiles), and bfloat16 with
# every input but the tables (half types run larger tiles than float32: config.launch_for).
# Pairs alone need not meet them, and an overflow hides in exactly such a corner. And float32
# with torch's default, TF32 off, where every product runs in TF32 three times (twice the
# operand registers of TF32): with DeBERTa's tables at head 64, and with every input at head 128.
# Some with dropout as well, which adds to the largest tiles: bfloat16's 64-key tiles drawing per
# four keys (the words reordered through tl.permute), float32's every input (TF32 off) per key.
_ALL_BUT_TABLES = {"bias": 1, "has_x": True, "causal": True, "has_pad": True, "tables": "", "clamp": True,
                   "rope": True}
_EVERY_INPUT = {"dtype": "float32", "head": 128, **_ALL_BUT_TABLES, "tables": "shaw_kv"}
CORNERS = ({**_EVERY_INPUT, "dropout": ""},
           {"dtype": "float32", "bias": 0, "has_x": False, "causal": True, "has_pad": False, "head": 64,
            "tables": "deberta", "clamp": False, "rope": False, "dropout": "", "tf32": False},
           *({**_EVERY_INPUT, "dropout": drop, "tf32": False} for drop in ("", "unaligned")),
           *({"dtype": "bfloat16", "head": head, **_ALL_BUT_TABLES, "dropout": drop}
             for head in HEADS for drop in ("", "aligned")),
           # positions on a grid with segments in the largest tiles: bfloat16's SAM on a narrow grid (both 0/1
           # products of the dq kernel) drawing dropout per four keys, float32's Swin (TF32 off) per key
           *({**_ALL_BUT_TABLES, "bias": 0, "has_x": False, "clamp": False, "rope": False, "head": 128,
              "segments": True, **corner} for corner in (
               {"dtype": "bfloat16", "grid": "sam_narrow", "dropout": "aligned"},
               {"dtype": "float32", "grid": "swin", "dropout": "unaligned", "tf32": False})))
_NO_GRID = {"grid": "", "segments": False}  # what a corner leaves out


def row_specs(factors: dict, aligned: bool = True) -> list[Spec]:
    """The row kernels' specialisations among ``factors``' kernels, dtypes and heads: rotate_kernel
    in both directions (the rotation of q and k; its transpose, of their float32 gradients) and
    row_dots_kernel."""
    directions = {"rotate": (False, True), "row_dots": (False,)}
    return [Spec(kernel, dtype, 0, False, False, False, head, transpose=transpose, aligned=aligned)
            for kernel in ROW_KERNEL_NAMES if kernel in factors["kernel"]
            for dtype in factors["dtype"] for head in factors["head"] for transpose in directions[kernel]]


def covering_specs(launch: Optional[Launch] = None, aligned: bool = True, **only) -> list[Spec]:
    """The default (CI) set: every pair of switch values in at least one specialisation,
    then each kernel's CORNERS. ``only`` narrows a switch to some values
    (``kernel=("forward",)``); a corner outside it is left out."""
    factors = {k: tuple(only.get(k, v)) for k, v in FACTORS.items()}
    attention = {**factors, "kernel": tuple(k for k in factors["kernel"] if k in ATTENTION_KERNELS)}
    rows = pairwise(attention) if attention["kernel"] else []
    for kernel in attention["kernel"]:
        for corner in CORNERS:
            row = {"kernel": kernel, **_NO_GRID, **corner}
            if all(row[k] in factors[k] for k in factors) and row not in rows:
                rows.append(row)
    return _distinct([Spec(**row, launch=launch, aligned=aligned) for row in rows]) + row_specs(factors, aligned)


def full_specs(launch: Optional[Launch] = None, aligned: bool = True, **only) -> list[Spec]:
    """Every specialisation of the product (345,600 rows without ``only``, fewer kernels: dropout on
    keys on the 64 grid compiles as off it in tiles narrower than 64 keys) and the row kernels' 18."""
    factors = {k: tuple(only.get(k, v)) for k, v in FACTORS.items()}
    attention = {**factors, "kernel": tuple(k for k in factors["kernel"] if k in ATTENTION_KERNELS)}
    return _distinct([Spec(**dict(zip(attention, values)), launch=launch, aligned=aligned)
                      for values in itertools.product(*attention.values())]) + row_specs(factors, aligned)


def _distinct(specs: list[Spec]) -> list[Spec]:
    """specs without repeats of a kernel they compile (by name: dropout on keys on the 64 grid is
    dropout off it where the tiles are narrower than 64 keys), in order."""
    first = {}
    for spec in specs:
        first.setdefault(spec.name, spec)
    return list(first.values())


def _ast_source(ASTSource, fn, signature: dict, constexprs: dict, attrs: dict):
    """Triton 3.2+ (3.9 checked) takes ``constexprs`` keyed by argument name; earlier
    releases called the argument ``constants``. Chosen by inspecting the constructor."""
    params = inspect.signature(ASTSource.__init__).parameters
    key = "constexprs" if "constexprs" in params else "constants"
    kwargs = {key: constexprs}
    if attrs and "attrs" in params:
        kwargs["attrs"] = attrs
    return ASTSource(fn=fn, signature=signature, **kwargs)


def _ptxas(arch: int) -> tuple[str, list[str]]:
    """The ptxas Triton itself uses for ``arch`` and the flags of Triton's own call that
    change code generation, so the registers read are the shipped cubin's. Triton 3.9 runs
    the bundled CUDA 12.9 ``ptxas`` below sm_90 and the newer ``ptxas-blackwell`` (13.x)
    from sm_90, whose PTX (ISA 9.x) the 12.9 one refuses; sm_90's PTX targets ``sm_90a``."""
    path, source, gpu = None, "", f"sm_{arch}{'a' if arch >= 90 else ''}"
    try:
        from triton.backends.nvidia import compiler as nv

        if hasattr(nv, "get_ptxas"):
            path = nv.get_ptxas(arch).path
        if hasattr(nv, "sm_arch_from_capability"):
            gpu = nv.sm_arch_from_capability(arch)
        source = inspect.getsource(nv.CUDABackend.make_cubin)
    except Exception:  # an older layout: the bundled ptxas, no extra flags known
        pass
    if not path:
        import triton

        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    flags = ["--regAllocOptLevel=2"] if "regAllocOptLevel=2" in source else []
    return path, [*flags, f"--gpu-name={gpu}"]


_REGS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> dict:
    """Registers, spills and static shared memory from ``ptxas -v``'s log (the kernel is one
    function: Triton inlines every helper). Raises ValueError when nothing is found, so a
    changed log format fails loudly instead of reading as zero."""
    regs = [int(x) for x in _REGS.findall(log)]
    spills = [(int(a), int(b)) for a, b in _SPILLS.findall(log)]
    if not regs or not spills:
        raise ValueError(f"ptxas -v: no register / spill lines in:\n{log}")
    smem = [int(x) for x in _SMEM.findall(log)]
    return dict(registers=max(regs), spill_stores=max(s for s, _ in spills), spill_loads=max(l for _, l in spills),
                static_smem=max(smem) if smem else 0)


def run_ptxas(ptx: str, arch: int, fp_fusion: bool = True) -> str:
    """``ptxas -v`` on a kernel's PTX with Triton's ptxas and flags for ``arch``: its log."""
    ptxas, flags = _ptxas(arch)
    with tempfile.TemporaryDirectory(prefix="relpos_cc_") as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        cmd = [ptxas, "-v", *([] if fp_fusion else ["--fmad=false"]), *flags, path, "-o",
               os.path.join(tmp, "kernel.cubin")]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"ptxas failed ({done.returncode}): {done.stderr.strip()} [{' '.join(cmd)}]")
    return done.stderr + done.stdout


def compiled_kernel(spec: Spec, arch: int):
    """Triton's compiled kernel of one specialisation for ``arch`` (80 or 90); its ``asm`` holds
    the TTGIR, PTX and cubin, its ``metadata`` the shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(*_KERNEL_FN[spec.kernel])
    if not isinstance(fn, triton.runtime.JITFunction):
        raise RuntimeError("relpos.gpu.kernels was imported under TRITON_INTERPRET=1: its kernels are "
                           "interpreter functions; run the check in a process without it")
    constexpr_names = [p.name for p in fn.params if p.is_constexpr]
    signature, ones, div16 = spec.arguments(fn.arg_names, constexpr_names)
    constexprs = {**spec.constexprs(constexpr_names), **ones}
    attrs = {}
    if div16:
        from triton.backends.nvidia.compiler import CUDABackend

        attrs = {(fn.arg_names.index(n),): CUDABackend.parse_attr("D") for n in div16}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3.9's notice about the FP-fusion default (the launcher's too)
        return triton.compile(_ast_source(ASTSource, fn, signature, constexprs, attrs),
                              target=GPUTarget("cuda", arch, 32),
                              options=dict(num_warps=spec.cfg.num_warps, num_stages=spec.cfg.num_stages))


def compile_spec(spec: Spec, arch: int) -> Result:
    """Compile one specialisation for ``arch`` (80 or 90) and measure it; compile errors are
    returned in ``Result.error`` (the caller reports them all together).

    Registers and spills come from ``ptxas -v``: the log of Triton's own ptxas call when
    it compiles (TRITON_DUMP_PTXAS_LOG; the exact cubin that ships, and no second ptxas
    run, which would cost about 40% more time), else, on a cache hit, from run_ptxas on
    the kernel's PTX with the same ptxas and flags."""
    result = Result(spec=spec.name, arch=arch, limit=SHARED_LIMIT.get(arch, 0))
    start = time.perf_counter()
    try:
        log = io.StringIO()
        old_dump = os.environ.get("TRITON_DUMP_PTXAS_LOG")
        os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"  # Triton prints its own ptxas -v log (3.x)
        try:
            with contextlib.redirect_stdout(log):
                compiled = compiled_kernel(spec, arch)
        finally:
            if old_dump is None:
                os.environ.pop("TRITON_DUMP_PTXAS_LOG", None)
            else:
                os.environ["TRITON_DUMP_PTXAS_LOG"] = old_dump
        result.shared = int(compiled.metadata.shared)
        ttgir = compiled.asm.get("ttgir", "")
        result.async_copies = len(pipelined.ASYNC_COPY.findall(ttgir))
        result.pipelined_sums = pipelined.copies_in(ttgir, pipelined.IN_PLACE_SUMS)
        try:
            usage, result.ptxas_log = parse_ptxas(log.getvalue()), "triton"
        except ValueError:  # a cache hit (no ptxas run) or a Triton without the log switch
            fusion = getattr(compiled.metadata, "enable_fp_fusion", True)
            usage, result.ptxas_log = parse_ptxas(run_ptxas(compiled.asm["ptx"], arch, fusion)), "rerun"
        for k, v in usage.items():
            setattr(result, k, v)
    except Exception as e:  # reported with the specialisation's name by check()
        result.error = f"{type(e).__name__}: {e}"
    result.seconds = time.perf_counter() - start
    return result


def _worker_init(cache_dir: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir


def _compile_job(job: tuple[Spec, int]) -> Result:
    return compile_spec(*job)


def run(specs: Sequence[Spec], archs: Sequence[int] = (80, 90), jobs: int = 2,
        cache_dir: Optional[str] = None, progress=None) -> list[Result]:
    """Compile every (spec, arch) with ``jobs`` processes (spawned: Triton and torch are not
    fork-safe once threads exist). ``cache_dir`` None: a fresh Triton cache, removed after,
    so every run really compiles (and times) each kernel; give one to reuse compiles."""
    fresh = cache_dir is None
    cache = tempfile.mkdtemp(prefix="relpos_cc_cache_") if fresh else cache_dir
    work = [(s, a) for s in specs for a in archs]
    try:
        if jobs <= 1:
            old = os.environ.get("TRITON_CACHE_DIR")
            _worker_init(cache)
            try:
                results = []
                for job in work:
                    results.append(_compile_job(job))
                    if progress:
                        progress(results[-1])
            finally:
                if old is None:
                    os.environ.pop("TRITON_CACHE_DIR", None)
                else:
                    os.environ["TRITON_CACHE_DIR"] = old
            return results
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_worker_init,
                                                    initargs=(cache,)) as pool:
            futures = [pool.submit(_compile_job, job) for job in work]
            results = []
            for f in futures:
                results.append(f.result())
                if progress:
                    progress(results[-1])
            return results
    finally:
        if fresh:
            shutil.rmtree(cache, ignore_errors=True)


def check(results: Sequence[Result]) -> None:
    """Raise CompileCheckError naming every specialisation that failed to compile, whose
    shared memory exceeds its arch's limit, or whose sums in global memory Triton pipelined."""
    bad = []
    for r in results:
        if r.error:
            bad.append(f"{r.spec} sm_{r.arch}: does not compile: {r.error.splitlines()[0] if r.error else ''}")
        elif r.shared > r.limit:
            bad.append(f"{r.spec} sm_{r.arch}: shared memory {r.shared} bytes exceeds the "
                       f"{ARCH_NAMES.get(r.arch, r.arch)} limit of {r.limit} bytes")
        elif r.pipelined_sums:
            bad.append(f"{r.spec} sm_{r.arch}: {r.pipelined_sums} loads of the sums it adds to in global memory are "
                       "pipelined (asynchronous copies issued ahead of the last tile's store; relpos.gpu.pipelined)")
    if bad:
        raise CompileCheckError(f"relpos.gpu compile check: {len(bad)} of {len(results)} failed:\n  "
                                + "\n  ".join(bad))


def table(results: Sequence[Result]) -> str:
    """A Markdown table of the results, then a summary line per arch."""
    lines = ["| specialisation | arch | shared B | % of limit | registers | spill st/ld B | async copies | compile s |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if r.error:
            lines.append(f"| {r.spec} | sm_{r.arch} | FAILED: {r.error.splitlines()[0][:80]} | | | | | "
                         f"{r.seconds:.1f} |")
            continue
        flag = "" if r.shared <= r.limit else " **over**"
        sums = f" ({r.pipelined_sums} of sums: **unsafe**)" if r.pipelined_sums else ""
        lines.append(f"| {r.spec} | sm_{r.arch} | {r.shared}{flag} | {100 * r.shared / r.limit:.0f} | "
                     f"{r.registers} | {r.spill_stores}/{r.spill_loads} | {r.async_copies}{sums} | {r.seconds:.1f} |")
    lines.append("")
    lines.extend(summary(results))
    return "\n".join(lines)


def summary(results: Sequence[Result]) -> list[str]:
    out = []
    for arch in sorted({r.arch for r in results}):
        rs = [r for r in results if r.arch == arch and not r.error]
        failed = sum(1 for r in results if r.arch == arch and r.error)
        if not rs:
            out.append(f"sm_{arch}: {failed} failed, none compiled")
            continue
        top = max(rs, key=lambda r: r.shared)
        spilling = [r for r in rs if r.spill_stores or r.spill_loads]
        out.append(f"sm_{arch}: {len(rs)} compiled, {failed} failed; max shared {top.shared} B of {top.limit} "
                   f"({top.spec}); max registers {max(r.registers for r in rs)}; "
                   f"{len(spilling)} spill (max {max((r.spill_stores for r in spilling), default=0)} B stored)")
    return out


def _csv(text: str, kind=str) -> tuple:
    return tuple(kind(x) for x in text.split(",") if x)


def _parse_launch(text: str) -> Launch:
    values = _csv(text, int)
    if len(values) != 4:
        raise argparse.ArgumentTypeError("expected BLOCK_M,BLOCK_N,NUM_WARPS,NUM_STAGES")
    return Launch(*values)


def _parse_only(item: str) -> tuple[str, tuple]:
    """``SWITCH=V1,V2`` as (switch, values) in FACTORS' types."""
    name, _, text = item.partition("=")
    if name not in FACTORS or not text:
        raise ValueError(f"{item!r}: expected SWITCH=V1,V2 with SWITCH one of {', '.join(FACTORS)}")
    values = []
    for v in text.split(","):
        if name == "bias":
            values.append(BIAS_NAMES.index(v) if v in BIAS_NAMES else int(v))
        elif name == "head":
            values.append(int(v))
        elif name in ("has_x", "causal", "has_pad", "clamp", "rope", "segments"):
            values.append(v.lower() in ("1", "true", "yes"))
        elif name in ("tables", "dropout", "grid"):
            values.append("" if v == "none" else v)
        else:
            values.append(v)
        if values[-1] not in FACTORS[name]:
            raise ValueError(f"{item!r}: {v} is not a value of {name} ({FACTORS[name]})")
    return name, tuple(values)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: exit 0 when every specialisation compiles and fits, 1 otherwise."""
    p = argparse.ArgumentParser(
        prog="python -m relpos.gpu.compile_check",
        description="Compile relpos.gpu's Triton kernels ahead of time for NVIDIA archs (no GPU needed) and "
                    "fail when one does not compile or exceeds the card's shared memory per block "
                    f"({', '.join(f'sm_{a}: {v} B' for a, v in SHARED_LIMIT.items())}).")
    p.add_argument("--arch", type=lambda s: _csv(s, int), default=(80, 90), help="comma list (default 80,90)")
    p.add_argument("--full", action="store_true", help="every specialisation of the product, not the pairwise "
                   "covering set")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': standard output)")
    p.add_argument("--jobs", type=int, default=2, help="compile processes (default 2)")
    p.add_argument("--cache-dir", help="a Triton cache to reuse (default: a fresh one per run)")
    p.add_argument("--generic", action="store_true", help="no alignment / unit-stride hints on the arguments")
    p.add_argument("--launch", type=_parse_launch, metavar="BM,BN,WARPS,STAGES",
                   help="one launch configuration for every specialisation instead of config.launch_for's")
    p.add_argument("--only", action="append", default=[], metavar="SWITCH=V1,V2",
                   help="narrow a switch to some values (repeatable): kernel (" + ",".join(KERNELS) + "), dtype ("
                   + ",".join(DTYPES) + "), bias (0..4 or " + ",".join(BIAS_NAMES) + "), has_x, causal, has_pad "
                   "(0/1), head (64,128), tables (none," + ",".join(TABLES[1:]) + "), dropout (none,"
                   + ",".join(DROPOUT[1:]) + ")")
    p.add_argument("--quiet", action="store_true", help="print the summary only")
    args = p.parse_args(argv)
    for a in args.arch:
        if a not in SHARED_LIMIT:
            p.error(f"--arch: {a}: known archs are {', '.join(map(str, SHARED_LIMIT))}")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        p.error("TRITON_INTERPRET is set: the kernels would be interpreter functions; unset it")
    try:
        only = dict(_parse_only(item) for item in args.only)
    except ValueError as e:
        p.error(f"--only: {e}")
    make = full_specs if args.full else covering_specs
    specs = make(launch=args.launch, aligned=not args.generic, **only)
    import triton

    start = time.perf_counter()
    results = run(specs, args.arch, jobs=args.jobs, cache_dir=args.cache_dir)
    elapsed = time.perf_counter() - start
    out = sys.stderr if args.json == "-" else sys.stdout  # standard output holds the JSON then
    print("\n".join(summary(results)) if args.quiet else table(results), file=out)
    print(f"{len(specs)} specialisations x {len(args.arch)} archs compiled in {elapsed:.1f} s "
          f"({args.jobs} processes; Triton {triton.__version__}; {platform.machine()})", file=out)
    if args.json:
        doc = dict(triton=triton.__version__, archs=list(args.arch), full=args.full, seconds=elapsed,
                   limits={str(a): SHARED_LIMIT[a] for a in args.arch},
                   results=[asdict(r) | dict(fits=r.fits)
                            for r in results])
        text = json.dumps(doc, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    try:
        check(results)
    except CompileCheckError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
