"""Inputs that used to end wrongly, each now a clear error naming the argument or
the documented result:

- a tensor on another device (meta) among CPU ones: refused by name in the op and in
  its fake implementation (it returned uninitialised CPU memory); all on meta still
  traces, forward and backward;
- a NumPy bfloat16 array beside a float32 or float64 q: refused for its dtype, as a
  float16 array or a torch bfloat16 tensor is (it was "cannot be read in place");
- zero-length calls (no batch entries, queries or keys): empty results, or rows that
  see no key (zero output, lse -inf, as when every key is padded), zero gradients, in
  relpos.forward / backward, rt.attention and the module for every scheme; their
  shapes and schemes still checked;
- patch_hf_t5 on LongT5 and UMT5 models: refused naming the model class and why,
  nothing patched (LongT5 raised an AttributeError).
"""
from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
import torch

import relpos
import relpos.torch as rt
from relpos.torch.ops import encode

B, H, LQ, LK, D = 2, 4, 5, 6, 8


def scheme_tensors(g):
    """A valid relpos scheme with float64 CPU tensors (entries in (0.1, 1.1)) for every
    scheme that has tensors."""
    def t(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64) + 0.1
    return [relpos.T5(t(H, 8)), relpos.Shaw(k=2, wk=t(5, D), wv=t(H, 5, D)), relpos.ALiBi(t(H)),
            relpos.TransformerXL(t(H, D), t(H, D), t(H, D, 4)), relpos.KERPLE(t(H), t(H)),
            relpos.KERPLEPower(t(H), t(H)),
            relpos.DeBERTa(c2p=t(8, D), p2c=t(H, 8, D), position_buckets=4, max_relative_positions=6)]


SCHEMES_WITH_TENSORS = [s.name for s in scheme_tensors(torch.Generator())]


def qkv(g, Lq=LQ, Lk=LK, batch=B):
    return (torch.randn(batch, H, Lq, D, generator=g, dtype=torch.float64),
            *(torch.randn(batch, H, Lk, D, generator=g, dtype=torch.float64) for _ in range(2)))


# ---- 1. every tensor on q's device, checked by name in the op and in its fake ----

def tensor_arguments():
    """(argument name, index of its scheme in scheme_tensors or None) for q's neighbours
    k, v, key_padding and every scheme tensor."""
    names = [(name, None) for name in ("k", "v", "key_padding")]
    for i, scheme in enumerate(scheme_tensors(torch.Generator())):
        names += [(f"{scheme.name}_{field}", i) for field in scheme._tensors]
    return names


@pytest.mark.parametrize("name,scheme_index", tensor_arguments(), ids=[n for n, _ in tensor_arguments()])
def test_a_meta_tensor_among_cpu_ones_is_refused_by_name(name, scheme_index):
    g = torch.Generator().manual_seed(0)
    q, k, v = qkv(g)
    scheme = None if scheme_index is None else scheme_tensors(g)[scheme_index]
    args = dict(k=k, v=v, key_padding=torch.zeros(B, LK, dtype=torch.bool))
    # all on the CPU: the call is valid, and gives relpos.forward's result
    expected, _ = relpos.forward(q, args["k"], args["v"], scheme, key_padding=args["key_padding"])
    torch.testing.assert_close(rt.attention(q, scheme=scheme, **args), expected, rtol=0, atol=0)
    if name in args:
        args[name] = args[name].to("meta")
    else:
        field = name[len(scheme.name) + 1:]
        scheme = replace(scheme, **{field: getattr(scheme, field).to("meta")})
    with pytest.raises(ValueError, match=rf"^relpos: {name}: on device meta, expected cpu like q$"):
        rt.attention(q, scheme=scheme, **args)


def test_a_cpu_tensor_among_meta_ones_is_refused_by_name():
    g = torch.Generator().manual_seed(1)
    q, k, cpu_v = qkv(g)
    q, k, v = q.to("meta"), k.to("meta"), cpu_v.to("meta")
    with pytest.raises(ValueError, match=r"^relpos: v: on device cpu, expected meta like q$"):
        rt.attention(q, k, cpu_v)
    table = torch.zeros(H, 8)
    with pytest.raises(ValueError, match=r"^relpos: t5_table: on device cpu, expected meta like q$"):
        rt.attention(q, k, v, relpos.T5(table))


@pytest.mark.parametrize("name", ["out", "lse", "dout"])
def test_the_backward_op_refuses_a_meta_tensor_by_name(name):
    g = torch.Generator().manual_seed(2)
    q, k, v = qkv(g)
    out, lse = relpos.forward(q, k, v)
    tensors = dict(out=out, lse=lse, dout=torch.ones_like(out))
    scheme, params, ints, floats = encode(relpos.NoPosition(), False, 0, 0, None, "auto", None)
    dq, dk, dv, _ = torch.ops.relpos.attention_backward(q, k, v, *tensors.values(), None, params, scheme, ints, floats)
    expected = relpos.backward(q, k, v, out, lse, torch.ones_like(out))
    for got, want in zip((dq, dk, dv), (expected["q"], expected["k"], expected["v"])):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    tensors[name] = tensors[name].to("meta")
    with pytest.raises(ValueError, match=rf"^relpos: {name}: on device meta, expected cpu like q$"):
        torch.ops.relpos.attention_backward(q, k, v, *tensors.values(), None, params, scheme, ints, floats)


@pytest.mark.parametrize("scheme_index", range(len(SCHEMES_WITH_TENSORS)), ids=SCHEMES_WITH_TENSORS)
def test_all_on_meta_traces_forward_and_backward(scheme_index):
    """What torch.compile and torch.export do with meta tensors: shapes and dtypes, no values."""
    g = torch.Generator().manual_seed(3)
    scheme = scheme_tensors(g)[scheme_index]
    meta = replace(scheme, **{f: getattr(scheme, f).to("meta").requires_grad_() for f in scheme._tensors})
    q, k, v = (x.to("meta").requires_grad_() for x in qkv(g, Lq=3, Lk=7))
    out, lse = rt.attention(q, k, v, meta, key_padding=torch.zeros(B, 7, dtype=torch.bool, device="meta"),
                            return_lse=True)
    assert (out.device.type, tuple(out.shape), out.dtype) == ("meta", (B, H, 3, D), torch.float64)
    assert (lse.device.type, tuple(lse.shape)) == ("meta", (B, H, 3))
    leaves = [q, k, v, *(getattr(meta, f) for f in meta._tensors)]
    grads = torch.autograd.grad(out.sum(), leaves)
    for leaf, grad in zip(leaves, grads):
        assert grad.device.type == "meta" and grad.shape == leaf.shape and grad.dtype == leaf.dtype


@pytest.mark.parametrize("name", ["k", "v", "t5_table"])
def test_the_fake_implementation_checks_dtypes_by_name(name):
    g = torch.Generator().manual_seed(4)
    q, k, v = (x.to("meta") for x in qkv(g))
    tensors = dict(k=k, v=v, t5_table=torch.zeros(H, 8, device="meta"))
    tensors[name] = tensors[name].to(torch.bfloat16)
    with pytest.raises(ValueError, match=rf"^relpos: {name}: dtype must match q \(float64\), got bfloat16$"):
        rt.attention(q, tensors["k"], tensors["v"], relpos.T5(tensors["t5_table"]))


# ---- 2. a NumPy bfloat16 array is refused for its dtype ----

BAD_DTYPES = {"numpy bfloat16": lambda a: a.astype(ml_dtypes.bfloat16), "numpy float16": lambda a: a.astype(np.float16),
              "torch bfloat16": lambda a: torch.tensor(a).bfloat16()}


@pytest.mark.parametrize("q_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", list(BAD_DTYPES))
@pytest.mark.parametrize("where", ["k", "v", "t5_table", "dout"])
def test_a_half_array_beside_a_wider_q_is_refused_for_its_dtype(where, bad, q_dtype):
    rng = np.random.default_rng(5)
    arrays = {n: rng.standard_normal(s).astype(q_dtype) for n, s in
              (("q", (B, H, LQ, D)), ("k", (B, H, LK, D)), ("v", (B, H, LK, D)), ("t5_table", (H, 8)))}
    if where != "dout":
        arrays[where] = BAD_DTYPES[bad](arrays[where])
    # torch tensors beside NumPy q: each array is read on its own, so the mix itself is fine
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    got = "float16" if bad == "numpy float16" else "bfloat16"
    message = rf"^relpos: {where}: dtype must match q \({np.dtype(q_dtype).name}\), got {got}$"
    scheme = relpos.T5(arrays["t5_table"])
    if where == "dout":
        out, lse = relpos.forward(q, k, v, scheme)
        with pytest.raises(ValueError, match=message):
            relpos.backward(q, k, v, out, lse, BAD_DTYPES[bad](out), scheme)
    else:
        with pytest.raises(ValueError, match=message):
            relpos.forward(q, k, v, scheme)


@pytest.mark.parametrize("q_dtype", [np.float32, np.float64])
def test_a_bfloat16_lse_is_refused_for_its_dtype(q_dtype):
    q = np.random.default_rng(6).standard_normal((B, H, LQ, D)).astype(q_dtype)
    out, lse = relpos.forward(q, q, q)
    with pytest.raises(ValueError, match=rf"^relpos: lse: dtype must be {np.dtype(q_dtype).name}, got bfloat16$"):
        relpos.backward(q, q, q, out, lse.astype(ml_dtypes.bfloat16), out)


# ---- 3. zero-length calls ----

@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("scheme", [s for s in rt.SCHEMES if not relpos.schemes.SCHEMES[s]._grid])  # a grid has cells
def test_the_module_on_a_zero_length_sequence(scheme, batch):
    """No tokens: an empty (B, 0, embed_dim) output and gradients of zeros for every
    parameter, as torch's autograd gives for nn.Linear on no rows; no key for
    existing queries (cross-attention on an empty memory): every row the output
    projection's bias, as when every key is padded."""
    torch.manual_seed(7)
    m = rt.RelativeMultiheadAttention(32, 4, scheme)
    y = m(torch.randn(batch, 0, 32))
    assert y.shape == (batch, 0, 32)
    y.sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape and not p.grad.any(), name

    m.zero_grad()
    x = torch.randn(batch, 3, 32, requires_grad=True)
    no_keys = m(x, torch.zeros(batch, 0, 32))
    padded = m(x, torch.randn(batch, 2, 32), key_padding=torch.ones(batch, 2, dtype=torch.bool))
    torch.testing.assert_close(no_keys, m.out_proj.bias.expand(batch, 3, 32), rtol=0, atol=0)
    torch.testing.assert_close(no_keys, padded, rtol=0, atol=0)
    dy = torch.randn_like(no_keys)
    dx, d_bias = torch.autograd.grad(no_keys, [x, m.out_proj.bias], dy)
    assert not dx.any()
    torch.testing.assert_close(d_bias, dy.sum((0, 1)), rtol=1e-12, atol=1e-12)


ZERO_LENGTH = [dict(batch=0), dict(Lq=0), dict(Lk=0), dict(Lq=0, Lk=0), dict(batch=0, Lk=0)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extents", ZERO_LENGTH, ids=lambda e: ",".join(f"{k}=0" for k in e))
@pytest.mark.parametrize("scheme_index", range(len(SCHEMES_WITH_TENSORS)), ids=SCHEMES_WITH_TENSORS)
def test_attention_on_zero_length_calls(scheme_index, extents, causal):
    """rt.attention and relpos.forward / backward: the output of a call where every
    key is padded when there is none (zeros, lse -inf), nothing when there are no
    rows; zero gradients for q, k, v and the scheme's tensors."""
    g = torch.Generator().manual_seed(8)
    scheme = scheme_tensors(g)[scheme_index]
    leaves = {f: getattr(scheme, f).clone().requires_grad_() for f in scheme._tensors}
    scheme = replace(scheme, **leaves)
    shape = {**dict(batch=B, Lq=LQ, Lk=LK), **extents}
    q, k, v = (x.requires_grad_() for x in qkv(g, **shape))
    out, lse = rt.attention(q, k, v, scheme, causal=causal, return_lse=True)
    assert out.shape == (shape["batch"], H, shape["Lq"], D) and lse.shape == out.shape[:3]
    assert not out.any() and bool((lse == -torch.inf).all())
    if shape["Lk"] == 0 and shape["Lq"] and shape["batch"]:
        k2, v2 = (torch.randn(shape["batch"], H, 3, D, generator=g) for _ in range(2))
        padded = rt.attention(q, k2, v2, scheme, key_padding=torch.ones(shape["batch"], 3, dtype=torch.bool),
                              return_lse=True)
        for got, want in zip((out, lse), padded):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    grads = torch.autograd.grad(out, [q, k, v, *leaves.values()], torch.randn(out.shape, generator=g))
    for leaf, grad in zip([q, k, v, *leaves.values()], grads):
        assert grad.shape == leaf.shape and not grad.any()
    # NumPy arrays through relpos.forward / backward: the same, in both layouts
    arrays = [x.detach().numpy() for x in (q, k, v)]
    np_scheme = replace(scheme, **{f: t.detach().numpy() for f, t in leaves.items()})
    for layout in ("bhld", "blhd"):
        given = [a.swapaxes(1, 2) for a in arrays] if layout == "blhd" else arrays
        np_out, np_lse = relpos.forward(*given, np_scheme, causal=causal, layout=layout)
        np.testing.assert_array_equal(relpos.heads_first(np_out, layout), out.detach().numpy())
        np.testing.assert_array_equal(np_lse, lse.numpy())
        np_grads = relpos.backward(*given, np_out, np_lse, np.ones_like(np_out), np_scheme, causal=causal,
                                   layout=layout)
        for name, a in np_grads.items():
            assert not a.any(), name


def test_available_algorithms_of_a_zero_length_call_are_those_of_one_row():
    g = torch.Generator().manual_seed(9)
    for scheme in scheme_tensors(g):
        q, k, v = qkv(g, Lq=0)
        one_row = qkv(g, Lq=1)
        assert relpos.available_algorithms(q, k, v, scheme) == relpos.available_algorithms(*one_row, scheme)


@pytest.mark.parametrize("call", ["forward", "backward"])
@pytest.mark.parametrize("bad,message", [
    (dict(Lq=0, scheme=lambda: relpos.T5(torch.zeros(H + 1, 8))),
     r"^relpos: t5[._]table: .*\(a zero-length call, checked as one with 1 row where it has 0\)$"),
    (dict(Lk=0, scheme=lambda: relpos.Shaw(k=2, wk=torch.zeros(4, D))), r"^relpos: shaw[._]wk: "),
    (dict(batch=0, scheme=lambda: relpos.KERPLE(torch.ones(H), torch.zeros(H))), r"^relpos: kerple[._]r2: "),
    (dict(Lq=0, k_batch=3), r"^relpos: k: expected B=2 \(axis 0\) like q and k, got shape \(3, 4, 6, 8\)$"),
    (dict(batch=0, pad_keys=LK + 1),
     r"^relpos: key_padding: expected Lk=6 \(axis 1\) like q and k, got shape \(0, 7\)$"),
    (dict(Lq=0, heads=0), r"^relpos: q: every dimension must be >= 1"),
    (dict(Lk=0, width=0), r"^relpos: q: every dimension must be >= 1"),
])
def test_a_zero_length_call_is_checked_like_any_other(bad, message, call):
    batch, Lq, Lk = bad.get("batch", B), bad.get("Lq", LQ), bad.get("Lk", LK)
    heads, width = bad.get("heads", H), bad.get("width", D)
    q = torch.zeros(batch, heads, Lq, width)
    k = torch.zeros(bad.get("k_batch", batch), heads, Lk, width)
    pad = torch.zeros(batch, bad["pad_keys"], dtype=torch.bool) if "pad_keys" in bad else None
    scheme = bad["scheme"]() if "scheme" in bad else None
    with pytest.raises(ValueError, match=message):
        if call == "forward":
            relpos.forward(q, k, k, scheme, key_padding=pad)
        else:
            out, lse = torch.zeros(batch, heads, Lq, width), torch.zeros(batch, heads, Lq)
            relpos.backward(q, k, k, out, lse, out, scheme, key_padding=pad)


def test_a_zero_length_backward_checks_its_gradient_arrays():
    q, k = torch.zeros(B, H, 0, D), torch.zeros(B, H, LK, D)
    out, lse = relpos.forward(q, k, k)
    with pytest.raises(ValueError, match=r"^relpos: dout: expected Lq=0 \(axis 2\) like q and k, got shape"):
        relpos.backward(q, k, k, out, lse, torch.zeros(B, H, 1, D))
    with pytest.raises(ValueError, match=r"^relpos: add_into\['k'\]: expected a tensor of shape \(2, 4, 6, 8\)"):
        relpos.backward(q, k, k, out, lse, out, add_into={"k": torch.zeros(B, H, LK + 1, D)})
    # what add_into holds is left as it is: a zero-length call adds zero
    dk = torch.full((B, H, LK, D), 3.0)
    relpos.backward(q, k, k, out, lse, out, add_into={"k": dk})
    assert bool((dk == 3.0).all())


# ---- 4. T5's relatives are refused by patch_hf_t5, by the model's name ----

def relatives():
    from transformers import (LongT5Config, LongT5EncoderModel, LongT5ForConditionalGeneration, LongT5Model,
                              UMT5Config, UMT5EncoderModel, UMT5ForConditionalGeneration, UMT5Model)

    common = dict(vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_decoder_layers=2, num_heads=4,
                  relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
                  decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    longt5 = "LongT5's encoder attends to a local window of keys"
    umt5 = "UMT5 gives every layer its own relative_attention_bias table"
    cases = [(cls, LongT5Config(**common, local_radius=2, global_block_size=4, encoder_attention_type=kind), longt5)
             for cls in (LongT5Model, LongT5ForConditionalGeneration, LongT5EncoderModel)
             for kind in ("local", "transient-global")]
    cases += [(cls, UMT5Config(**common), umt5) for cls in (UMT5Model, UMT5ForConditionalGeneration, UMT5EncoderModel)]
    return cases


@pytest.mark.parametrize("cls,config,why", relatives(),
                         ids=[f"{c.__name__}-{getattr(k, 'encoder_attention_type', '')}" for c, k, _ in relatives()])
def test_longt5_and_umt5_are_refused_by_name_and_left_unpatched(cls, config, why):
    torch.manual_seed(0)
    model = cls(config).eval()
    ids = torch.randint(2, 40, (1, 9))
    extra = {} if "Encoder" in cls.__name__ else dict(decoder_input_ids=ids[:, :4])
    before = model(input_ids=ids, **extra)[0]
    with pytest.raises(ValueError, match=rf"^relpos: patch_hf_t5: {cls.__name__} is not patched: {why}"):
        rt.patch_hf_t5(model)
    assert not any(hasattr(m, "_relpos_bias_owner") for m in model.modules())
    torch.testing.assert_close(model(input_ids=ids, **extra)[0], before, rtol=0, atol=0)
