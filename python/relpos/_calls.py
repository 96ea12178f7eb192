"""Argument marshalling for ``relpos.forward`` / ``backward`` / ``available_algorithms``:
the caller's arrays and options checked by name and turned into the dict the core
reads (``_relpos.forward(args)``), arrays handed over in place.

Also the checks ``relpos.torch`` shares with it (``check_dtypes``, ``check_threads``,
``heads_first``, ``resolve_q_offset``): the torch ops apply the same rules where the
core never sees the tensors (fake implementations, compiled graphs).
"""
from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from relpos.schemes import choice, dropout_probability, flag, integer, number, record_of

ALGORITHMS = ("auto", "reference", "split", "gather", "skew", "generalized_skew", "relshift", "fused")
LAYOUTS = ("bhld", "blhd")

_DTYPES = ("float32", "float64", "bfloat16", "float16")
_HALF = ("bfloat16", "float16")


def _torch_tensor_type():
    """torch.Tensor if torch is already imported (relpos never imports it itself), else None."""
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def is_torch(x: Any) -> bool:
    tensor = _torch_tensor_type()
    return tensor is not None and isinstance(x, tensor)


def _dtype_name(x) -> str:
    """``"float32"``, ``"bfloat16"``, ... for a NumPy array (ml_dtypes' bfloat16 included) or a torch tensor."""
    return str(x.dtype).replace("torch.", "")


def core_array(x: Any, name: str):
    """``x`` as an array the core reads in place: a NumPy array, or a detached torch
    tensor (same storage; DLPack refuses tensors that require grad)."""
    if is_torch(x):
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
    alike (``relpos.torch.ops`` applies it where the core never sees the tensors): q
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
        elif name in ("q_segments", "k_segments"):
            if got not in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"):
                raise ValueError(f"relpos: {name}: dtype must be an integer type, got {got}")
        elif name == "lse":
            expected = "float32" if storage in _HALF else storage
            if got != expected:
                raise ValueError(f"relpos: lse: dtype must be {expected}, got {got}")
        elif got != storage:
            raise ValueError(f"relpos: {name}: dtype must match q ({storage}), got {got}")


def core_args(args: dict) -> dict:
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
        if name in ("lse", "key_padding", "q_segments", "k_segments") or not hasattr(a, "dtype"):
            continue
        core[name] = a.view(sys.modules["torch"].int16) if is_torch(a) else a.view(np.uint16)
    return core


# The axes of each array of a call that count batch entries, queries or keys.
_ROW_AXES = {
    "q": {0: "B", 2: "Lq"}, "k": {0: "B", 2: "Lk"}, "v": {0: "B", 2: "Lk"}, "key_padding": {0: "B", 1: "Lk"},
    "q_segments": {0: "B", 1: "Lq"}, "k_segments": {0: "B", 1: "Lk"},
    "out": {0: "B", 2: "Lq"}, "lse": {0: "B", 2: "Lq"}, "dout": {0: "B", 2: "Lq"},
    "dq": {0: "B", 2: "Lq"}, "dk": {0: "B", 2: "Lk"}, "dv": {0: "B", 2: "Lk"},
}


def zero_length(args: dict) -> bool:
    """Whether the call has no batch entries, no queries or no keys: its result is known
    (nothing, or rows that see no key), and the core refuses zero extents."""
    return 0 in (args["q"].shape[0], args["q"].shape[2], args["k"].shape[2])


def stand_in(args: dict) -> dict:
    """A zero-length call as one of a single batch entry, query or key where it has none,
    on new zero arrays (gradient accumulators included, so nothing of it reaches the
    caller): the core then checks everything else (heads, widths, the scheme's tables
    and options) as in any call. The arrays' row counts must agree with q's and k's
    first, since the stand-in would hide a disagreement."""
    rows = {"B": args["q"].shape[0], "Lq": args["q"].shape[2], "Lk": args["k"].shape[2]}
    replaced = dict(args)
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
        replaced[name] = _new(a, shape, zero=True)
    return replaced


def check_zero_length(args: dict, run) -> None:
    """``run`` (a core entry) on the stand-in of a zero-length call, its errors marked as such."""
    checked = core_args(stand_in(args))
    try:
        run(checked)
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
    if is_torch(like):
        torch = sys.modules["torch"]
        return (torch.zeros if zero else torch.empty)(tuple(shape), dtype=torch.float32 if float32 else like.dtype)
    return (np.zeros if zero else np.empty)(tuple(shape), dtype=np.float32 if float32 else like.dtype)


def _as_core_param(name: str, a: np.ndarray) -> np.ndarray:
    # A Shaw or DeBERTa table shared by heads may be given as (rows, d); the core wants (1, rows, d).
    return a[None] if name.startswith(("shaw_", "deberta_")) and a.ndim == 2 else a


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
    return x.transpose(1, 2) if is_torch(x) else np.swapaxes(x, 1, 2)


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


def dropout_args(dropout_p, dropout_seed, dropout_offset) -> dict:
    """A call's dropout options, checked by name, as the core reads them (none where
    ``dropout_p`` is 0: the call's exact path). The seed is a 64-bit word (a negative
    int64, as a torch int64 tensor holds one, is taken as its two's complement), the
    offset a 32-bit one."""
    p = dropout_probability(dropout_p)
    if isinstance(dropout_seed, (bool, np.bool_)) or not isinstance(dropout_seed, (int, np.integer)) \
            or not -(2**63) <= int(dropout_seed) < 2**64:
        raise ValueError(f"relpos: dropout_seed: expected an integer in [0, 2^64) (or a negative int64), "
                         f"got {dropout_seed!r}")
    offset = integer(dropout_offset, "dropout_offset")
    if not 0 <= offset < 2**32:
        raise ValueError(f"relpos: dropout_offset: must be in [0, 2^32), got {dropout_offset!r}")
    if p == 0:
        return {}
    return {"dropout_p": p, "dropout_seed": int(dropout_seed) % 2**64, "dropout_offset": offset}


def segment_ids(x, name: str):
    """Segment ids (B, L) as the core reads them, int32 (a torch tensor stays one, on the CPU):
    any integer array whose values fit in int32, named in errors."""
    if is_torch(x):
        torch = sys.modules["torch"]
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise ValueError(f"relpos: {name}: expected integer segment ids, got {x.dtype}")
        if x.numel() and (int(x.min()) < -(2**31) or int(x.max()) >= 2**31):
            raise ValueError(f"relpos: {name}: segment ids must fit in int32")
        return _torch_in_place(x.to(torch.int32), name)
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise ValueError(f"relpos: {name}: expected integer segment ids, got {a.dtype}")
    if a.size and (int(a.min()) < -(2**31) or int(a.max()) >= 2**31):
        raise ValueError(f"relpos: {name}: segment ids must fit in int32")
    return _whole_items(np.ascontiguousarray(a, dtype=np.int32), name)


def segments_args(segments, Lq: int, Lk: int) -> dict:
    """``segments`` (one (B, L) array of ids for queries and keys alike, which needs Lq == Lk,
    or a pair (q_segments, k_segments)) as the core reads them; none for None."""
    if segments is None:
        return {}
    if isinstance(segments, (tuple, list)):
        if len(segments) != 2:
            raise ValueError("relpos: segments: expected an array of ids or a pair (q_segments, k_segments), "
                             f"got a sequence of {len(segments)}")
        q_ids, k_ids = segments
    else:
        if Lq != Lk:
            raise ValueError(f"relpos: segments: one array of ids serves Lq == Lk only (got Lq={Lq}, Lk={Lk}); "
                             "give a pair (q_segments, k_segments)")
        q_ids = k_ids = segments
    return {"q_segments": segment_ids(q_ids, "q_segments"), "k_segments": segment_ids(k_ids, "k_segments")}


def call_args(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, algorithm, threads=None,
              layout="bhld", dropout_p=0.0, dropout_seed=0, dropout_offset=0, segments=None) -> dict:
    """The inputs and options every entry shares, checked and named as the core reads
    them: q, k, v seen heads-first, the scheme's options and tables, dropout's options."""
    scheme = record_of(scheme)
    args: dict[str, Any] = {"q": core_array(q, "q"), "k": core_array(k, "k"), "v": core_array(v, "v")}
    for name in ("q", "k", "v"):
        if args[name].ndim != 4:
            raise ValueError(f"relpos: {name}: expected 4 dimensions, got shape {tuple(args[name].shape)}")
        args[name] = heads_first(args[name], layout)
    args.update(scheme=scheme.name, causal=flag(causal, "causal"), algorithm=choice(algorithm, "algorithm", ALGORITHMS))
    q_offset = resolve_q_offset(q_offset, args["q"].shape[2], args["k"].shape[2], k_offset)
    args.update(q_offset=q_offset, k_offset=integer(k_offset, "k_offset"))
    if scale is not None:
        args["scale"] = number(scale, "scale")
    if threads is not None:
        args["threads"] = check_threads(threads)
    args.update(dropout_args(dropout_p, dropout_seed, dropout_offset))
    if key_padding is not None:
        kp = _torch_in_place(key_padding, "key_padding") if is_torch(key_padding) else np.asarray(key_padding)
        args["key_padding"] = kp if is_torch(kp) else _whole_items(kp, "key_padding")
    args.update(segments_args(segments, args["q"].shape[2], args["k"].shape[2]))
    args.update(scheme._args())
    for name, p in scheme._params().items():
        args[name] = _as_core_param(name, core_array(p, name))
    return args


def forward_outputs(args: dict, layout: str, zero: bool):
    """Adds the forward's outputs to ``args``: ``out`` (B, H, Lq, dv), new in the caller's
    ``layout`` and seen heads-first, and ``lse`` (B, H, Lq) in q's dtype, float32 when q
    is stored in a half type. Returns ``out`` as the caller gets it; ``zero`` fills it
    with zeros (rows that see no key), else it is left for the core to write."""
    q, v = args["q"], args["v"]
    B, H, Lq, dv = q.shape[0], q.shape[1], q.shape[2], v.shape[3]
    out = _new(q, (B, H, Lq, dv) if layout == "bhld" else (B, Lq, H, dv), zero=zero)
    args["out"] = heads_first(out, layout)
    args["lse"] = _new(q, q.shape[:3], zero=False, float32=_dtype_name(q) in _HALF)
    return out


def _writable(a):
    """torch tensors are always writable; a read-only NumPy array is copied."""
    return a if is_torch(a) else np.require(a, requirements="W")


def backward_arrays(args: dict, out, lse, dout, scheme, add_into: dict, layout: str) -> dict:
    """Adds the backward's inputs (``out``, ``lse``, ``dout``) and gradient accumulators
    (``dq``, ``dk``, ``dv``, ``d_<param>``) to ``args``; returns the gradients by name,
    as the caller gets them: new zeros, or the arrays of ``add_into`` to add into."""
    # The core reads out and lse through the same (writable) views forward filled.
    args["out"], args["lse"] = heads_first(_writable(core_array(out, "out")), layout), _writable(core_array(lse, "lse"))
    args["dout"] = heads_first(core_array(dout, "dout"), layout)
    torch_call = is_torch(args["q"])

    if not isinstance(add_into, Mapping):
        raise ValueError("relpos: add_into: expected a dict of gradient names to arrays, "
                         f"got {type(add_into).__name__}")
    kind = "a tensor" if torch_call else "an array"

    def gradient(name, shape):
        if name not in add_into:
            return _new(args["q"], shape, zero=True)
        g = add_into[name]
        right_kind = is_torch(g) == torch_call and (torch_call or isinstance(g, np.ndarray))
        if not right_kind or tuple(g.shape) != tuple(shape):
            got = type(g).__name__ + (f" of shape {tuple(g.shape)}" if right_kind else "")
            raise ValueError(f"relpos: add_into[{name!r}]: expected {kind} of shape {tuple(shape)}, got {got}")
        if not torch_call and not g.flags.writeable:
            raise ValueError(f"relpos: add_into[{name!r}]: the array is read-only (gradients are added into it)")
        return g if is_torch(g) else _whole_items(g, f"add_into[{name!r}]")

    grads: dict[str, Any] = {}
    for name in ("q", "k", "v"):
        grads[name] = gradient(name, heads_first(args[name], layout).shape)  # the caller's layout
        args["d" + name] = heads_first(core_array(grads[name], "d" + name), layout)
    scheme = record_of(scheme)
    for name, p in scheme._params().items():
        grads[name] = gradient(name, tuple(p.shape) if is_torch(p) else np.shape(p))
        args["d_" + name] = _as_core_param(name, core_array(grads[name], "d_" + name))
    if unknown := [name for name in add_into if name not in grads]:  # else silently never added into
        raise ValueError(f"relpos: add_into: no gradient named {unknown[0]!r} in this call; "
                         f"its gradients are {', '.join(grads)}")
    return grads
