"""Position schemes: small records holding each scheme's options and parameters.

Each scheme knows how to describe itself to the C++ core (``_args``) and which
of its arrays are learnable (``_params``), so ``relpos.forward``/``backward``
stay scheme-agnostic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

__all__ = ["NoPosition", "Shaw", "T5", "ALiBi", "RoPE", "TransformerXL"]


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


@dataclass
class NoPosition:
    """Plain attention: no relative term (absolute embeddings, if any, live in the model)."""

    name = "none"

    def _args(self) -> dict[str, Any]:
        return {}

    def _params(self) -> dict[str, np.ndarray]:
        return {}


@dataclass
class Shaw:
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

    def _args(self) -> dict[str, Any]:
        return {"shaw_k": integer(self.k, "shaw.k"), "shaw_beyond": choice(self.beyond, "shaw.beyond", ("clip", "zero"))}

    def _params(self) -> dict[str, np.ndarray]:
        return {n: t for n, t in (("shaw_wk", self.wk), ("shaw_wv", self.wv)) if t is not None}


@dataclass
class T5:
    """T5 bucketed bias ``table[h, bucket(r)]``, ``table`` of shape ``(H, num_buckets)``.

    Buckets follow HF transformers' ``_relative_position_bucket`` exactly:
    ``bidirectional=True`` for encoders, ``False`` for (causal) decoders.
    Calls with this scheme default to T5's ``scale=1`` (the other schemes: ``1/sqrt(d)``).
    """

    table: np.ndarray
    bidirectional: bool = True
    max_distance: int = 128
    name = "t5"

    def _args(self) -> dict[str, Any]:
        return {
            "t5_bidirectional": bool(self.bidirectional),
            "t5_max_distance": integer(self.max_distance, "t5.max_distance"),
        }

    def _params(self) -> dict[str, np.ndarray]:
        return {"t5_table": self.table}


@dataclass
class ALiBi:
    """ALiBi bias ``-m_h * |r|``. ``slopes=None`` uses the paper's slopes for
    the head count (any count); explicit ``slopes`` of shape ``(H,)`` are learnable."""

    slopes: Optional[np.ndarray] = None
    name = "alibi"

    def _args(self) -> dict[str, Any]:
        return {}

    def _params(self) -> dict[str, np.ndarray]:
        return {} if self.slopes is None else {"alibi_slopes": self.slopes}


@dataclass
class RoPE:
    """Rotary embeddings: q rotated by its absolute position, k by its.

    ``dims`` rotary features (even, <= d; ``None`` = all of d), ``style``
    ``"half_split"`` (GPT-NeoX, Llama) or ``"interleaved"`` (GPT-J).
    """

    base: float = 10000.0
    dims: Optional[int] = None
    style: str = "half_split"
    name = "rope"

    def _args(self) -> dict[str, Any]:
        return {
            "rope_base": number(self.base, "rope.base"),
            "rope_dims": 0 if self.dims is None else self._rotary_dims(),
            "rope_style": choice(self.style, "rope.style", ("half_split", "interleaved")),
        }

    def _rotary_dims(self) -> int:
        # The core reads 0 as "all of d"; here that is None, and 0 a mistake.
        dims = integer(self.dims, "rope.dims")
        if dims < 2 or dims % 2:
            raise ValueError(f"relpos: rope.dims: must be even and >= 2 (None rotates all of d), got {dims}")
        return dims

    def _params(self) -> dict[str, np.ndarray]:
        return {}


@dataclass
class TransformerXL:
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

    def _args(self) -> dict[str, Any]:
        return {"xl_clamp_len": integer(self.clamp_len, "xl.clamp_len")}

    def _params(self) -> dict[str, np.ndarray]:
        return {"xl_u": self.u, "xl_v": self.v, "xl_w_r": self.w_r}
