"""Position schemes: small records holding each scheme's options and parameters.

Each scheme knows how to describe itself to the C++ core (``_args``), which of
its arrays are learnable (``_tensors``, passed as ``<name>_<field>``), and how
its options travel through the registered torch ops (``_op_options`` /
``_from_op``), so ``relpos.forward``/``backward`` and ``relpos.torch`` stay
scheme-agnostic. A new scheme is one class here, listed in ``SCHEMES``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Optional, Sequence

import numpy as np

__all__ = ["NoPosition", "Shaw", "T5", "ALiBi", "RoPE", "TransformerXL", "KERPLE", "KERPLEPower"]


def integer(x: Any, name: str) -> int:
    """``x`` as a Python int, or a ValueError naming ``name`` (1.5, "3", True are rejected)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise ValueError(f"relpos: {name}: expected an integer, got {x!r}")
    if not -(2**63) <= int(x) < 2**63:
        raise ValueError(f"relpos: {name}: {x} does not fit in 64 bits")
    return int(x)


def number(x: Any, name: str) -> float:
    """``x`` as a Python float, or a ValueError naming ``name``."""
    if isinstance(x, (bool, np.bool_, str, bytes)):
        raise ValueError(f"relpos: {name}: expected a number, got {x!r}")
    try:
        return float(x)
    except (TypeError, ValueError):
        raise ValueError(f"relpos: {name}: expected a number, got {x!r}") from None


def choice(x: Any, name: str, allowed: tuple[str, ...]) -> str:
    if x not in allowed:
        raise ValueError(f"relpos: {name}: must be one of {', '.join(allowed)}; got {x!r}")
    return x


class _Scheme:
    """What every scheme record shares: its learnable tensors by field name, and
    the packing of its options into the ints and floats of a torch op."""

    name: ClassVar[str]
    _tensors: ClassVar[tuple[str, ...]] = ()  # learnable fields, in the order the ops take them

    def _args(self) -> dict[str, Any]:
        return {}

    def _params(self) -> dict[str, Any]:
        """The learnable tensors given, as the core names them (``t5_table``)."""
        return {f"{self.name}_{f}": getattr(self, f) for f in self._tensors if getattr(self, f) is not None}

    def _op_options(self) -> tuple[list[int], list[float]]:
        return [], []

    @classmethod
    def _from_op(cls, tensors: Sequence[Any], ints: Sequence[int], floats: Sequence[float]) -> "_Scheme":
        return cls(*tensors)

    def _per_head(self, field: str) -> bool:
        """Whether learnable tensor ``field`` holds one slice per head (its first dimension)."""
        return True

    def _for_heads(self, part: Callable[[Any, bool], Any]) -> "_Scheme":
        """The record with each learnable tensor t replaced by ``part(t, per_head)``."""
        return replace(self, **{f: part(getattr(self, f), self._per_head(f)) for f in self._tensors})


@dataclass
class NoPosition(_Scheme):
    """Plain attention: no relative term (absolute embeddings, if any, live in the model)."""

    name = "none"


@dataclass
class Shaw(_Scheme):
    """Shaw et al. 2018: score ``q_i . wk[c(r)]`` and value ``wv[c(r)]``,
    ``c(r) = clip(r, -k, k) + k``.

    ``wk`` is ``(2k+1, d)`` shared by all heads or ``(H, 2k+1, d)`` per head;
    ``wv`` likewise with ``dv``. Either may be ``None`` (K-only / V-only).
    ``beyond="zero"`` gives distances beyond +-k a zero embedding (Music
    Transformer in tensor2tensor) instead of the edge row.
    """

    k: int
    wk: Optional[np.ndarray] = None
    wv: Optional[np.ndarray] = None
    beyond: str = "clip"
    name = "shaw"
    _tensors = ("wk", "wv")
    _BEYOND = ("clip", "zero")

    def _args(self) -> dict[str, Any]:
        return {"shaw_k": integer(self.k, "shaw.k"), "shaw_beyond": choice(self.beyond, "shaw.beyond", self._BEYOND)}

    def _op_options(self):
        return [self.k, self._BEYOND.index(self.beyond)], []

    @classmethod
    def _from_op(cls, tensors, ints, floats):
        return cls(k=ints[0], wk=tensors[0], wv=tensors[1], beyond=cls._BEYOND[ints[1]])

    def _per_head(self, field):
        table = getattr(self, field)
        return table is not None and table.ndim == 3  # (2k+1, d) is shared by the heads


@dataclass
class T5(_Scheme):
    """T5 bucketed bias ``table[h, bucket(r)]``, ``table`` of shape ``(H, num_buckets)``.

    Buckets follow HF transformers' ``_relative_position_bucket`` exactly:
    ``bidirectional=True`` for encoders, ``False`` for (causal) decoders.
    Calls with this scheme default to T5's ``scale=1`` (the other schemes: ``1/sqrt(d)``).
    """

    table: np.ndarray
    bidirectional: bool = True
    max_distance: int = 128
    name = "t5"
    _tensors = ("table",)

    def _args(self) -> dict[str, Any]:
        return {
            "t5_bidirectional": bool(self.bidirectional),
            "t5_max_distance": integer(self.max_distance, "t5.max_distance"),
        }

    def _op_options(self):
        return [int(bool(self.bidirectional)), self.max_distance], []

    @classmethod
    def _from_op(cls, tensors, ints, floats):
        return cls(tensors[0], bidirectional=bool(ints[0]), max_distance=ints[1])


@dataclass
class ALiBi(_Scheme):
    """ALiBi bias ``-m_h * |r|``. ``slopes=None`` uses the paper's slopes for
    the head count (any count); explicit ``slopes`` of shape ``(H,)`` are learnable."""

    slopes: Optional[np.ndarray] = None
    name = "alibi"
    _tensors = ("slopes",)


@dataclass
class RoPE(_Scheme):
    """Rotary embeddings: q rotated by its absolute position, k by its.

    ``dims`` rotary features (even, <= d; ``None`` = all of d), ``style``
    ``"half_split"`` (GPT-NeoX, Llama) or ``"interleaved"`` (GPT-J).
    """

    base: float = 10000.0
    dims: Optional[int] = None
    style: str = "half_split"
    name = "rope"
    _STYLES = ("half_split", "interleaved")

    def _args(self) -> dict[str, Any]:
        return {
            "rope_base": number(self.base, "rope.base"),
            "rope_dims": 0 if self.dims is None else self._rotary_dims(),
            "rope_style": choice(self.style, "rope.style", self._STYLES),
        }

    def _op_options(self):
        return [-1 if self.dims is None else self.dims, self._STYLES.index(self.style)], [float(self.base)]

    @classmethod
    def _from_op(cls, tensors, ints, floats):
        return cls(base=floats[0], dims=None if ints[0] < 0 else ints[0], style=cls._STYLES[ints[1]])

    def _rotary_dims(self) -> int:
        # The core reads 0 as "all of d"; here that is None, and 0 a mistake.
        dims = integer(self.dims, "rope.dims")
        if dims < 2 or dims % 2:
            raise ValueError(f"relpos: rope.dims: must be even and >= 2 (None rotates all of d), got {dims}")
        return dims


@dataclass
class TransformerXL(_Scheme):
    """Transformer-XL: score ``(q_i + u) . k_j + (q_i + v) . W_R R(-r)``.

    ``u``, ``v`` of shape ``(H, d)``, ``w_r`` of shape ``(H, d, pos_dim)``
    (``R`` is the ``[sin, cos]`` sinusoid of even size ``pos_dim``).
    ``clamp_len > 0`` limits the distance fed to ``R``. Memory: prepend the
    cached keys/values and call with ``q_offset=mem_len``.
    """

    u: np.ndarray
    v: np.ndarray
    w_r: np.ndarray
    clamp_len: int = 0
    name = "xl"
    _tensors = ("u", "v", "w_r")

    def _args(self) -> dict[str, Any]:
        return {"xl_clamp_len": integer(self.clamp_len, "xl.clamp_len")}

    def _op_options(self):
        return [self.clamp_len], []

    @classmethod
    def _from_op(cls, tensors, ints, floats):
        return cls(*tensors, clamp_len=ints[0])


@dataclass
class KERPLE(_Scheme):
    """KERPLE (Chi et al. 2022), logarithmic variant: bias ``-r1_h * log(1 + r2_h * |r|)``.

    ``r1`` and ``r2`` of shape ``(H,)``, every entry finite and > 0, both learnable
    (the paper initialises them uniformly in (0, 2) and (0, 1) and keeps them
    positive by clamping at 0.01; ``RelativeMultiheadAttention`` does both).
    """

    r1: np.ndarray
    r2: np.ndarray
    name = "kerple"
    _tensors = ("r1", "r2")


@dataclass
class KERPLEPower(_Scheme):
    """KERPLE (Chi et al. 2022), power variant: bias ``-r1_h * |r|**r2_h``.

    ``r1`` and ``r2`` of shape ``(H,)``, ``r1`` finite and > 0, ``r2`` in (0, 2], both
    learnable (``RelativeMultiheadAttention`` initialises them uniformly in (0, 2) and
    (0, 1) and clamps them into those ranges at 0.01, as the paper's code does).
    """

    r1: np.ndarray
    r2: np.ndarray
    name = "kerple_power"
    _tensors = ("r1", "r2")


# Every scheme record by its name.
SCHEMES = {cls.name: cls for cls in (NoPosition, Shaw, T5, ALiBi, RoPE, TransformerXL, KERPLE, KERPLEPower)}
