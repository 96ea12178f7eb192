"""Position schemes: small records holding each scheme's options and parameters.

A record (a dataclass made by ``@record``) names each of its options on its field:
``option(core name)`` (``shaw_k``) takes the option as its C++ scheme declares it once
(``for_each_option`` in src/schemes/, through ``scheme_options.json``): its kind
(``"int"``, ``"float"``, ``"bool"``, or ``"choice"`` with its allowed strings), its
default and its valid range where one exists. ``_Scheme`` derives everything
else from that table (``option_table()``): the checked dict the core reads
(``_args``, errors naming ``<scheme>.<field>``), and the packing of the options into
the int and float lists of the registered torch ops (``_op_options`` /
``_from_op``). Its learnable arrays are the fields named in ``_tensors`` (passed as
``<name>_<field>``). For ``relpos.torch.RelativeMultiheadAttention`` a record also
creates its learnable tensors for H heads (``init_params``) and builds the record
the module computes with (``module_record``: the module's options, its tensors,
clamped into ``_clamps``). So ``relpos.forward``/``backward``, ``relpos.torch`` and
the module stay scheme-agnostic: a new scheme is one class here, listed in
``SCHEMES``. This module needs NumPy only; ``init_params`` imports torch when called.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence

import numpy as np


__all__ = ["NoPosition", "Shaw", "T5", "ALiBi", "RoPE", "TransformerXL", "KERPLE", "KERPLEPower", "DeBERTa", "SAM", "Swin"]

KERPLE_MIN = 0.01  # the floor at which RelativeMultiheadAttention keeps KERPLE's r1 and r2


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


def dropout_probability(x: Any) -> float:
    """``dropout_p`` as a Python float in [0, 1), or a ValueError naming it (1 would drop every
    probability, and the kept ones' 1 / (1 - p) would divide by zero). A tensor is refused: reading
    it would synchronise a GPU call with the host."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real) or not 0 <= x < 1:
        raise ValueError(f"relpos: dropout_p: must be a number in [0, 1) (the probability of dropping an "
                         f"attention probability), got {x!r}")
    return float(x)


def flag(x: Any, name: str) -> bool:
    """``x`` as a Python bool: True, False (NumPy's too), 1 or 0; else a ValueError naming
    ``name`` (``"no"`` would otherwise read as true)."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)) and x in (0, 1):
        return bool(x)
    if getattr(x, "ndim", None) == 0 and str(getattr(x, "dtype", "")) in ("bool", "torch.bool"):
        return bool(x)  # a 0-dimensional bool array or tensor
    raise ValueError(f"relpos: {name}: expected True or False, got {x!r}")


def choice(x: Any, name: str, allowed: tuple[str, ...]) -> str:
    if x not in allowed:
        raise ValueError(f"relpos: {name}: must be one of {', '.join(allowed)}; got {x!r}")
    return x


def _bound(x: float) -> str:
    """A range bound as the messages print it: 2^40, not 1099511627776; 1, not 1.0."""
    if x >= 2**16 and float(x).is_integer() and int(x) & (int(x) - 1) == 0:
        return f"2^{int(x).bit_length() - 1}"
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True)
class Option:
    """One option of a scheme: what the core reads and what values it takes."""

    core: str  # the name the core reads ("shaw_k"); also RelativeMultiheadAttention's argument
    kind: str  # "int", "float" (finite), "bool" or "choice"
    default: Any  # the record field's default (dataclasses.MISSING: the field is required)
    choices: tuple[str, ...] = ()  # a choice's allowed strings; ops carry the index
    low: Optional[float] = None  # the smallest value allowed (exclusive with low_open)
    high: Optional[float] = None  # the largest value allowed
    low_open: bool = False
    even: bool = False
    core_none: Optional[int] = None  # an int that may be None: the value the core reads for None
    note: str = ""  # said after the range in errors: what a special value means
    field: str = ""  # the record's field, filled in by option_table()

    def check(self, value: Any, label: str) -> Any:
        """``value`` as a Python bool, int, float or str (None for an absent optional
        int), or a ValueError naming ``label``."""
        if self.kind == "bool":
            return flag(value, label)
        if self.kind == "choice":
            return choice(value, label, self.choices)
        if value is None and self.core_none is not None:
            return None
        x = integer(value, label) if self.kind == "int" else number(value, label)
        if not self.allows(x):
            note = f" ({'None ' if self.core_none is not None else ''}{self.note})" if self.note else ""
            raise ValueError(f"relpos: {label}: must be {self.range_text()}{note}, got {x}")
        return x

    def allows(self, x: float) -> bool:
        """Whether the number ``x`` lies in the option's range (NaN never does)."""
        above = self.low is None or (x > self.low if self.low_open else x >= self.low)
        below = self.high is None or x <= self.high
        return above and below and not (self.even and x % 2) and (self.kind != "float" or math.isfinite(x))

    def range_text(self) -> str:
        parts = ["finite"] if self.kind == "float" else []
        parts += ["even"] if self.even else []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {_bound(self.low)}")
        if self.high is not None:
            parts.append(f"<= {_bound(self.high)}")
        return " and ".join(parts)


def _declared_options() -> dict[str, dict[str, Any]]:
    """Every scheme's options by core name as the C++ schemes declare them (each
    scheme's ``for_each_option`` in src/schemes/), read from ``scheme_options.json``:
    ``relpos._relpos.scheme_options()`` written out by ``scripts/scheme_options.py``
    (a test checks that the two agree), so that this module and ``relpos.gpu`` also run
    without the compiled extension."""
    table = json.loads(Path(__file__).with_name("scheme_options.json").read_text())
    declared = {o["name"]: o for options in table.values() for o in options}
    assert len(declared) == sum(map(len, table.values())), "two schemes declare one option name"
    return declared


_DECLARED = _declared_options()


def option(core: str, *, required: bool = False) -> Any:
    """A record field that is the core's option ``core``, of the kind, default and range
    its C++ scheme declares; ``required``: the record takes no default (Shaw's k)."""
    if core not in _DECLARED:
        raise ImportError(f"relpos: the option {core!r} is not in scheme_options.json; after changing an option "
                          "in src/schemes/, rebuild and run scripts/scheme_options.py")
    s = _DECLARED[core]
    whole = int if s["kind"] == "int" else float
    low, high = (None if x is None else whole(x) for x in (s["low"], s["high"]))
    o = Option(core, s["kind"], dataclasses.MISSING if required else s["default"], tuple(s["choices"]), low, high,
               s["low_open"], s["even"], s["core_none"], s["note"])
    return dataclasses.field(default=o.default, metadata={"relpos": o})


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's slopes for any head count, in Python (the GPU path and the module use them
    without the compiled extension; relpos.alibi_slopes is the C++ form, tested equal): the
    paper's geometric sequence 2^(-8/n)... for a power of two n, otherwise the next lower
    power's slopes followed by every other slope of twice that power."""

    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    below = 1 << (heads.bit_length() - 1)
    if below == heads:
        return power_of_two(heads)
    return power_of_two(below) + power_of_two(2 * below)[0::2][: heads - below]


class _Scheme:
    """What every scheme record shares: its options' table and their packing into the
    core's dict and a torch op's ints and floats, its learnable tensors by field name,
    and how RelativeMultiheadAttention creates and uses them."""

    name: ClassVar[str]
    _tensors: ClassVar[tuple[str, ...]] = ()  # learnable fields, in the order the ops take them
    _grid: ClassVar[bool] = False  # positions on a grid (SAM, Swin): L = the grid's cells, no trainer kind
    # The (min, max) a module keeps a learnable tensor in, by field (None: unbounded).
    _clamps: ClassVar[dict[str, tuple[Optional[float], Optional[float]]]] = {}
    _option_table: ClassVar[tuple[Option, ...]]  # set by @record

    @classmethod
    def option_table(cls) -> tuple[Option, ...]:
        """The record's options in field order, the order the ops pack them in."""
        return cls.__dict__["_option_table"]  # the record's own (a subclass has its own fields)

    def _options(self) -> list[tuple[Option, Any]]:
        """Each option with this record's value, checked (errors name ``<scheme>.<field>``)."""
        return [(o, o.check(getattr(self, o.field), f"{self.name}.{o.field}")) for o in self.option_table()]

    def _args(self) -> dict[str, Any]:
        """The options as the core reads them, by its names."""
        return {o.core: o.core_none if x is None else x for o, x in self._options()}

    def _params(self) -> dict[str, Any]:
        """The learnable tensors given, as the core names them (``t5_table``)."""
        return {f"{self.name}_{f}": getattr(self, f) for f in self._tensors if getattr(self, f) is not None}

    def _op_options(self) -> tuple[list[int], list[float]]:
        """The options as a torch op's ints and floats: floats in the second list, every
        other kind an int (a bool as 0 / 1, a choice as its index, an optional int's None
        as -1, which its range never allows), each list in field order."""
        ints: list[int] = []
        floats: list[float] = []
        for o, x in self._options():
            if o.kind == "float":
                floats.append(x)
            else:
                ints.append(o.choices.index(x) if o.kind == "choice" else -1 if x is None else int(x))
        return ints, floats

    @classmethod
    def _from_op(cls, tensors: Sequence[Any], ints: Sequence[int], floats: Sequence[float]) -> "_Scheme":
        """The record that ``_op_options`` packed, with ``tensors`` in ``_tensors`` order."""
        next_int, next_float = iter(ints).__next__, iter(floats).__next__
        values: dict[str, Any] = {}
        for o in cls.option_table():
            if o.kind == "float":
                values[o.field] = next_float()
                continue
            i = next_int()
            if o.kind == "choice":
                values[o.field] = o.choices[i]
            elif o.kind == "bool":
                values[o.field] = bool(i)
            else:
                values[o.field] = None if i < 0 and o.core_none is not None else i
        return cls(**dict(zip(cls._tensors, tensors)), **values)

    @classmethod
    def init_params(cls, heads: int, head_dim: int, embed_dim: int, options: Mapping[str, Any], *,
                    dtype=None, device=None) -> dict[str, Any]:
        """The learnable torch tensors RelativeMultiheadAttention creates for this scheme,
        by field (None: the module has none; fields left out have none either), for
        ``heads`` heads of ``head_dim`` features in a module of width ``embed_dim``;
        ``options`` holds the module's arguments for the scheme by name (``shaw_k``,
        ``shaw_tables``, ...). ``dtype`` and ``device`` as in torch's factories."""
        return {}

    @classmethod
    def module_record(cls, options: Mapping[str, Any], params: Mapping[str, Any]) -> "_Scheme":
        """The record a module computes with: its options by core name, its tensors by
        field, each clamped into ``_clamps`` (a parameter stepped out of its range keeps
        the bound, with a zero gradient)."""
        params = {f: t if t is None or f not in cls._clamps else t.clamp(*cls._clamps[f]) for f, t in params.items()}
        return cls(**{o.field: options[o.core] for o in cls.option_table()}, **params)

    def _per_head(self, field: str) -> bool:
        """Whether learnable tensor ``field`` holds one slice per head (its first dimension)."""
        return True

    def _for_heads(self, part: Callable[[Any, bool], Any]) -> "_Scheme":
        """The record with each learnable tensor t replaced by ``part(t, per_head)``."""
        return replace(self, **{f: part(getattr(self, f), self._per_head(f)) for f in self._tensors})


def record_of(scheme: Any) -> "_Scheme":
    """The scheme record a call computes with: ``NoPosition()`` for None, the record
    itself, or a ValueError naming what was given instead (a record's class included)."""
    if scheme is None:
        return NoPosition()
    if isinstance(scheme, type) and issubclass(scheme, _Scheme):
        raise ValueError(f"relpos: scheme: expected a scheme record, got the class {scheme.__name__}; "
                         f"make one: {scheme.__name__}(...)")
    if not isinstance(scheme, _Scheme):
        raise ValueError(f"relpos: scheme: expected a relpos scheme (Shaw, T5, ...), got {type(scheme).__name__}")
    return scheme


def record(cls: type) -> type:
    """A scheme record: ``cls`` as a dataclass, with its option table read from its fields
    once (a plain attribute, which torch.compile traces through; functools' caches it cannot)."""
    cls = dataclass(cls)
    cls._option_table = tuple(replace(f.metadata["relpos"], field=f.name)
                              for f in dataclasses.fields(cls) if "relpos" in f.metadata)
    return cls


def _randn(shape: tuple[int, ...], std: float, dtype, device):
    import torch  # only when a module creates its tensors: this module needs NumPy alone

    return torch.randn(shape, dtype=dtype, device=device) * std


@record
class NoPosition(_Scheme):
    """Plain attention: no relative term (absolute embeddings, if any, live in the model)."""

    name = "none"


@record
class Shaw(_Scheme):
    """Shaw et al. 2018: score ``q_i . wk[c(r)]`` and value ``wv[c(r)]``,
    ``c(r) = clip(r, -k, k) + k``.

    ``wk`` is ``(2k+1, d)`` shared by all heads or ``(H, 2k+1, d)`` per head;
    ``wv`` likewise with ``dv``. Either may be ``None`` (K-only / V-only).
    ``beyond="zero"`` gives distances beyond +-k a zero embedding (Music
    Transformer in tensor2tensor) instead of the edge row.
    """

    k: int = option("shaw_k", required=True)
    wk: Optional[np.ndarray] = None
    wv: Optional[np.ndarray] = None
    beyond: str = option("shaw_beyond")
    name = "shaw"
    _tensors = ("wk", "wv")

    @classmethod
    def init_params(cls, heads, head_dim, embed_dim, options, *, dtype=None, device=None):
        """``(2k+1, head_dim)`` tables shared by the heads (``(H, 2k+1, head_dim)`` with
        ``shaw_per_head``), N(0, 1/head_dim): the ones ``shaw_tables`` names, or with
        ``shaw_tied`` one table, wk, for keys and values."""
        shape = ((heads,) if options["shaw_per_head"] else ()) + (2 * options["shaw_k"] + 1, head_dim)
        tables, tied = options["shaw_tables"], options["shaw_tied"]
        wk = _randn(shape, head_dim**-0.5, dtype, device) if "k" in tables or tied else None
        wv = _randn(shape, head_dim**-0.5, dtype, device) if "v" in tables and not tied else None
        return {"wk": wk, "wv": wv}

    @classmethod
    def module_record(cls, options, params):
        # A tied module holds one table for keys and values (OpenNMT-py's).
        return super().module_record(options, dict(params, wv=params["wk"]) if options["shaw_tied"] else params)

    def _per_head(self, field):
        table = getattr(self, field)
        return table is not None and table.ndim == 3  # (2k+1, d) is shared by the heads


@record
class T5(_Scheme):
    """T5 bucketed bias ``table[h, bucket(r)]``, ``table`` of shape ``(H, num_buckets)``.

    Buckets follow HF transformers' ``_relative_position_bucket`` exactly:
    ``bidirectional=True`` for encoders, ``False`` for (causal) decoders.
    Calls with this scheme default to T5's ``scale=1`` (the other schemes: ``1/sqrt(d)``).
    """

    table: np.ndarray
    bidirectional: bool = option("t5_bidirectional")
    # Its lower bound depends on the table's bucket count: the core checks it.
    max_distance: int = option("t5_max_distance")
    name = "t5"
    _tensors = ("table",)

    @classmethod
    def init_params(cls, heads, head_dim, embed_dim, options, *, dtype=None, device=None):
        """``(H, t5_num_buckets)``, N(0, 0.1^2)."""
        return {"table": _randn((heads, options["t5_num_buckets"]), 0.1, dtype, device)}


@record
class ALiBi(_Scheme):
    """ALiBi bias ``-m_h * |r|``. ``slopes=None`` uses the paper's slopes for
    the head count (any count); explicit ``slopes`` of shape ``(H,)`` are learnable."""

    slopes: Optional[np.ndarray] = None
    name = "alibi"
    _tensors = ("slopes",)

    @classmethod
    def init_params(cls, heads, head_dim, embed_dim, options, *, dtype=None, device=None):
        """With ``alibi_learnable``, the paper's slopes ``(H,)`` as a tensor to train."""
        if not options["alibi_learnable"]:
            return {}
        import torch  # only when a module creates its tensors: this module needs NumPy alone

        return {"slopes": torch.tensor(alibi_slopes(heads), dtype=dtype or torch.get_default_dtype(),
                                       device=device)}


@record
class RoPE(_Scheme):
    """Rotary embeddings: q rotated by its absolute position, k by its.

    ``dims`` rotary features (even, <= d; ``None`` = all of d), ``style``
    ``"half_split"`` (GPT-NeoX, Llama) or ``"interleaved"`` (GPT-J).
    """

    base: float = option("rope_base")
    # The core reads 0 as "all of d"; here that is None, and 0 a mistake. d bounds it too (the core checks).
    dims: Optional[int] = option("rope_dims")
    style: str = option("rope_style")
    name = "rope"


@record
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
    clamp_len: int = option("xl_clamp_len")
    name = "xl"
    _tensors = ("u", "v", "w_r")

    @classmethod
    def init_params(cls, heads, head_dim, embed_dim, options, *, dtype=None, device=None):
        """``u``, ``v`` ``(H, head_dim)``, N(0, 0.02^2); ``w_r`` ``(H, head_dim, pos_dim)``,
        N(0, 1/pos_dim), ``pos_dim`` = ``xl_pos_dim`` (default ``embed_dim``)."""
        pos_dim = options["xl_pos_dim"] or embed_dim
        return {"u": _randn((heads, head_dim), 0.02, dtype, device),
                "v": _randn((heads, head_dim), 0.02, dtype, device),
                "w_r": _randn((heads, head_dim, pos_dim), pos_dim**-0.5, dtype, device)}


def _kerple_init(heads: int, dtype, device) -> dict[str, Any]:
    """r1 uniform in (0, 2), r2 in (0, 1), as the paper initialises both variants."""
    import torch  # only when a module creates its tensors: this module needs NumPy alone

    r1 = torch.rand(heads, dtype=dtype, device=device) * 2
    return {"r1": r1, "r2": torch.rand(heads, dtype=dtype, device=device)}


@record
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
    _clamps = {"r1": (KERPLE_MIN, None), "r2": (KERPLE_MIN, None)}

    @classmethod
    def init_params(cls, heads, head_dim, embed_dim, options, *, dtype=None, device=None):
        return _kerple_init(heads, dtype, device)


@record
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
    _clamps = {"r1": (KERPLE_MIN, None), "r2": (KERPLE_MIN, 2.0)}

    @classmethod
    def init_params(cls, heads, head_dim, embed_dim, options, *, dtype=None, device=None):
        return _kerple_init(heads, dtype, device)


@record
class DeBERTa(_Scheme):
    """DeBERTa (He et al. 2021), disentangled attention: score ``q_i . c2p[c] + k_j . p2c[c]``
    beside ``q_i . k_j``, ``c = clamp(bucket(query_pos - key_pos) + span, 0, 2 span - 1)``
    with transformers' ``make_log_bucket_position`` (exact up to ``position_buckets / 2``,
    logarithmic up to ``max_relative_positions``), ``span = position_buckets``, or
    ``max_relative_positions`` where ``position_buckets <= 0`` (no buckets).

    ``c2p`` (content to position, read by the query: transformers' ``pos_key_layer``) and
    ``p2c`` (position to content, read by the key: ``pos_query_layer``) are ``(2 span, d)``
    shared by all heads or ``(H, 2 span, d)`` per head; either may be ``None``. Calls default
    to DeBERTa's ``scale = 1 / sqrt(d (1 + number of tables))``.
    """

    c2p: Optional[np.ndarray] = None
    p2c: Optional[np.ndarray] = None
    # Their joint bounds (buckets >= 2 or <= 0, max_relative_positions past buckets / 2 + 1):
    # check_joint_options, and the core at each call.
    position_buckets: int = option("deberta_position_buckets")
    max_relative_positions: int = option("deberta_max_relative_positions")
    name = "deberta"
    _tensors = ("c2p", "p2c")

    @classmethod
    def init_params(cls, heads, head_dim, embed_dim, options, *, dtype=None, device=None):
        """``(2 span, head_dim)`` tables shared by the heads (``(H, 2 span, head_dim)`` with
        ``deberta_per_head``), N(0, 1/head_dim): those ``deberta_pos_att_type`` names."""
        buckets, reach = options["deberta_position_buckets"], options["deberta_max_relative_positions"]
        # The joint bounds the core checks at each call, checked here too so that a module
        # fails when built, under its own argument names, not at its first forward.
        cls.check_joint_options(buckets, reach)
        span = buckets if buckets > 0 else reach
        shape = ((heads,) if options["deberta_per_head"] else ()) + (2 * span, head_dim)
        terms = options["deberta_pos_att_type"].split("|")
        return {f: _randn(shape, head_dim**-0.5, dtype, device) if f in terms else None for f in cls._tensors}

    @staticmethod
    def check_joint_options(buckets: int, reach: int) -> None:
        """The bounds the two options set each other, as the CPU core checks them at each call
        (the torch module when built and the GPU path, which has no core, call this)."""
        if 0 < buckets < 2:
            raise ValueError(f"relpos: deberta_position_buckets: must be <= 0 (no buckets) or >= 2, got {buckets}")
        # (reach - 1) / mid must exceed 1 in float32 too (2^26 buckets reaching 2^25 + 2 rounds to 1)
        if buckets > 0 and (reach - 1 <= buckets // 2 or not np.float32((reach - 1) / (buckets // 2)) > 1):
            raise ValueError(f"relpos: deberta_max_relative_positions: with deberta_position_buckets {buckets} "
                             f"must exceed {buckets // 2 + 1} (the log ratio would be <= 0), got {reach}")

    def _per_head(self, field):
        table = getattr(self, field)
        return table is not None and table.ndim == 3  # (2 span, d) is shared by the heads


@record
class SAM(_Scheme):
    """SAM / ViTDet / MViTv2's decomposed relative positions (Li et al. 2022) on a grid: query
    row ``i`` is cell ``(i // q_width, i % q_width)`` of a ``q_height x q_width`` grid, key row
    ``j`` cell ``(j // k_width, j % k_width)`` of ``k_height x k_width`` (None: the query
    grid's), and the logit of ``(i, j)`` gains, unscaled, ``q_i . rel_h[y] + q_i . rel_w[x]``,
    ``y`` and ``x`` each axis's offset index as SAM's ``get_rel_pos`` takes it (the shorter
    axis's coordinates scaled when the grids differ). ``rel_h`` ``(2 max(q_height, k_height)
    - 1, d)`` and ``rel_w`` ``(2 max(q_width, k_width) - 1, d)``, shared by the heads; tables
    trained for another grid are resized by the caller, as SAM interpolates them."""

    rel_h: np.ndarray
    rel_w: np.ndarray
    q_height: int = option("sam_q_height", required=True)
    q_width: int = option("sam_q_width", required=True)
    k_height: Optional[int] = option("sam_k_height")
    k_width: Optional[int] = option("sam_k_width")
    name = "sam"
    _tensors = ("rel_h", "rel_w")
    _grid = True

    @classmethod
    def init_params(cls, heads, head_dim, embed_dim, options, *, dtype=None, device=None):
        """Zeros ``(2 max(q_height, k_height) - 1, head_dim)`` and ``(2 max(q_width, k_width) - 1,
        head_dim)``, as SAM initialises them."""
        import torch  # only when a module creates its tensors: this module needs NumPy alone

        rows_h = 2 * max(options["sam_q_height"], options["sam_k_height"] or 0) - 1
        rows_w = 2 * max(options["sam_q_width"], options["sam_k_width"] or 0) - 1
        return {f: torch.zeros((rows, head_dim), dtype=dtype, device=device)
                for f, rows in (("rel_h", rows_h), ("rel_w", rows_w))}

    def _per_head(self, field):
        return False  # shared by the heads


@record
class Swin(_Scheme):
    """Swin's relative position bias (Liu et al. 2021) in a window of ``window_height x
    window_width`` cells (query and key row ``i`` is cell ``(i // window_width, i %
    window_width)``; windows are batch entries, as Swin lays them out): the logit of ``(i, j)``
    gains ``table[h, (yi - yj + window_height - 1) (2 window_width - 1) + xi - xj +
    window_width - 1]``, ``table`` ``(H, (2 window_height - 1)(2 window_width - 1))`` (Swin
    keeps it transposed, rows by heads)."""

    table: np.ndarray
    window_height: int = option("swin_window_height", required=True)
    window_width: int = option("swin_window_width", required=True)
    name = "swin"
    _tensors = ("table",)
    _grid = True

    @classmethod
    def init_params(cls, heads, head_dim, embed_dim, options, *, dtype=None, device=None):
        """``(H, (2 window_height - 1)(2 window_width - 1))``, N(0, 0.02^2) (Swin's truncated
        normal of std 0.02, untruncated)."""
        offsets = (2 * options["swin_window_height"] - 1) * (2 * options["swin_window_width"] - 1)
        return {"table": _randn((heads, offsets), 0.02, dtype, device)}


# Every scheme record by its name.
SCHEMES = {cls.name: cls for cls in (NoPosition, Shaw, T5, ALiBi, RoPE, TransformerXL, KERPLE, KERPLEPower,
                                     DeBERTa, SAM, Swin)}
