"""Shared machinery of the Python tests: random problems, relpos runs, oracle runs, comparisons.

A problem is described by a ``Case`` (shapes, masks, offsets, scheme options).
``make_problem`` draws its inputs and parameters in float64 with a seeded RNG;
``run_relpos`` runs ``relpos.forward`` / ``relpos.backward`` in the requested
dtype; ``run_oracle`` runs ``torch_oracle.attention`` in float64 on the very
same values (float32 inputs upcast exactly), with a dropout case's explicit mask
(relpos.dropout_mask), and takes gradients with autograd.
"""
from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

import relpos
import torch_oracle



@dataclass(frozen=True)
class Case:
    """One attention problem. ``opts`` holds scheme options; builder-only keys:
    shaw ``tables`` ('k', 'v', 'kv') and ``per_head``; deberta ``tables`` ('c2p', 'p2c',
    'c2p|p2c') and ``per_head``; t5 ``num_buckets``;
    alibi ``learn`` (explicit slopes); xl ``pos_dim``."""

    id: str
    scheme: str
    B: int = 2
    H: int = 2
    Lq: int = 7
    Lk: int = 7
    d: int = 16
    dv: Optional[int] = None  # None = d
    causal: bool = False
    padding: Optional[str] = None  # None | 'random' | 'uint8' | 'batch' (one batch entry fully padded)
    q_offset: int = 0
    k_offset: int = 0
    scale: Optional[float] = None
    dropout_p: float = 0.0  # attention dropout; its seed and offset derive from the case's id
    segment_length: int = 0  # segments: rows at absolute position pos of batch row b in (pos + b) // this
    opts: dict = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return zlib.crc32(self.id.encode())

    def replace(self, **kw) -> "Case":
        return dataclasses.replace(self, **kw)

    def dropout_kwargs(self) -> dict:
        """relpos.forward's dropout options of the case (none without dropout)."""
        if not self.dropout_p:
            return {}
        return dict(dropout_p=self.dropout_p, dropout_seed=self.seed * 0x9E3779B97F4A7C15 % 2**64,
                    dropout_offset=self.seed % 977)


@dataclass
class Problem:
    case: Case
    q: np.ndarray  # float64 masters
    k: np.ndarray
    v: np.ndarray
    dout: np.ndarray
    params: dict  # name -> float64 array
    key_padding: Optional[np.ndarray]

    def scheme(self, dtype=np.float64, params: Optional[dict] = None):
        """The relpos scheme record, parameters cast to dtype (or the given arrays)."""
        c = self.case
        p = params if params is not None else {n: a.astype(dtype) for n, a in self.params.items()}
        o = c.opts
        if c.scheme == "none":
            return relpos.NoPosition()
        if c.scheme == "shaw":
            return relpos.Shaw(k=o["k"], wk=p.get("shaw_wk"), wv=p.get("shaw_wv"), beyond=o.get("beyond", "clip"))
        if c.scheme == "t5":
            return relpos.T5(p["t5_table"], bidirectional=o.get("bidirectional", True),
                             max_distance=o.get("max_distance", 128))
        if c.scheme == "alibi":
            return relpos.ALiBi(slopes=p.get("alibi_slopes"))
        if c.scheme == "rope":
            return relpos.RoPE(base=o.get("base", 10000.0), dims=o.get("dims"), style=o.get("style", "half_split"))
        if c.scheme == "xl":
            return relpos.TransformerXL(p["xl_u"], p["xl_v"], p["xl_w_r"], clamp_len=o.get("clamp_len", 0))
        if c.scheme == "kerple":
            return relpos.KERPLE(p["kerple_r1"], p["kerple_r2"])
        if c.scheme == "kerple_power":
            return relpos.KERPLEPower(p["kerple_power_r1"], p["kerple_power_r2"])
        if c.scheme == "sam":
            return relpos.SAM(p["sam_rel_h"], p["sam_rel_w"], q_height=o["q_height"], q_width=o["q_width"],
                              k_height=o.get("k_height"), k_width=o.get("k_width"))
        if c.scheme == "swin":
            return relpos.Swin(p["swin_table"], window_height=o["window_height"], window_width=o["window_width"])
        if c.scheme == "deberta":
            return relpos.DeBERTa(c2p=p.get("deberta_c2p"), p2c=p.get("deberta_p2c"),
                                  position_buckets=o.get("position_buckets", 256),
                                  max_relative_positions=o.get("max_relative_positions", 512))
        raise ValueError(c.scheme)

    def call_kwargs(self) -> dict:
        c = self.case
        segments = {} if self.segments() is None else {"segments": self.segments()}
        return dict(causal=c.causal, key_padding=self.key_padding, q_offset=c.q_offset,
                    k_offset=c.k_offset, scale=c.scale, **segments, **c.dropout_kwargs())

    def segments(self) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """The case's (q_ids (B, Lq), k_ids (B, Lk)), None without segments."""
        c = self.case
        if not c.segment_length:
            return None
        b = np.arange(c.B)[:, None]
        return ((c.q_offset + np.arange(c.Lq) + b) // c.segment_length,
                (c.k_offset + np.arange(c.Lk) + b) // c.segment_length)

    def dropout_mask(self) -> Optional[np.ndarray]:
        """The case's dropout mask (B, H, Lq, Lk) from relpos.dropout_mask, None without dropout."""
        c, kw = self.case, self.case.dropout_kwargs()
        if not kw:
            return None
        return relpos.dropout_mask(kw["dropout_seed"], kw["dropout_offset"], c.B, c.H, c.Lq, c.Lk, c.dropout_p,
                                   q_offset=c.q_offset, k_offset=c.k_offset)


def make_problem(case: Case) -> Problem:
    rng = np.random.default_rng(case.seed)
    c = case
    dv = c.dv or c.d
    q = rng.standard_normal((c.B, c.H, c.Lq, c.d))
    k = rng.standard_normal((c.B, c.H, c.Lk, c.d))
    v = rng.standard_normal((c.B, c.H, c.Lk, dv))
    dout = rng.standard_normal((c.B, c.H, c.Lq, dv))
    o, params = c.opts, {}
    if c.scheme == "shaw":
        heads = (c.H,) if o.get("per_head") else ()
        rows = 2 * o["k"] + 1
        if "k" in o.get("tables", "kv"):
            params["shaw_wk"] = 0.5 * rng.standard_normal(heads + (rows, c.d))
        if "v" in o.get("tables", "kv"):
            params["shaw_wv"] = 0.5 * rng.standard_normal(heads + (rows, dv))
    elif c.scheme == "t5":
        params["t5_table"] = rng.standard_normal((c.H, o.get("num_buckets", 32)))
    elif c.scheme == "alibi" and o.get("learn"):
        params["alibi_slopes"] = rng.uniform(0.02, 0.5, c.H)
    elif c.scheme == "xl":
        pos_dim = o.get("pos_dim", c.d)
        params["xl_u"] = 0.5 * rng.standard_normal((c.H, c.d))
        params["xl_v"] = 0.5 * rng.standard_normal((c.H, c.d))
        params["xl_w_r"] = rng.standard_normal((c.H, c.d, pos_dim)) / np.sqrt(pos_dim)
    elif c.scheme == "kerple":
        params["kerple_r1"] = rng.uniform(0.1, 2.0, c.H)
        params["kerple_r2"] = rng.uniform(0.05, 1.0, c.H)
    elif c.scheme == "kerple_power":  # the exponent across the power's range (0, 2]
        params["kerple_power_r1"] = rng.uniform(0.1, 2.0, c.H)
        params["kerple_power_r2"] = rng.uniform(0.05, 2.0, c.H)
    elif c.scheme == "deberta":  # tables as opts["tables"] names them ('c2p', 'p2c' or both, the default)
        heads = (c.H,) if o.get("per_head") else ()
        buckets = o.get("position_buckets", 256)
        span = buckets if buckets > 0 else o.get("max_relative_positions", 512)
        for table in ("c2p", "p2c"):
            if table in o.get("tables", "c2p|p2c"):
                params[f"deberta_{table}"] = 0.5 * rng.standard_normal(heads + (2 * span, c.d))
    elif c.scheme == "sam":  # rows per axis 2 max(query cells, key cells) - 1
        rows_h = 2 * max(o["q_height"], o.get("k_height") or 0) - 1
        rows_w = 2 * max(o["q_width"], o.get("k_width") or 0) - 1
        params["sam_rel_h"] = 0.5 * rng.standard_normal((rows_h, c.d))
        params["sam_rel_w"] = 0.5 * rng.standard_normal((rows_w, c.d))
    elif c.scheme == "swin":
        params["swin_table"] = rng.standard_normal((c.H, (2 * o["window_height"] - 1) * (2 * o["window_width"] - 1)))
    key_padding = None
    if c.padding in ("random", "uint8"):
        key_padding = rng.random((c.B, c.Lk)) < 0.3
    elif c.padding == "batch":
        key_padding = rng.random((c.B, c.Lk)) < 0.3
        key_padding[-1] = True
    if key_padding is not None and c.padding == "uint8":
        key_padding = key_padding.astype(np.uint8) * np.uint8(7)  # any nonzero value means padded
    return Problem(c, q, k, v, dout, params, key_padding)


def oracle_options(case: Case) -> dict:
    builder_only = {"tables", "per_head", "num_buckets", "learn", "pos_dim"}
    return {n: x for n, x in case.opts.items() if n not in builder_only}


def run_relpos(pb: Problem, dtype, algorithm: str = "auto", arrays: Optional[dict] = None) -> dict:
    """relpos forward + backward. ``arrays`` may override q, k, v, dout, params, key_padding
    (e.g. with non-contiguous views; by default the float64 masters cast to dtype) and give
    ``relayout``, a function applied to out and lse before they go to backward."""
    a = dict(q=pb.q.astype(dtype), k=pb.k.astype(dtype), v=pb.v.astype(dtype), dout=pb.dout.astype(dtype),
             params=None, key_padding=pb.key_padding)
    a.update(arrays or {})
    scheme = pb.scheme(dtype, a["params"])
    kw = pb.call_kwargs()
    kw["key_padding"] = a["key_padding"]
    out, lse = relpos.forward(a["q"], a["k"], a["v"], scheme, algorithm=algorithm, **kw)
    fwd = {"out": out.copy(), "lse": lse.copy()}
    if "relayout" in a:  # hand backward out and lse through other strides
        out, lse = a["relayout"](out), a["relayout"](lse)
    grads = relpos.backward(a["q"], a["k"], a["v"], out, lse, a["dout"], scheme, algorithm=algorithm, **kw)
    return {**fwd, **{"d" + n: g for n, g in grads.items()}}


def run_oracle(pb: Problem, dtype=np.float64) -> dict:
    """The float64 torch oracle on the inputs relpos sees in ``dtype``, with autograd gradients."""
    def leaf(x):
        return torch.tensor(np.asarray(x).astype(dtype).astype(np.float64), requires_grad=True)

    q, k, v = leaf(pb.q), leaf(pb.k), leaf(pb.v)
    params = {n: leaf(x) for n, x in pb.params.items()}
    c = pb.case
    kp = None if pb.key_padding is None else torch.tensor(pb.key_padding != 0)
    mask = pb.dropout_mask()
    out, lse = torch_oracle.attention(q, k, v, c.scheme, oracle_options(c), params, causal=c.causal,
                                      key_padding=kp, q_offset=c.q_offset, k_offset=c.k_offset, scale=c.scale,
                                      dropout_mask=None if mask is None else torch.tensor(mask),
                                      dropout_p=c.dropout_p,
                                      segments=None if pb.segments() is None else tuple(
                                          torch.tensor(ids) for ids in pb.segments()))
    dout = torch.tensor(pb.dout.astype(dtype).astype(np.float64))
    leaves = [q, k, v, *params.values()]
    grads = torch.autograd.grad(out, leaves, grad_outputs=dout, allow_unused=True)
    names = ["dq", "dk", "dv"] + ["d" + n for n in params]
    res = {"out": out.detach().numpy(), "lse": lse.numpy()}
    for n, g, x in zip(names, grads, leaves):
        res[n] = np.zeros(tuple(x.shape)) if g is None else g.numpy()
    return res


# ---------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------

# float64: both sides compute the same sums in double; differences are rounding
# of O(L d) term sums, ~1e-14 relative. 1e-10 leaves room for ordering only.
RTOL64 = 1e-10
# float32: the inputs are exact in both, so the library's error is its own float32
# rounding: u = 2^-24 ~ 6e-8 per operation, accumulated over sums of up to
# n = Lk * d (~6000) terms, growing ~ sqrt(n) u ~ 5e-6 relative to the magnitude
# of the summands, and amplified by |logits| through exp. 1e-5 relative to the
# tensor's magnitude (its largest |value|, at least the summand scale 1) admits
# that, and is ~1e4x below the size of any semantic error (a wrong bucket,
# offset or sign moves results by O(1e-1) relative).
RTOL32 = 2e-5


def assert_close(name: str, got: np.ndarray, ref: np.ndarray, dtype, magnitude: Optional[float] = None):
    """max |got - ref| <= rtol * magnitude, magnitude = max(max|ref|, 1) unless given.

    Infinite entries (lse of fully masked rows) must agree exactly; no NaN anywhere."""
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != oracle {ref.shape}"
    assert not np.isnan(got).any(), f"{name}: NaN in relpos result"
    inf = np.isinf(ref)
    assert np.array_equal(np.isinf(got), inf) and np.array_equal(got[inf], ref[inf]), (
        f"{name}: infinite entries differ: relpos {np.argwhere(np.isinf(got))[:5].tolist()} "
        f"oracle {np.argwhere(inf)[:5].tolist()}")
    finite = ~inf
    if not finite.any():
        return
    rtol = RTOL64 if np.dtype(dtype) == np.float64 else RTOL32
    if magnitude is None:
        magnitude = max(float(np.abs(ref[finite]).max()), 1.0)
    err = np.abs(got[finite] - ref[finite])
    worst = int(np.argmax(err))
    assert err[worst] <= rtol * magnitude, (
        f"{name} ({np.dtype(dtype).name}): max abs error {err[worst]:.3e} > {rtol:.0e} * {magnitude:.3e} "
        f"at flat index {worst} (relpos {got[finite][worst]!r}, oracle {ref[finite][worst]!r})")


def assert_matches_oracle(res: dict, ref: dict, dtype):
    assert set(res) == set(ref), f"result keys {sorted(res)} != oracle keys {sorted(ref)}"
    for name in ref:
        assert_close(name, res[name], ref[name], dtype)


def ids(cases) -> list[str]:
    return [c.id for c in cases]
