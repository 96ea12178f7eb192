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
from typing import Optional

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
from . import _calls, schemes  # noqa: E402
from ._calls import ALGORITHMS, LAYOUTS, heads_first, resolve_q_offset  # noqa: E402
from .schemes import *  # noqa: E402,F401,F403  (the scheme records: NoPosition, Shaw, T5, ...; schemes.__all__)
from .schemes import integer  # noqa: E402

__all__ = [
    "forward",
    "backward",
    *schemes.__all__,
    "t5_bucket",
    "deberta_bucket",
    "alibi_slopes",
    "ALGORITHMS",
    "LAYOUTS",
    "heads_first",
    "resolve_q_offset",
    "available_algorithms",
    "dropout_mask",
    "info",
]

__version__ = _relpos.build_info()["version"]

t5_bucket = _relpos.t5_bucket
deberta_bucket = _relpos.deberta_bucket


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi's head slopes of the paper for any head count, a float64 array ``(num_heads,)``
    (the geometric sequence 2^(-8/n)... for a power of two n; otherwise the next lower power's
    slopes followed by every other slope of twice that power)."""
    return np.asarray(_relpos.alibi_slopes(integer(num_heads, "num_heads")), dtype=np.float64)


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
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    dropout_offset: int = 0,
    segments=None,
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
    ``scale`` defaults to the scheme's: 1 for ``T5``, ``1/sqrt(d (1 + tables))`` for ``DeBERTa``, ``1/sqrt(d)``
    otherwise. ``algorithm`` is one of ``ALGORITHMS``
    (see ``available_algorithms``); ``threads`` (default or 0: OpenMP's maximum)
    splits the work over threads. The forward's results do not depend on it; the
    backward's summation order of shared parameter gradients (and of dq, when
    a head's keys are split over threads) does, so a run repeats its bits for
    a given thread count.

    ``dropout_p`` in [0, 1) drops attention probabilities after the softmax, each kept
    one scaled by ``1 / (1 - dropout_p)`` (``lse`` stays the softmax's); entry
    ``(b, h, i, j)`` is kept by a pure function of ``dropout_seed`` (64 bits),
    ``dropout_offset`` (32 bits), b, h and the query and key positions
    (``dropout_mask`` returns it): ``backward`` with the same three draws the same
    mask, as does every algorithm, thread count, CPU and relpos.gpu.

    ``segments`` (packed documents; Swin's shifted windows): integer ids ``(B, L)`` of the
    queries' and keys' segments (Lq == Lk), or a pair ``(q_segments, k_segments)``; a query
    sees the keys of its own segment only (ids within int32; a row whose segment holds no
    key it may see is fully masked). Beside segments, a key or value that is not finite is
    refused unless padded.
    """
    args = _calls.call_args(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, algorithm, threads,
                            layout, dropout_p, dropout_seed, dropout_offset, segments)
    zero_length = _calls.zero_length(args)
    out = _calls.forward_outputs(args, layout, zero=zero_length)
    if zero_length:  # rows that see no key: output 0, lse -inf (nothing at all without queries)
        _calls.check_zero_length(args, _relpos.available_algorithms)
        args["lse"][...] = -np.inf
    else:
        _relpos.forward(_calls.core_args(args))
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
    segments=None,
) -> list[str]:
    """The algorithms (besides ``"auto"``) that serve this call: every one of
    them gives the reference's result; they differ in memory and time."""
    args = _calls.call_args(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, "auto", None, layout,
                            segments=segments)
    # Validated as a forward call (shapes, options, memory), on outputs never written.
    _calls.forward_outputs(args, "bhld", zero=False)
    # A zero-length call is served by what serves its stand-in (forward checks it so).
    served = _calls.stand_in(args) if _calls.zero_length(args) else args
    return list(_relpos.available_algorithms(_calls.core_args(served)))


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
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    dropout_offset: int = 0,
    segments=None,
    add_into: Optional[dict] = None,
) -> dict[str, np.ndarray]:
    """Gradients of ``sum(dout * out)`` given ``forward``'s ``out`` and ``lse``
    (options as in ``forward``, dropout's included: the forward's mask is drawn again;
    with ``layout="blhd"`` out, dout and the
    gradients of q, k, v are ``(B, L, H, d)`` too). ``add_into`` maps some of the
    names below to arrays of the gradients' kind, dtype and shape (views welcome):
    those gradients are added into them, in place, instead of into new zeros.

    Returns a dict (torch tensors if q is one) with ``"q"``, ``"k"``, ``"v"`` and one entry per learnable
    parameter of the scheme, named ``<scheme>_<field>``: ``"shaw_wk"``, ``"shaw_wv"``,
    ``"t5_table"``, ``"alibi_slopes"`` (explicit slopes only), ``"xl_u"``, ``"xl_v"``,
    ``"xl_w_r"``, ``"kerple_r1"``, ``"kerple_r2"``, ``"kerple_power_r1"``, ``"kerple_power_r2"``,
    ``"deberta_c2p"``, ``"deberta_p2c"`` (the tables given); each gradient has its parameter's shape.
    """
    args = _calls.call_args(q, k, v, scheme, causal, key_padding, q_offset, k_offset, scale, algorithm, threads,
                            layout, dropout_p, dropout_seed, dropout_offset, segments)
    grads = _calls.backward_arrays(args, out, lse, dout, scheme, {} if add_into is None else add_into, layout)
    if _calls.zero_length(args):  # no term of sum(dout * out) depends on anything: every gradient is zero
        _calls.check_zero_length(args, _relpos.backward)
    else:
        _relpos.backward(_calls.core_args(args))
    return grads


def dropout_mask(seed: int, offset: int, B: int, H: int, Lq: int, Lk: int, p: float, q_offset: int = 0,
                 k_offset: int = 0) -> np.ndarray:
    """The attention dropout mask of a call (``forward``'s ``dropout_seed``, ``dropout_offset``
    and ``dropout_p``; B batch rows, H query heads, Lq queries from position ``q_offset``,
    Lk keys from ``k_offset``): a bool array ``(B, H, Lq, Lk)``, True where an entry is
    kept. Entries are keyed by their batch row, head and global positions, so a window of
    queries or keys (a decode step, a key chunk of ring attention) draws that window of a
    larger call's mask. The kernels never store it; this draws it as they do, for tests
    and debugging. The counter layout: docs/design.md, "Attention dropout"."""
    sizes = {name: integer(x, name) for name, x in (("B", B), ("H", H), ("Lq", Lq), ("Lk", Lk))}
    for name, n in sizes.items():
        if n < 0:
            raise ValueError(f"relpos: {name}: must be >= 0, got {n}")
    if sizes["B"] * sizes["H"] >= 2**32:
        raise ValueError("relpos: B x H must be below 2^32 (the mask's counter numbers batch rows and heads "
                         "in 32 bits)")
    args = _calls.dropout_args(p, seed, offset)
    q_offset, k_offset = integer(q_offset, "q_offset"), integer(k_offset, "k_offset")
    for name, x in (("q_offset", q_offset), ("k_offset", k_offset)):
        if not 0 <= x <= 2**40:
            raise ValueError(f"relpos: {name}: must be in [0, 2^40], got {x}")
    keep = np.empty((sizes["B"], sizes["H"], sizes["Lq"], sizes["Lk"]), dtype=np.uint8)
    if not args:  # p = 0
        keep[...] = 1
    elif keep.size:
        _relpos.dropout_mask(args["dropout_seed"], args["dropout_offset"], args["dropout_p"], q_offset, k_offset,
                             keep)
    return keep.view(np.bool_)


def info() -> dict:
    """What this build runs on: ``version``, ``simd_target`` (the target its vector
    loops run on, chosen at run time; the environment variable RELPOS_SIMD limits
    it), ``simd_compiled``, ``simd_supported``, ``gemm`` and ``gemm_isa`` (oneDNN and
    the instruction set it uses), ``half_storage`` (how bfloat16 / float16 calls compute)
    and ``cpu_avx512_bf16``, ``threads`` and ``openmp_wait_policy``, ``l1d_bytes``, ``l2_bytes``
    (one core's) and ``l3_bytes`` (0 where the CPU reports none) and ``forward_tiles`` (the
    fused forward's query rows x keys, chosen from the L2 size and the head dimension, or set
    by RELPOS_FORWARD_TILES=ROWSxKEYS); ``gpu``: what the GPU
    path (``relpos.gpu``, Triton kernels for CUDA tensors) finds here."""
    return {**_relpos.build_info(), "gpu": _gpu_info()}


def _gpu_info() -> str:
    """One line on the GPU path: Triton's version and the CUDA device, or what is missing."""
    try:
        import triton
    except ImportError:
        return "relpos.gpu: Triton is not installed (pip install triton); CUDA tensors cannot run"
    try:
        import torch
    except ImportError:
        return f"relpos.gpu: Triton {triton.__version__}; torch is not installed"
    if not torch.cuda.is_available():
        return (f"relpos.gpu: Triton {triton.__version__}, no CUDA device (torch {torch.__version__}); "
                "CPU tensors run the C++ kernels")
    return f"relpos.gpu: Triton {triton.__version__} on {torch.cuda.get_device_name()} (torch {torch.__version__})"
