"""Each scheme record's option table (``option_table``) and what relpos derives from it:
the packing into a torch op's ints and floats and back, the refusal of every value
outside an option's range or choices by the option's name (in the core's dict, the
op's packing and RelativeMultiheadAttention's arguments), and the learnable tensors
each record creates for a module (``init_params``), which the core must accept."""
from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

import relpos
from relpos.schemes import SCHEMES, Option

torch = pytest.importorskip("torch")
import relpos.torch as rt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODULE_ARGUMENTS = inspect.signature(rt.RelativeMultiheadAttention).parameters


def valid_values(o: Option) -> list:
    """Values the option allows, its bounds among them."""
    if o.kind == "choice":
        return list(o.choices)
    if o.kind == "bool":
        return [True, False]
    low = 0 if o.low is None else o.low + (1 if o.low_open else 0)
    low += low % 2 if o.even else 0
    values = [low, low + 6 if o.high is None else o.high]
    if o.kind == "float":
        values = [float(x) for x in values]
    return values + ([None] if o.core_none is not None else [])


def invalid_values(o: Option) -> list:
    """Values outside the option's range or choices, and of the wrong type."""
    if o.kind == "choice":
        return ["no-such-choice", 0, None]
    if o.kind == "bool":
        return []  # read as Python's truth value, as bool(x)
    bad = ["7", [1]] + ([] if o.core_none is not None else [None])
    if o.low is not None:
        bad.append(o.low if o.low_open else o.low - 1)
    if o.high is not None:
        bad.append(o.high + 1)
    if o.kind == "int":
        bad += [2.5, True, 2**64]
        if o.even:
            bad.append(valid_values(o)[0] + 1)
    else:
        bad += [math.nan, math.inf]
    return bad


def record(cls, **values):
    """A record with no tensors and each option at its default (or its first valid value)."""
    defaults = {o.field: valid_values(o)[0] if o.default is dataclasses.MISSING else o.default
                for o in cls.option_table()}
    return cls(**{field: None for field in cls._tensors}, **{**defaults, **values})


def every_option():
    return [(name, o) for name, cls in SCHEMES.items() for o in cls.option_table()]


def test_every_option_is_a_field_with_the_core_name_of_its_scheme():
    for name, cls in SCHEMES.items():
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for o in cls.option_table():
            assert o.field in fields and fields[o.field].default is o.default
            assert o.core == f"{name}_{o.field}"
            assert o.kind in ("int", "float", "bool", "choice") and (o.kind == "choice") == bool(o.choices)
        # The tensors and the options are the record's fields, nothing else.
        assert sorted(fields) == sorted([*cls._tensors, *(o.field for o in cls.option_table())])


@pytest.mark.parametrize("name", list(SCHEMES))
def test_options_round_trip_through_the_op_packing(name):
    cls = SCHEMES[name]
    table = cls.option_table()
    for combination in itertools.product(*(valid_values(o) for o in table)):
        r = record(cls, **{o.field: x for o, x in zip(table, combination)})
        ints, floats = r._op_options()
        assert all(type(i) is int for i in ints) and all(type(x) is float for x in floats)
        assert len(ints) + len(floats) == len(table)
        back = cls._from_op([None] * len(cls._tensors), ints, floats)
        assert back == r, (r, ints, floats)
        assert back._args() == r._args()


REFUSING_OPTIONS = [(n, o) for n, o in every_option() if invalid_values(o)]  # bool options take any value


@pytest.mark.parametrize("name,o", REFUSING_OPTIONS, ids=[f"{n}.{o.field}" for n, o in REFUSING_OPTIONS])
def test_values_outside_an_option_are_refused_by_its_name(name, o):
    cls = SCHEMES[name]
    bad = invalid_values(o)
    q = np.zeros((1, 2, 3, 4))
    for x in bad:
        r = record(cls, **{o.field: x})
        for packing in (r._args, r._op_options):
            with pytest.raises(ValueError, match=rf"^relpos: {name}\.{o.field}: "):
                packing()
        with pytest.raises(ValueError, match=rf"^relpos: {name}\.{o.field}: "):
            relpos.forward(q, q, q, r)
        if o.core in MODULE_ARGUMENTS:
            with pytest.raises(ValueError, match=rf"^relpos: {o.core}: "):
                rt.RelativeMultiheadAttention(8, 2, name, **{o.core: x})


# Module arguments that change which tensors a record creates, or their shapes.
VARIANTS = {
    "shaw": [dict(shaw_k=2), dict(shaw_k=1, shaw_per_head=True, shaw_tables="k"), dict(shaw_k=0, shaw_tables="v"),
             dict(shaw_k=3, shaw_tied=True, shaw_beyond="zero")],
    "t5": [dict(t5_num_buckets=8, t5_max_distance=10, t5_bidirectional=False)],
    "alibi": [dict(alibi_learnable=True)],
    "rope": [dict(rope_dims=2, rope_style="interleaved")],
    "xl": [dict(xl_pos_dim=6, xl_clamp_len=3)],
    "deberta": [dict(deberta_position_buckets=4, deberta_max_relative_positions=6, deberta_pos_att_type="c2p"),
                dict(deberta_position_buckets=-1, deberta_max_relative_positions=3, deberta_pos_att_type="p2c",
                     deberta_per_head=True)],
    # on a grid, whose options the module needs: the tests' 5 queries and 7 keys as rows of cells,
    # Swin's window of 7
    "sam": [dict(sam_q_height=1, sam_q_width=5, sam_k_height=1, sam_k_width=7)],
    "swin": [dict(swin_window_height=1, swin_window_width=7)],
}
CASES = [(name, args) for name in SCHEMES
         for args in [*([] if SCHEMES[name]._grid else [{}]), *VARIANTS.get(name, [])]]


@pytest.mark.parametrize("name,args", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_created_tensors_are_what_the_core_takes(name, args):
    cls = SCHEMES[name]
    B, H, Lq, Lk, d, E = 2, 3, 7 if name == "swin" else 5, 7, 4, 12  # Swin's queries are its window's keys
    options = rt.RelativeMultiheadAttention(E, H, name, **args).scheme_options
    torch.manual_seed(0)
    params = cls.init_params(H, d, E, options, dtype=torch.float64)
    assert set(params) <= set(cls._tensors)
    for field, t in params.items():
        assert t is None or (t.dtype == torch.float64 and not t.requires_grad), field
    record = cls.module_record(options, {field: params.get(field) for field in cls._tensors})
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, Lq, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, H, Lk, d, generator=g, dtype=torch.float64) for _ in range(2))
    got = rt.attention(q, k, v, record, causal=True, q_offset=Lk - Lq)
    as_numpy = dataclasses.replace(record, **{f: getattr(record, f).numpy() for f in cls._tensors
                                              if getattr(record, f) is not None})
    want, _ = relpos.forward(q.numpy(), k.numpy(), v.numpy(), as_numpy, causal=True, q_offset=Lk - Lq)
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-12, atol=1e-12)


def test_module_parameters_are_the_records_tensors_drawn_in_order():
    """The module creates the record's tensors right after its projections, from the same
    random stream: with the same seed they are the ones init_params draws after them."""
    for name, args in CASES:
        torch.manual_seed(5)
        m = rt.RelativeMultiheadAttention(12, 3, name, **args)
        torch.manual_seed(5)
        for _ in range(4):  # q, k, v, out projections: weight and bias each
            torch.nn.Linear(12, 12)
        params = SCHEMES[name].init_params(3, 4, 12, m.scheme_options)
        for field in SCHEMES[name]._tensors:
            mine = getattr(m, f"{name}_{field}")
            assert (mine is None) == (params.get(field) is None), (name, field)
            if mine is not None:
                assert isinstance(mine, torch.nn.Parameter) and torch.equal(mine, params[field]), (name, field)


# Every option the records pass reaches the extension under the same name: the extension
# reads each scheme's options from the scheme's own list (for_each_option in
# src/schemes/), and an option given with a type none of them has is refused naming it.
# A name the two sides spell differently would be ignored there, silently, and fail here.
@pytest.mark.parametrize("core", sorted({o.core for cls in SCHEMES.values() for o in cls.option_table()}))
def test_every_option_name_reaches_the_extension(core):
    from relpos import _relpos
    q = np.zeros((1, 1, 2, 4), np.float32)
    args = dict(q=q, k=q.copy(), v=q.copy(), out=np.zeros_like(q), lse=np.zeros((1, 1, 2), np.float32))
    args[core] = [1, 2]  # a list: no option is one
    with pytest.raises(ValueError, match=core):
        _relpos.forward(args)


# An enum option is read by its names: one the extension does not know is refused naming the
# option and the names it accepts; each accepted name gives its own result.
@pytest.mark.parametrize("core, names", [("shaw_beyond", ("clip", "zero")),
                                         ("rope_style", ("half_split", "interleaved"))])
def test_enum_options_are_read_by_name(core, names):
    from relpos import _relpos
    rng = np.random.default_rng(3)
    L, d = 8, 4
    q, k, v = (rng.standard_normal((1, 1, L, d)) for _ in range(3))
    scheme = core.split("_")[0]
    base = dict(q=q, k=k, v=v, lse=np.zeros((1, 1, L)), scheme=scheme)
    if scheme == "shaw":
        base.update(shaw_k=1, shaw_wk=rng.standard_normal((1, 3, d)))
    outs = []
    for name in names:
        args = dict(base, out=np.zeros_like(q), **{core: name})
        _relpos.forward(args)
        outs.append(args["out"])
    assert not np.allclose(outs[0], outs[1]), "the two names computed the same"
    with pytest.raises(ValueError, match=f"{core}: must be '{names[0]}' or '{names[1]}', got 'sideways'"):
        _relpos.forward(dict(base, out=np.zeros_like(q), **{core: "sideways"}))


def _options_script():
    spec = importlib.util.spec_from_file_location("scheme_options", ROOT / "scripts" / "scheme_options.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_records_options_are_what_the_cpp_schemes_declare():
    """python/relpos/scheme_options.json, which the records read, is the table the C++
    schemes declare (for_each_option), and each record has exactly its scheme's options."""
    from relpos import _relpos
    script = _options_script()
    declared = _relpos.scheme_options()
    assert script.TABLE.read_text() == script.text(declared), \
        "scheme_options.json is stale: run .venv/bin/python scripts/scheme_options.py"
    assert set(declared) == set(SCHEMES)
    for name, cls in SCHEMES.items():
        assert [o.core for o in cls.option_table()] == [o["name"] for o in declared[name]], name
        for o in declared[name]:  # what the declarations may say: whole bounds of integers, ...
            bounds = [x for x in (o["low"], o["high"]) if x is not None]
            assert all(type(x) is (int if o["kind"] == "int" else float) for x in bounds), o
            assert (o["kind"] == "int") >= o["even"] and (o["kind"] == "int") >= (o["core_none"] is not None), o
            assert (o["kind"] == "choice") == bool(o["choices"]) and (bounds == [] or o["kind"] in ("int", "float")), o


@pytest.mark.parametrize("name,o", [(n, o) for n, o in every_option() if o.low is not None or o.high is not None],
                         ids=[f"{n}.{o.field}" for n, o in every_option() if o.low is not None or o.high is not None])
def test_the_core_and_the_record_state_a_range_alike(name, o):
    """A value past an option's range: the record (Python) and the core (C++, from the same
    declaration) refuse it with the same range in their messages."""
    from relpos import _relpos
    bad = o.low - 1 if o.low is not None else o.high + 1
    if bad == o.core_none:  # 0 means None to the core: a value past the range is then one lower
        bad -= 1
    with pytest.raises(ValueError) as by_record:
        record(SCHEMES[name], **{o.field: bad})._args()
    q = np.zeros((1, 1, 2, 4))
    args = dict(q=q, k=q.copy(), v=q.copy(), out=np.zeros_like(q), lse=np.zeros((1, 1, 2)), scheme=name)
    with pytest.raises(ValueError) as by_core:  # the other options valid (a grid's are required)
        _relpos.forward({**args, **record(SCHEMES[name])._args(), o.core: bad})

    def stated(e):  # the range, and the note but for what None (Python) or 0 (C++) means
        text = str(e.value).split(": must be ", 1)[1].rsplit(", got ", 1)[0]
        return text.replace("(None ", "(").replace("(0 ", "(") if o.core_none is not None else text

    assert stated(by_core) == stated(by_record), (str(by_core.value), str(by_record.value))
