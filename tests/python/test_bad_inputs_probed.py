"""Inputs a probe of the Python API found ending wrongly, each now a clear error naming
the argument, or the right result:

- finite inputs whose scores overflow float32 (a logit past 3.4e38): every algorithm
  returned NaN rows, or zero rows as if masked, silently; now a ValueError, while NaN
  inputs still propagate, masked rows stay -inf and float64 computes the true result;
- ``backward(add_into=...)`` with a name the call has no gradient of (silently never
  added into), a value that is not an array, or a read-only array;
- a scheme's class given instead of a record (a TypeError about ``self``);
- a flag given as a string or another number (``causal="no"`` ran causal,
  ``T5(bidirectional="False")`` bidirectional);
- a ``RelativeMultiheadAttention`` that could never run: T5 bucket counts, RoPE's
  rotated dimensions and Transformer-XL's sinusoid width are checked when it is made;
- the module's memory: a key padding over memory and new keys (the message asked for
  the padded length), key and value widths one memory cannot serve, a q_offset string
  other than "end".
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import relpos
import relpos.torch as rt

OVERFLOW = "the attention scores overflow float32"


def overflowing_call():
    """One query against three keys whose scores are +-4e38: past float32's largest value."""
    q = np.full((1, 1, 1, 4), 1e19, np.float32)
    k = np.array([[[[1, 1, 1, 1], [1, 1, 1, -1], [-1, -1, -1, -1]]]], np.float32) * 1e19
    v = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    return q, k, v


@pytest.mark.parametrize("algorithm", ["auto", "reference", "gather", "fused"])
def test_overflowing_scores_are_refused_by_every_algorithm(algorithm):
    q, k, v = overflowing_call()
    with pytest.raises(ValueError, match=OVERFLOW):
        relpos.forward(q, k, v, algorithm=algorithm)
    # Every score -4e38: the row would come out zero, as if its keys were masked.
    with pytest.raises(ValueError, match=OVERFLOW):
        relpos.forward(-q, np.abs(k), v, algorithm=algorithm)
    # A row whose keys are all padded, or all in its future, is -inf by right.
    out, lse = relpos.forward(-q, np.abs(k), v, algorithm=algorithm, key_padding=np.ones((1, 3), bool))
    assert lse[0, 0, 0] == -np.inf and (out == 0).all()
    out, lse = relpos.forward(-q, np.abs(k), v, algorithm=algorithm, causal=True, k_offset=1)
    assert lse[0, 0, 0] == -np.inf and (out == 0).all()


def test_overflow_through_the_scale_torch_and_bfloat16_is_refused():
    q, k, v = overflowing_call()
    with pytest.raises(ValueError, match=OVERFLOW):
        relpos.forward(np.ones_like(q), k / 1e19, v, scale=1e38)
    with pytest.raises(ValueError, match=OVERFLOW):
        rt.attention(*(torch.tensor(x) for x in (q, k, v)))
    with pytest.raises(ValueError, match=OVERFLOW):
        rt.attention(*(torch.tensor(x).bfloat16() for x in (q, k, v)))


def test_the_same_values_in_float64_and_nan_inputs_are_computed():
    q, k, v = overflowing_call()
    out, lse = relpos.forward(*(x.astype(np.float64) for x in (q, k, v)))
    np.testing.assert_array_equal(out[0, 0, 0], v[0, 0, 0])  # the first key's score is the largest by 8e38
    q[0, 0, 0, 0] = np.nan  # a NaN input reaches the output, as in PyTorch, and is not called an overflow
    out, lse = relpos.forward(q, k, v)
    assert np.isnan(out).all() and np.isnan(lse).all()


def backward_problem():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 8, 4)).astype(np.float32) for _ in range(3))
    scheme = relpos.Shaw(k=2, wk=rng.standard_normal((5, 4)).astype(np.float32))
    out, lse = relpos.forward(q, k, v, scheme)
    return (q, k, v, out, lse, np.ones_like(out), scheme)


def test_add_into_refuses_what_it_would_not_add_into():
    args = backward_problem()
    with pytest.raises(ValueError, match=r"add_into: no gradient named 'wk' in this call; "
                                         r"its gradients are q, k, v, shaw_wk"):
        relpos.backward(*args, add_into={"wk": np.zeros((5, 4), np.float32)})
    with pytest.raises(ValueError, match=r"add_into: expected a dict of gradient names to arrays, got list"):
        relpos.backward(*args, add_into=[1, 2])
    with pytest.raises(ValueError, match=r"add_into\['q'\]: expected an array of shape \(1, 2, 8, 4\), got float"):
        relpos.backward(*args, add_into={"q": 0.0})
    read_only = np.zeros((1, 2, 8, 4), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"add_into\['q'\]: the array is read-only"):
        relpos.backward(*args, add_into={"q": read_only})
    # The names it does know are added into: the table's gradient twice is twice once.
    once = relpos.backward(*args)["shaw_wk"]
    acc = np.zeros((5, 4), np.float32)
    for _ in range(2):
        relpos.backward(*args, add_into={"shaw_wk": acc})
    np.testing.assert_allclose(acc, 2 * once, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("torch_call", [False, True])
def test_a_scheme_class_is_refused_with_the_call_to_make(torch_call):
    q = np.ones((1, 1, 2, 4), np.float32)
    call = rt.attention if torch_call else relpos.forward
    args = (torch.tensor(q),) * 3 if torch_call else (q, q, q)
    expected = r"scheme: expected a scheme record, got the class ALiBi; make one: ALiBi\(\.\.\.\)"
    with pytest.raises(ValueError, match=expected):
        call(*args, relpos.ALiBi)
    with pytest.raises(ValueError, match=r"scheme: expected a relpos scheme \(Shaw, T5, \.\.\.\), got int"):
        call(*args, 3)


@pytest.mark.parametrize("causal", ["no", 2, np.array([True, False])])
@pytest.mark.parametrize("torch_call", [False, True])
def test_flags_take_true_or_false_only(causal, torch_call):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
    call = rt.attention if torch_call else relpos.forward
    args = (torch.tensor(q),) * 3 if torch_call else (q, q, q)
    with pytest.raises(ValueError, match=r"causal: expected True or False, got "):
        call(*args, causal=causal)
    # 1 and NumPy's bools are flags too, and mean what they say.
    want = relpos.forward(q, q, q, causal=True)[0]
    for flag in (1, np.bool_(True), np.array(True), torch.tensor(True)):
        got = call(*args, causal=flag)  # rt.attention returns the output alone
        np.testing.assert_array_equal(got.numpy() if torch_call else got[0], want)


@pytest.mark.parametrize("arg", ["bias", "shaw_per_head", "shaw_tied", "alibi_learnable", "deberta_per_head"])
def test_the_module_flags_take_true_or_false_only(arg):
    with pytest.raises(ValueError, match=f"{arg}: expected True or False, got 'no'"):
        rt.RelativeMultiheadAttention(8, 2, arg.split("_")[0] if arg != "bias" else "none", **{arg: "no"})


def test_return_lse_and_add_into_take_what_they_say():
    q = torch.ones(1, 1, 2, 4)
    with pytest.raises(ValueError, match=r"return_lse: expected True or False, got 'yes'"):
        rt.attention(q, q, q, return_lse="yes")
    args = backward_problem()
    with pytest.raises(ValueError, match=r"add_into: expected a dict of gradient names to arrays, got ndarray"):
        relpos.backward(*args, add_into=np.zeros(3))
    with pytest.raises(ValueError, match=r"add_into: expected a dict of gradient names to arrays, got list"):
        relpos.backward(*args, add_into=[])


def test_a_scheme_option_flag_takes_true_or_false_only():
    table = np.zeros((1, 32), np.float32)
    q = np.ones((1, 1, 2, 4), np.float32)
    with pytest.raises(ValueError, match=r"t5.bidirectional: expected True or False, got 'False'"):
        relpos.forward(q, q, q, relpos.T5(table=table, bidirectional="False"))


@pytest.mark.parametrize("args, kwargs, message", [
    ((8, 2, "t5"), dict(t5_num_buckets=-4), r"t5_num_buckets: need >= 2 \(causal\) or >= 4 \(bidirectional\), got -4"),
    ((8, 2, "t5"), dict(t5_num_buckets=3), r"t5_num_buckets: need >= 2 .* got 3"),
    ((8, 2, "t5"), dict(t5_num_buckets=8.5), r"t5_num_buckets: expected an integer, got 8.5"),
    ((8, 2, "t5"), dict(t5_max_distance=4), r"t5_max_distance: must exceed the exact range 8"),
    ((10, 2, "rope"), {}, r"rope_dims: the rotated dimensions must be even and <= head_dim 5, got 5 "
                          r"\(none given: the whole head\)"),
    ((8, 2, "rope"), dict(rope_dims=6), r"rope_dims: the rotated dimensions must be even and <= head_dim 4, got 6"),
    ((9, 3, "xl"), {}, r"xl_pos_dim: must be even \(sin and cos halves\); it defaults to embed_dim 9"),
])
def test_a_module_that_could_never_run_is_refused_when_made(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        rt.RelativeMultiheadAttention(*args, **kwargs)


def test_modules_at_the_edges_of_those_rules_run():
    for args, kwargs in [((8, 2, "t5"), dict(t5_num_buckets=4)),
                         ((8, 2, "t5"), dict(t5_num_buckets=2, t5_bidirectional=False, t5_max_distance=2)),
                         ((12, 2, "rope"), dict(rope_dims=4)), ((9, 3, "xl"), dict(xl_pos_dim=8))]:
        m = rt.RelativeMultiheadAttention(*args, **kwargs)
        out = m(torch.randn(1, 5, args[0]), causal=True)
        assert out.shape == (1, 5, args[0]) and torch.isfinite(out).all(), (args, kwargs)


def test_the_module_names_what_memory_needs():
    torch.manual_seed(0)
    m = rt.RelativeMultiheadAttention(8, 2, "xl")
    x, mems = torch.randn(2, 5, 8), torch.randn(2, 7, 8)
    with pytest.raises(ValueError, match=r"key_padding: expected \(B=2, L=5\), the new keys only "
                                         r"\(the memory's 7 are never padded\), got \(2, 12\)"):
        m(x, causal=True, mems=mems, key_padding=torch.zeros(2, 12, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"q_offset: expected an integer or 'end', got 'begin'"):
        m(x, causal=True, mems=mems, q_offset="begin")
    padded = m(x, causal=True, mems=mems, key_padding=torch.zeros(2, 5, dtype=torch.bool))
    torch.testing.assert_close(padded, m(x, causal=True, mems=mems), rtol=0, atol=0)  # no key padded: the same
    cross = rt.RelativeMultiheadAttention(8, 2, "alibi", kdim=5, vdim=3)
    with pytest.raises(ValueError, match=r"mems: one memory serves as keys and values, so key and value need one "
                                         r"width; got 5 and 3"):
        cross(torch.randn(2, 4, 8), torch.randn(2, 6, 5), torch.randn(2, 6, 3), mems=torch.randn(2, 2, 5))


def test_a_new_records_options_are_module_keywords(monkeypatch):
    """A scheme record added to relpos.schemes takes its options through the module by
    their core names, with no argument added to its signature; other keywords are refused."""
    @relpos.schemes.record
    class Toy(relpos.schemes._Scheme):
        # An option as relpos.schemes.option makes it from a C++ declaration.
        width: int = dataclasses.field(default=3,
                                       metadata={"relpos": relpos.schemes.Option("toy_width", "int", 3, low=1)})
        name = "toy"

        @classmethod
        def init_params(cls, heads, head_dim, embed_dim, options, *, dtype=None, device=None):
            return {"toy_table": torch.zeros(heads, options["toy_width"], dtype=dtype, device=device)}

    monkeypatch.setitem(relpos.schemes.SCHEMES, "toy", Toy)
    monkeypatch.setattr(rt.modules, "SCHEMES", (*rt.modules.SCHEMES, "toy"))
    m = rt.RelativeMultiheadAttention(8, 2, "toy", toy_width=5)
    assert m.scheme_options["toy_width"] == 5
    with pytest.raises(ValueError, match=r"toy_width: must be >= 1, got 0"):
        rt.RelativeMultiheadAttention(8, 2, "toy", toy_width=0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'num_head'"):
        rt.RelativeMultiheadAttention(8, 2, "toy", num_head=4)
    for bad in ("toy_widht", "shaw_kk"):
        with pytest.raises(ValueError, match=rf"no argument '{bad}' for scheme 'toy' \(its options: toy_width\)"):
            rt.RelativeMultiheadAttention(8, 2, "toy", **{bad: 5})
    expected = r"no argument 'shaw_kk' for scheme 'shaw' \(its options: shaw_k, shaw_beyond\)"
    with pytest.raises(ValueError, match=expected):
        rt.RelativeMultiheadAttention(8, 2, "shaw", shaw_kk=5)
