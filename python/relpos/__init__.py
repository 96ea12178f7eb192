"""relpos: attention with relative position representations, forward and backward.

    import numpy as np, relpos
    q = k = v = np.random.randn(2, 4, 128, 64).astype(np.float32)   # (B, H, L, d)
    scheme = relpos.Shaw(k=16, wk=np.random.randn(33, 64).astype(np.float32))
    out, lse = relpos.forward(q, k, v, scheme, causal=True)
    grads = relpos.backward(q, k, v, out, lse, np.ones_like(out), scheme, causal=True)
    grads["q"], grads["shaw_wk"]

Arrays are NumPy arrays or CPU torch tensors of float32, float64, bfloat16 or
float16 (all the same dtype; NumPy's bfloat16 is ``ml_dtypes.bfloat16``), any
strides. bfloat16 and float16 are storage: relpos computes in float32 and
rounds each result once, and ``lse`` is float32; q is ``(B, H, Lq, d)``, k ``(B, Hkv, Lk, d)``, v
``(B, Hkv, Lk, dv)`` with ``Hkv`` dividing ``H`` (grouped-query attention: query
head ``h`` reads key head ``h // (H // Hkv)``; ``Hkv = H`` is multi-head
attention). Both are handed to the core in place (NumPy through the
buffer protocol, torch through DLPack), never copied; outputs are torch tensors
when q is one, NumPy arrays otherwise. Bad input raises ``ValueError`` naming
the argument. ``relpos.torch`` (needs torch) adds autograd and an nn.Module.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Optional

import numpy as np


def _prefer_passive_openmp_wait() -> None:
    """Idle OpenMP threads spin by default, taking cores from whatever else runs
    (7-14x slower training beside another busy process). The extension links
    the system's libgomp, which reads OMP_WAIT_POLICY once, when it loads:
    set it to passive before that, unless the user chose a policy or the
    runtime is already loaded (then it keeps the policy it started with)."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    try:
        with open("/proc/self/maps") as maps:
            if any("/libgomp.so" in line for line in maps):
                return
    except OSError:
        pass
    os.environ["OMP_WAIT_POLICY"] = "passive"


_prefer_passive_openmp_wait()

from . import _relpos  # noqa: E402  (after the wait policy is set)
from . import schemes
from .schemes import *  # noqa: E402,F401,F403  (the scheme records: NoPosition, Shaw, T5, ...; schemes.__all__)
from .schemes import choice, integer, number

__all__ = [
    "forward",
    "backward",
    *schemes.__all__,
    "t5_bucket",
    "alibi_slopes",
    "ALGORITHMS",
    "LAYOUTS",
    "heads_first",
    "resolve_q_offset",
    "available_algorithms",
    "info",
]

ALGORITHMS = ("auto", "reference", "split", "gather", "skew", "generalized_skew", "relshift", "fused")
LAYOUTS = ("bhld", "blhd")

__version__ = _relpos.build_info()["version"]

t5_bucket = _relpos.t5_bucket
def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi's head slopes of the paper for any head count, a float64 array ``(num_heads,)``
    (the geometric sequence 2^(-8/n)... for a power of two n; otherwise the next lower power's
    slopes followed by every other slope of twice that power)."""
    return np.asarray(_relpos.alibi_slopes(integer(num_heads, "num_heads")), dtype=np.float64)



def _torch_tensor_type():
    """torch.Tensor if torch is already imported (relpos never imports it itself), else None."""
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def _is_torch(x: Any) -> bool:
    tensor = _torch_tensor_type()
    return tensor is not None and isinstance(x, tensor)


_DTYPES = ("float32", "float64", "bfloat16", "float16")
_HALF = ("bfloat16", "float16")


def _dtype_name(x) -> str:
    """``"float32"``, ``"bfloat16"``, ... for a NumPy array (ml_dtypes' bfloat16 included) or a torch tensor."""
    return str(x.dtype).replace("torch.", "")


def _array(x: Any, name: str):
    """``x`` as an array the core reads in place: a NumPy array, or a detached torch
    tensor (same storage; DLPack refuses tensors that require grad)."""
    if _is_torch(x):
        if _dtype_name(x) not in _DTYPES:
            raise ValueError(f"relpos: {name}: dtype must be float32, float64, bfloat16 or float16, got {x.dtype}")
        return _torch_in_place(x, name)
    try:
        a = np.asarray(x)
    except Exception as e:
        raise ValueError(f"relpos: {name}: cannot be read as an array ({e})") from None
    if _dtype_name(a) not in _DTYPES:
        raise ValueError(f"relpos: {name}: dtype must be float32, float64, bfloat16 or float16, got {a.dtype}")
    return _whole_items(a, name)


def check_dtypes(arrays: dict) -> None:
    """The dtype rule of a call, by argument name, for NumPy arrays and torch tensors
    alike (``relpos.torch_op`` applies it where the core never sees the tensors): q
    one of ``_DTYPES``, ``lse`` float32 when q is stored in a half type (else q's
    dtype), ``key_padding`` bool or uint8, every other array q's dtype. Entries
    without a dtype (options) are skipped. Checked before the core reads anything,
    since an array the core cannot view (NumPy's bfloat16 beside a float32 q) would
    otherwise be refused for that, not for its dtype."""
    storage = _dtype_name(arrays["q"])
    if storage not in _DTYPES:
        raise ValueError(f"relpos: q: dtype must be float32, float64, bfloat16 or float16, got {storage}")
    for name, a in arrays.items():
        if not hasattr(a, "dtype"):
            continue
        got = _dtype_name(a)
        if name == "key_padding":
            if got not in ("bool", "uint8"):
                raise ValueError(f"relpos: key_padding: dtype must be bool or uint8, got {got}")
        elif name == "lse":
            expected = "float32" if storage in _HALF else storage
            if got != expected:
                raise ValueError(f"relpos: lse: dtype must be {expected}, got {got}")
        elif got != storage:
            raise ValueError(f"relpos: {name}: dtype must match q ({storage}), got {got}")


def _core(args: dict) -> dict:
    """``args`` as the core reads them, their dtypes checked. Half-width arrays travel as
    16-bit integer views of the same memory, with their type in ``"storage"``: NumPy's
    buffer protocol knows no bfloat16 and DLPack's bfloat16 is not in every library."""
    check_dtypes(args)
    for name, a in args.items():
        # The core refuses these too, but reads an empty torch tensor's null pointer as a missing array.
        if hasattr(a, "shape") and 0 in tuple(a.shape):
            raise ValueError(f"relpos: {name}: every dimension must be >= 1, got shape {tuple(a.shape)}")
    storage = _dtype_name(args["q"])
    if storage not in _HALF:
        return args
    core = dict(args, storage=storage)
    for name, a in args.items():
        if name in ("lse", "key_padding") or not hasattr(a, "dtype"):
            continue
        core[name] = a.view(sys.modules["torch"].int16) if _is_torch(a) else a.view(np.uint16)
    return core


# The axes of each array of a call that count batch entries, queries or keys.
_ROW_AXES = {
    "q": {0: "B", 2: "Lq"}, "k": {0: "B", 2: "Lk"}, "v": {0: "B", 2: "Lk"}, "key_padding": {0: "B", 1: "Lk"},
    "out": {0: "B", 2: "Lq"}, "lse": {0: "B", 2: "Lq"}, "dout": {0: "B", 2: "Lq"},
    "dq": {0: "B", 2: "Lq"}, "dk": {0: "B", 2: "Lk"}, "dv": {0: "B", 2: "Lk"},
}


def _zero_length(args: dict) -> bool:
    """Whether the call has no batch entries, no queries or no keys: its result is known
    (nothing, or rows that see no key), and the core refuses zero extents."""
    return 0 in (args["q"].shape[0], args["q"].shape[2], args["k"].shape[2])


def _stand_in(args: dict) -> dict:
    """A zero-length call as one of a single batch entry, query or key where it has none,
    on new zero arrays (gradient accumulators included, so nothing of it reaches the
    caller): the core then checks everything else (heads, widths, the scheme's tables
    and options) as in any call. The arrays' row counts must agree with q's and k's
    first, since the stand-in would hide a disagreement."""
    rows = {"B": args["q"].shape[0], "Lq": args["q"].shape[2], "Lk": args["k"].shape[2]}
    stand_in = dict(args)
    for name, a in args.items():
        axes = _ROW_AXES.get(name, {} if name.startswith("d_") else None)
        if axes is None or not hasattr(a, "shape") or a.ndim <= max(axes, default=-1):
            continue  # an option, a scheme tensor, or an array of the wrong rank (the core names it)
        shape = list(a.shape)
        for axis, extent in axes.items():
            if shape[axis] != rows[extent]:
                raise ValueError(f"relpos: {name}: expected {extent}={rows[extent]} (axis {axis}) like q and k, "
                                 f"got shape {tuple(a.shape)}")
            shape[axis] = max(shape[axis], 1)
        stand_in[name] = _new(a, shape, zero=True)
    return stand_in


def _check_zero_length(args: dict, run) -> None:
    """``run`` (a core entry) on the stand-in of a zero-length call, its errors marked as such."""
    stand_in = _core(_stand_in(args))
    try:
        run(stand_in)
    except ValueError as e:
        raise ValueError(f"{e} (a zero-length call, checked as one with 1 row where it has 0)") from None


def _torch_in_place(x, name: str):
    """A CPU strided tensor the core can read through DLPack: refuses sparse and
    non-CPU tensors, and resolves torch's lazy negation (``x.conj().imag`` of a
    complex tensor is a view whose values are negated on read; the core reads
    memory, so it gets a resolved copy)."""
    torch = sys.modules["torch"]
    if x.layout != torch.strided:
        raise ValueError(f"relpos: {name}: {x.layout} tensors are not supported; pass a dense tensor (.to_dense())")
    if x.device.type != "cpu":
        raise ValueError(f"relpos: {name}: tensor must be on the CPU, got device {x.device}")
    if x.requires_grad and torch.is_grad_enabled():
        warnings.warn(f"relpos: {name} requires grad, but relpos.forward/backward record no gradient; "
                      "use relpos.torch.attention for autograd", stacklevel=4)
    x = x.detach()
    return x.resolve_neg() if x.is_neg() else x


def _whole_items(a: np.ndarray, name: str) -> np.ndarray:
    """The core counts strides in elements: byte strides must be multiples of the item size."""
    if any(s % a.itemsize for s in a.strides):
        raise ValueError(f"relpos: {name}: byte strides {a.strides} are not multiples of the item size "
                         f"{a.itemsize}; pass a copy (np.ascontiguousarray)")
    return a


def _new(like, shape, zero: bool, float32: bool = False):
    """A new array of ``like``'s kind (torch tensor or NumPy array) and dtype (float32 if asked)."""
    if _is_torch(like):
        torch = sys.modules["torch"]
        return (torch.zeros if zero else torch.empty)(tuple(shape), dtype=torch.float32 if float32 else like.dtype)
    return (np.zeros if zero else np.empty)(tuple(shape), dtype=np.float32 if float32 else like.dtype)


def _lse_like(q, shape):
    """lse: q's dtype, float32 when q is stored in a half type."""
    return _new(q, shape, zero=False, float32=_dtype_name(q) in _HALF)


def _as_core_param(name: str, a: np.ndarray) -> np.ndarray:
    # A Shaw table shared by heads may be given as (2k+1, d); the core wants (1, 2k+1, d).
    return a[None] if name.startswith("shaw_") and a.ndim == 2 else a


def check_threads(threads) -> int:
    """threads as an int in [0, 4096]; 0 means OpenMP's maximum, as on the command line."""
    n = integer(threads, "threads")
    if not 0 <= n <= 4096:
        raise ValueError(f"relpos: threads: must be in [0, 4096] (0 = all cores), got {threads}")
    return n


def heads_first(x, layout: str):
    """``x`` in ``layout`` seen as ``(B, H, L, d)``: itself for ``"bhld"``, for
    ``"blhd"`` (``(B, L, H, d)``, FlashAttention's layout) a transposed view, no copy."""
    if choice(layout, "layout", LAYOUTS) == "bhld":
        return x
    return x.transpose(1, 2) if _is_torch(x) else np.swapaxes(x, 1, 2)


def resolve_q_offset(q_offset, Lq: int, Lk: int, k_offset: int) -> int:
    """``q_offset`` as an int; ``"end"`` places the queries at the last ``Lq`` key
    positions (``k_offset + Lk - Lq``): a KV-cache step, or FlashAttention's
    bottom-right causal alignment, with no offset arithmetic by the caller."""
    if isinstance(q_offset, str):
        if q_offset != "end":
            raise ValueError(f"relpos: q_offset: expected an integer or 'end', got {q_offset!r}")
        if Lq > Lk + integer(k_offset, "k_offset"):
            raise ValueError(f"relpos: q_offset='end': {Lq} queries cannot end with {Lk} keys at k_offset={k_offset} "
                             "(the first query would sit before position 0)")
        return integer(k_offset, "k_offset") + Lk - Lq
    return integer(q_offset, "q_offset")


def _call_args(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, algorithm, threads=None,
               layout="bhld") -> dict:
    scheme = NoPosition() if scheme is None else scheme
    if not hasattr(scheme, "_args"):
        raise ValueError(f"relpos: scheme: expected a relpos scheme (Shaw, T5, ...), got {type(scheme).__name__}")
    args: dict[str, Any] = {"q": _array(q, "q"), "k": _array(k, "k"), "v": _array(v, "v")}
    for name in ("q", "k", "v"):
        if args[name].ndim != 4:
            raise ValueError(f"relpos: {name}: expected 4 dimensions, got shape {tuple(args[name].shape)}")
        args[name] = heads_first(args[name], layout)
    args.update(scheme=scheme.name, causal=bool(causal), algorithm=choice(algorithm, "algorithm", ALGORITHMS))
    q_offset = resolve_q_offset(q_offset, args["q"].shape[2], args["k"].shape[2], k_offset)
    args.update(q_offset=q_offset, k_offset=integer(k_offset, "k_offset"))
    if scale is not None:
        args["scale"] = number(scale, "scale")
    if threads is not None:
        args["threads"] = check_threads(threads)
    if key_padding is not None:
        kp = _torch_in_place(key_padding, "key_padding") if _is_torch(key_padding) else np.asarray(key_padding)
        args["key_padding"] = kp if _is_torch(kp) else _whole_items(kp, "key_padding")
    args.update(scheme._args())
    for name, p in scheme._params().items():
        args[name] = _as_core_param(name, _array(p, name))
    return args


def forward(
    q,
    k,
    v,
    scheme=None,
    *,
    causal: bool = False,
    key_padding=None,
    q_offset: int = 0,
    k_offset: int = 0,
    scale: Optional[float] = None,
    algorithm: str = "auto",
    threads: Optional[int] = None,
    layout: str = "bhld",
) -> tuple[np.ndarray, np.ndarray]:
    """Attention with a relative position scheme.

    Returns ``(out, lse)`` (torch tensors if q is one, else NumPy arrays):
    ``out`` of shape ``(B, H, Lq, dv)`` and the row
    logsumexp ``lse`` of shape ``(B, H, Lq)`` that ``backward`` needs
    (``-inf`` for a row whose keys are all masked; its output is zero).
    A zero-length call (B, Lq or Lk of 0; heads and widths must be >= 1) is checked
    like any other and returns at once: empty arrays, or with no keys rows of zeros
    and lse ``-inf``; ``backward`` then gives zero gradients.
    ``layout="blhd"`` takes q, k, v as ``(B, L, H, d)`` and returns ``out`` as
    ``(B, Lq, H, dv)`` (read and written in place; ``lse`` stays ``(B, H, Lq)``).

    ``causal`` masks keys in the future (``r > 0``); ``key_padding`` is a bool
    or uint8 ``(B, Lk)`` array, true for padded keys. Query row ``i`` sits at
    absolute position ``q_offset + i`` and key row ``j`` at ``k_offset + j``;
    ``q_offset="end"`` puts the queries at the last key positions (a KV-cache
    step; with ``causal``, FlashAttention's bottom-right alignment).
    ``scale`` defaults to the scheme's: 1 for ``T5``, ``1/sqrt(d)`` otherwise. ``algorithm`` is one of ``ALGORITHMS``
    (see ``available_algorithms``); ``threads`` (default or 0: OpenMP's maximum)
    splits the work over threads. The forward's results do not depend on it; the
    backward's summation order of shared parameter gradients (and of dq, when
    a head's keys are split over threads) does, so a run repeats its bits for
    a given thread count.
    """
    args = _call_args(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, algorithm, threads, layout)
    qa, va = args["q"], args["v"]
    B, H, Lq, dv = qa.shape[0], qa.shape[1], qa.shape[2], va.shape[3]
    zero_length = _zero_length(args)
    out = _new(qa, (B, H, Lq, dv) if layout == "bhld" else (B, Lq, H, dv), zero=zero_length)
    args["out"] = heads_first(out, layout)
    args["lse"] = _lse_like(qa, qa.shape[:3])
    if zero_length:  # rows that see no key: output 0, lse -inf (nothing at all without queries)
        _check_zero_length(args, _relpos.available_algorithms)
        args["lse"][...] = -np.inf
    else:
        _relpos.forward(_core(args))
    return out, args["lse"]


def available_algorithms(
    q,
    k,
    v,
    scheme=None,
    *,
    causal: bool = False,
    key_padding=None,
    q_offset: int = 0,
    k_offset: int = 0,
    scale: Optional[float] = None,
    layout: str = "bhld",
) -> list[str]:
    """The algorithms (besides ``"auto"``) that serve this call: every one of
    them gives the reference's result; they differ in memory and time."""
    args = _call_args(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, "auto", None, layout)
    qa, va = args["q"], args["v"]
    # Validated as a forward call (shapes, options, memory), on outputs never written.
    args["out"] = _new(qa, tuple(qa.shape[:3]) + tuple(va.shape[3:]), zero=False)
    args["lse"] = _lse_like(qa, qa.shape[:3])
    # A zero-length call is served by what serves its stand-in (forward checks it so).
    return list(_relpos.available_algorithms(_core(_stand_in(args) if _zero_length(args) else args)))


def _writable(a):
    """torch tensors are always writable; a read-only NumPy array is copied."""
    return a if _is_torch(a) else np.require(a, requirements="W")


def backward(
    q,
    k,
    v,
    out,
    lse,
    dout,
    scheme=None,
    *,
    causal: bool = False,
    key_padding=None,
    q_offset: int = 0,
    k_offset: int = 0,
    scale: Optional[float] = None,
    algorithm: str = "auto",
    threads: Optional[int] = None,
    layout: str = "bhld",
    add_into: Optional[dict] = None,
) -> dict[str, np.ndarray]:
    """Gradients of ``sum(dout * out)`` given ``forward``'s ``out`` and ``lse``
    (options as in ``forward``; with ``layout="blhd"`` out, dout and the
    gradients of q, k, v are ``(B, L, H, d)`` too). ``add_into`` maps some of the
    names below to arrays of the gradients' kind, dtype and shape (views welcome):
    those gradients are added into them, in place, instead of into new zeros.

    Returns a dict (torch tensors if q is one) with ``"q"``, ``"k"``, ``"v"`` and one entry per learnable
    parameter of the scheme, named ``<scheme>_<field>``: ``"shaw_wk"``, ``"shaw_wv"``,
    ``"t5_table"``, ``"alibi_slopes"`` (explicit slopes only), ``"xl_u"``, ``"xl_v"``,
    ``"xl_w_r"``, ``"kerple_r1"``, ``"kerple_r2"``; each gradient has its parameter's shape.
    """
    args = _call_args(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, algorithm, threads, layout)
    # The core reads out and lse through the same (writable) views forward filled.
    args["out"], args["lse"] = heads_first(_writable(_array(out, "out")), layout), _writable(_array(lse, "lse"))
    args["dout"] = heads_first(_array(dout, "dout"), layout)
    add_into = add_into or {}

    def gradient(name, shape):
        if name not in add_into:
            return _new(args["q"], shape, zero=True)
        g = add_into[name]
        if _is_torch(g) != _is_torch(args["q"]) or tuple(g.shape) != tuple(shape):
            raise ValueError(f"relpos: add_into[{name!r}]: expected {'a tensor' if _is_torch(args['q']) else 'an array'} "
                             f"of shape {tuple(shape)}, got {type(g).__name__} of shape {tuple(g.shape)}")
        return g if _is_torch(g) else _whole_items(g, f"add_into[{name!r}]")

    grads: dict[str, np.ndarray] = {}
    for name in ("q", "k", "v"):
        grads[name] = gradient(name, heads_first(args[name], layout).shape)  # the caller's layout
        args["d" + name] = heads_first(_array(grads[name], "d" + name), layout)
    scheme = NoPosition() if scheme is None else scheme
    for name, p in scheme._params().items():
        grads[name] = gradient(name, tuple(p.shape) if _is_torch(p) else np.shape(p))
        args["d_" + name] = _as_core_param(name, _array(grads[name], "d_" + name))
    if _zero_length(args):  # no term of sum(dout * out) depends on anything: every gradient is zero
        _check_zero_length(args, _relpos.backward)
    else:
        _relpos.backward(_core(args))
    return grads


def info() -> dict:
    """What this build runs on: ``version``, ``simd_target`` (the target its vector
    loops run on, chosen at run time; the environment variable RELPOS_SIMD limits
    it), ``simd_compiled``, ``simd_supported``, ``gemm`` and ``gemm_isa`` (oneDNN and
    the instruction set it uses), ``half_storage`` (how bfloat16 / float16 calls compute)
    and ``cpu_avx512_bf16``, ``threads`` and ``openmp_wait_policy``."""
    return _relpos.build_info()
