"""relpos.gpu's Triton kernels on the CPU, through Triton's interpreter: every scheme the
GPU path serves, forward and every gradient, against the float64 torch oracle
(harness.run_oracle) at float32 and under the half-precision error rule at bfloat16.

The kernels run as written for the GPU; the interpreter executes each program of
the grid with NumPy. Tiles are 16 x 16 there (relpos.gpu.config), so the sizes
below span several tiles in both directions. The matrix is covered by pairs (every
scheme with causal / padding / offsets / cross-attention / head sizes in
rotation); RELPOS_GPU_FULL=1 runs every scheme with every mask and offset.
"""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")
# conftest.py sets TRITON_INTERPRET=1 before anything imports Triton: the interpreter
# must be chosen before triton.language is made, so it holds for the whole process.
assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest (conftest.py sets TRITON_INTERPRET=1)"

import relpos  # noqa: E402
import relpos.torch as rt  # noqa: E402
import torch_oracle  # noqa: E402
from harness import Case, assert_matches_oracle, ids, make_problem, oracle_options, run_oracle  # noqa: E402


def bench_gpu():
    """bench/gpu.py as a module (its round_like_a_gpu); importing it runs no benchmark."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "relpos_bench_gpu"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[2] / "bench" / "gpu.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def gpu():
    import relpos.gpu

    return relpos.gpu


SCHEMES = {
    "none": {},
    "alibi": {"learn": True},
    "t5": {"num_buckets": 16, "max_distance": 40},
    "kerple": {},
    "kerple_power": {},
    "rope": {"dims": 8},
    "xl": {"pos_dim": 12},
    "shaw": {"k": 5},
    "deberta": {"position_buckets": 8, "max_relative_positions": 20},
    "sam": {},  # grids from the shape (_grid)
    "swin": {},  # one window of the shape's cells: Lq == Lk only
}
MASKS = [dict(causal=False), dict(causal=True), dict(causal=False, padding="batch"),
         dict(causal=True, padding="random")]
SHAPES = [dict(Lq=37, Lk=37), dict(Lq=21, Lk=50, q_offset=29), dict(Lq=40, Lk=25, q_offset=3, k_offset=11),
          dict(Lq=1, Lk=45, q_offset=44)]
# The same for SAM and Swin, of lengths whose grids are more than one row (6 x 6, 4 x 6 against 5 x 10, ...)
GRID_SHAPES = [dict(Lq=36, Lk=36), dict(Lq=24, Lk=50, q_offset=29), dict(Lq=40, Lk=25, q_offset=3, k_offset=11),
               dict(Lq=1, Lk=45, q_offset=44)]


def _cases():
    if os.environ.get("RELPOS_GPU_FULL") == "1":
        combos = itertools.product(SCHEMES, range(len(MASKS)), range(len(SHAPES)))
    else:  # each scheme meets every mask and every shape once, in rotation
        combos = [(s, i % len(MASKS), (i + n) % len(SHAPES)) for n, s in enumerate(SCHEMES) for i in range(2)]
        combos += [("t5", 3, 0), ("xl", 1, 1), ("rope", 2, 2), ("shaw", 1, 3), ("shaw", 3, 2), ("deberta", 1, 1),
                   ("deberta", 3, 0), ("sam", 2, 0), ("swin", 2, 0), ("swin", 3, 0)]
    cases = []
    for scheme, m, s in combos:
        if scheme == "swin" and GRID_SHAPES[s]["Lq"] != GRID_SHAPES[s]["Lk"]:
            continue  # Swin's queries and keys are the cells of one window: Lq == Lk only
        opts = dict(SCHEMES[scheme])
        if scheme == "t5" and MASKS[m]["causal"]:
            opts["bidirectional"] = False
        if scheme == "rope" and s % 2:
            opts["style"] = "interleaved"
        if scheme == "xl":  # unclamped, or clamped inside the tiles' distances
            opts["clamp_len"] = (0, 7)[m % 2]
        if scheme == "shaw":  # per-head or shared tables, K+V / K / V, clip or zero beyond, k past the tiles
            opts.update(per_head=bool(s % 2), tables=("kv", "k", "v")[m % 3], beyond=("clip", "zero")[m % 2],
                        k=(5, 40)[s % 2])
        if scheme == "deberta":  # both / c2p / p2c, shared or per-head, log buckets or none (span past the tiles)
            opts.update(tables=("c2p|p2c", "c2p", "p2c")[m % 3], per_head=bool(s % 2))
            if m == 2:
                opts.update(position_buckets=-1, max_relative_positions=24)
        shape = GRID_SHAPES[s] if scheme in ("sam", "swin") else SHAPES[s]
        if scheme in ("sam", "swin"):  # the rows as grids: SAM's query and key grids, Swin's window
            (qh, qw), (kh, kw) = _grid(shape["Lq"]), _grid(shape["Lk"])
            opts.update(dict(q_height=qh, q_width=qw, k_height=kh, k_width=kw) if scheme == "sam" else
                        dict(window_height=qh, window_width=qw))
        cases.append(Case(f"{scheme}_m{m}_s{s}", scheme, B=2, H=2, d=16, **MASKS[m], **shape, opts=opts))
    return list({c.id: c for c in cases}.values())


def _grid(L: int) -> tuple[int, int]:
    """The grid of L cells closest to square (height <= width)."""
    height = max(h for h in range(1, int(L ** 0.5) + 1) if L % h == 0)
    return height, L // height


def dropout_rng(seed: int, offset: int) -> torch.Tensor:
    """relpos.gpu's dropout_rng for relpos.forward's dropout_seed (64 bits) and dropout_offset:
    the int64 tensor [seed, offset] that draw_dropout_rng makes (the seed's bits as an int64)."""
    return torch.tensor([seed - 2**64 if seed >= 2**63 else seed, offset], dtype=torch.int64)


def run_gpu(pb, dtype=torch.float32) -> dict:
    """relpos.gpu forward and backward on torch tensors of dtype, results as float64 arrays
    named as harness.run_oracle names them (with the case's dropout, its seed and offset)."""
    def leaf(x):
        return torch.tensor(np.asarray(x), dtype=torch.float64).to(dtype).requires_grad_()

    q, k, v = leaf(pb.q), leaf(pb.k), leaf(pb.v)
    params = {n: leaf(x) for n, x in pb.params.items()}
    kw = pb.call_kwargs()
    if kw["key_padding"] is not None:
        kw["key_padding"] = torch.tensor(kw["key_padding"] != 0)
    if "dropout_seed" in kw:  # relpos.forward's seed and offset as the GPU path takes them
        kw["dropout_rng"] = dropout_rng(kw.pop("dropout_seed"), kw.pop("dropout_offset"))
    if "segments" in kw:  # (q_ids, k_ids) arrays as tensors
        kw["segments"] = tuple(torch.from_numpy(np.asarray(ids)) for ids in kw["segments"])
    out, lse = gpu().attention(q, k, v, pb.scheme(params=params), return_lse=True, **kw)
    out.backward(torch.tensor(pb.dout).to(dtype))
    res = {"out": out, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad,
           **{"d" + n: p.grad for n, p in params.items()}}
    return {n: x.detach().double().numpy() for n, x in res.items()}


@pytest.mark.parametrize("case", _cases(), ids=ids(_cases()))
def test_float32_matches_the_float64_oracle(case):
    pb = make_problem(case)
    assert_matches_oracle(run_gpu(pb), run_oracle(pb), np.float32)


@pytest.mark.parametrize("case", [Case("t5_bf16", "t5", causal=True, Lq=33, Lk=40, q_offset=7,
                                       opts={"num_buckets": 8, "max_distance": 20, "bidirectional": False}),
                                  Case("kerple_bf16", "kerple", padding="random", Lq=30, Lk=30),
                                  Case("shaw_bf16", "shaw", causal=True, Lq=48, Lk=64, q_offset=16, opts={"k": 6}),
                                  Case("rope_bf16", "rope", causal=True, Lq=40, Lk=56, q_offset=16,
                                       opts={"dims": 8, "style": "interleaved"}),
                                  Case("xl_bf16", "xl", causal=True, Lq=64, Lk=96, q_offset=32,
                                       opts={"pos_dim": 16, "clamp_len": 20}),
                                  Case("deberta_bf16", "deberta", padding="random", Lq=48, Lk=64, q_offset=16,
                                       opts={"position_buckets": 16, "max_relative_positions": 40}),
                                  Case("sam_bf16", "sam", padding="random", Lq=48, Lk=24,
                                       opts={"q_height": 6, "q_width": 8, "k_height": 3, "k_width": 8}),
                                  Case("swin_bf16", "swin", B=3, H=3, Lq=49, Lk=49, causal=True,
                                       opts={"window_height": 7, "window_width": 7})],
                         ids=lambda c: c.id)
def test_bfloat16_meets_flash_attentions_error_rule(case, monkeypatch):
    """FlashAttention's rule for its GPU kernels: a bfloat16 result's error (against float64
    on the same bfloat16 inputs) is at most 2x that of the same attention computed by
    PyTorch in bfloat16. The kernels multiply P and dS as bfloat16, as FlashAttention does
    (the CPU kernels keep them in float32 and meet a stricter rule, test_half_storage.py).
    Maxima of a few hundred errors scatter by 2-3x from one random draw to the next, so
    the Transformer-XL case is a larger one. The interpreter's float32 -> bfloat16
    conversion truncates where a GPU's rounds to nearest; bench/gpu.py's patch makes it
    round for the test (RoPE's rotated q and k, rounded once, failed the rule truncated)."""
    import ml_dtypes
    from triton.runtime import interpreter

    monkeypatch.setattr(interpreter.InterpreterBuilder, "cast_impl", interpreter.InterpreterBuilder.cast_impl)
    assert bench_gpu().round_like_a_gpu(), "Triton's interpreter changed: bench/gpu.py cannot patch its rounding"

    pb = make_problem(case)
    half = run_gpu(pb, torch.bfloat16)
    torch_half = _oracle_in(pb, torch.bfloat16)
    exact = run_oracle(pb, ml_dtypes.bfloat16)
    for name, ref in exact.items():
        finite = np.isfinite(ref)
        err_half = np.abs(half[name][finite] - ref[finite]).max()
        err_torch = np.abs(torch_half[name][finite] - ref[finite]).max()
        assert err_half <= 2 * err_torch + 1e-6, f"{name}: bfloat16 error {err_half} > 2 x PyTorch's {err_torch}"


def _oracle_in(pb, dtype) -> dict:
    """The torch oracle computed in ``dtype`` throughout (its autograd too), as float64 arrays."""
    def leaf(x):
        return torch.tensor(np.asarray(x)).to(dtype).requires_grad_()

    q, k, v = leaf(pb.q), leaf(pb.k), leaf(pb.v)
    params = {n: leaf(x) for n, x in pb.params.items()}
    c = pb.case
    kp = None if pb.key_padding is None else torch.tensor(pb.key_padding != 0)
    out, lse = torch_oracle.attention(q, k, v, c.scheme, oracle_options(c), params, causal=c.causal, key_padding=kp,
                                      q_offset=c.q_offset, k_offset=c.k_offset, scale=c.scale)
    leaves = [q, k, v, *params.values()]
    grads = torch.autograd.grad(out, leaves, grad_outputs=torch.tensor(pb.dout).to(dtype))
    names = ["out", "lse", "dq", "dk", "dv"] + ["d" + n for n in params]
    return {n: x.detach().double().numpy() for n, x in zip(names, [out, lse, *grads])}


def _reference_cpu(q, k, v, scheme, **kw):
    """relpos.torch.attention in float64 on the C++ kernels: the reference for what the
    oracle does not take (grouped-query heads, (B, L, H, d) views)."""
    return rt.attention(q, k, v, scheme, **kw)


def _grads(fn, tensors, scheme_fields, dout, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    fields = {n: t.detach().clone().requires_grad_() for n, t in scheme_fields[1].items()}
    scheme = scheme_fields[0](**fields)
    out = fn(*leaves, scheme, **kw)
    out.backward(dout.to(out.dtype))
    return [out.detach().double()] + [x.grad.double() for x in leaves] + [f.grad.double() for f in fields.values()]


@pytest.mark.parametrize("scheme", ["alibi", "t5", "shaw", "rope", "deberta", "sam", "swin"])
def test_grouped_query_heads_and_blhd_views_match_the_cpu_kernels(scheme):
    g = torch.Generator().manual_seed(5)
    B, H, Hkv, d = 2, 4, 2, 16
    # grids: SAM's pooled 4 x 5 queries against 5 x 7 keys, Swin's 5 x 7 window
    Lq, Lk = {"sam": (20, 35), "swin": (35, 35)}.get(scheme, (29, 35))
    q = torch.randn(B, Lq, H, d, generator=g).transpose(1, 2)  # a (B, L, H, d) tensor seen as (B, H, L, d)
    k = torch.randn(B, Hkv, Lk, d, generator=g)
    v = torch.randn(B, Hkv, Lk, 24, generator=g)
    dout = torch.randn(B, H, Lq, 24, generator=g)
    if scheme == "alibi":
        make = (lambda slopes: relpos.ALiBi(slopes), {"slopes": torch.rand(H, generator=g)})
    elif scheme == "t5":
        make = (lambda table: relpos.T5(table, max_distance=30), {"table": torch.randn(H, 32, generator=g)})
    elif scheme == "rope":  # q rotated from a (B, L, H, d) view; k's gradient rotated back per key head
        make = (lambda: relpos.RoPE(dims=12), {})
    elif scheme == "sam":  # the tables read by each query head of a key head's group
        make = (lambda rel_h, rel_w: relpos.SAM(rel_h, rel_w, q_height=4, q_width=5, k_height=5, k_width=7),
                {"rel_h": torch.randn(9, d, generator=g), "rel_w": torch.randn(13, d, generator=g)})
    elif scheme == "swin":
        make = (lambda table: relpos.Swin(table, window_height=5, window_width=7),
                {"table": torch.randn(H, 9 * 13, generator=g)})
    elif scheme == "deberta":  # p2c read by each key head for the query heads of its group
        make = (lambda c2p, p2c: relpos.DeBERTa(c2p=c2p, p2c=p2c, position_buckets=8, max_relative_positions=20),
                {"c2p": torch.randn(H, 16, d, generator=g), "p2c": torch.randn(16, d, generator=g)})
    else:
        make = (lambda wk, wv: relpos.Shaw(k=6, wk=wk, wv=wv),
                {"wk": torch.randn(H, 13, d, generator=g), "wv": torch.randn(13, 24, generator=g)})
    kw = dict(causal=True, q_offset="end", key_padding=torch.rand(B, Lk, generator=g) < 0.2)
    got = _grads(gpu().attention, [x.float() for x in (q, k, v)], (make[0], {n: t.float() for n, t in make[1].items()}),
                 dout, **kw)
    ref = _grads(_reference_cpu, [x.double() for x in (q, k, v)], make, dout.double(), **kw)
    for a, b in zip(got, ref):
        assert (a - b).abs().max().item() <= 2e-5 * max(1.0, b.abs().max().item())


def test_gradients_repeat_bit_for_bit():
    pb = make_problem(Case("t5_repeat", "t5", causal=True, Lq=40, Lk=40, opts={"num_buckets": 8, "max_distance": 20,
                                                                             "bidirectional": False}))
    first, second = run_gpu(pb), run_gpu(pb)
    for name in first:
        assert np.array_equal(first[name], second[name], equal_nan=True), name


def test_alibi_default_slopes_are_the_papers():
    from relpos.schemes import alibi_slopes

    for heads in (1, 2, 3, 5, 8, 12, 16, 24, 31):
        np.testing.assert_allclose(alibi_slopes(heads), relpos.alibi_slopes(heads), rtol=1e-15)


def test_t5_buckets_are_relpos_buckets():
    from relpos.gpu.terms import t5_buckets

    r = torch.tensor(list(range(-300, 301)) + [45, -45, 10**9, -10**9], dtype=torch.int64)
    for bidirectional, buckets, max_distance in ((True, 32, 128), (False, 32, 128), (True, 108, 125), (False, 8, 20)):
        got = t5_buckets(r, bidirectional, buckets, max_distance).tolist()
        want = [relpos.t5_bucket(int(x), bidirectional=bidirectional, num_buckets=buckets, max_distance=max_distance)
                for x in r]
        assert got == want


ONE_BUCKET = [Case("t5_both_sides", "t5", Lq=70, Lk=90, q_offset=9,
                   opts={"num_buckets": 8, "max_distance": 12}),
              Case("t5_causal_padded", "t5", causal=True, padding="random", Lq=60, Lk=80, q_offset=20,
                   opts={"num_buckets": 6, "max_distance": 10, "bidirectional": False})]


@pytest.mark.parametrize("case", ONE_BUCKET, ids=ids(ONE_BUCKET))
def test_t5_tiles_of_one_bucket_read_it_once(case):
    """T5 where most of the interpreter's tiles read one bucket (a small max_distance), whose value the dk, dv
    kernel reads once per tile, while the tiles across a bucket edge or zero gather per pair:
    output and every gradient (the table's included) against the float64 oracle."""
    from relpos.gpu.config import INTERPRETER
    from relpos.gpu.terms import t5_buckets

    o = case.opts
    q_pos, k_pos = case.q_offset + torch.arange(case.Lq), torch.arange(case.Lk)
    r = k_pos[None, :] - q_pos[:, None]
    buckets = t5_buckets(r, o.get("bidirectional", True), o["num_buckets"], o["max_distance"])
    bm, bn = INTERPRETER.block_m, INTERPRETER.block_n  # the tiles the interpreter's kernels take
    tiles = buckets.unfold(0, bm, bm).unfold(1, bn, bn).flatten(2)
    one = (tiles.amin(-1) == tiles.amax(-1)).sum().item()
    assert 4 <= one < tiles.shape[0] * tiles.shape[1] - 4  # both kinds of tile, several of each
    pb = make_problem(case)
    assert_matches_oracle(run_gpu(pb), run_oracle(pb), np.float32)


def test_deberta_rows_are_relpos_buckets():
    """The GPU path's per-distance rows equal the CPU core's bucket, shifted by the span and
    clamped, at every distance of a long call and at the largest, with buckets and without."""
    from relpos.gpu.terms import deberta_rows

    r = torch.cat((torch.arange(-5000, 5001), torch.tensor([-(1 << 40), (1 << 40) - 1, 1 << 35])))
    for buckets, reach in ((256, 512), (8, 20), (64, 100000), (-1, 24), (0, 512)):
        span = buckets if buckets > 0 else reach
        expected = [min(max(relpos.deberta_bucket(-int(x), buckets, reach) + span, 0), 2 * span - 1) for x in r]
        assert deberta_rows(r, buckets, reach).tolist() == expected, (buckets, reach)


def test_a_table_shared_as_one_head_is_the_shared_table():
    """A DeBERTa or Shaw table given as (1, rows, d), as the CPU core takes a shared table,
    computes what (rows, d) does, and its gradient keeps its shape."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 20, 16, generator=gen, dtype=torch.float32) for _ in range(3))
    for make, table in ((lambda t: relpos.DeBERTa(c2p=t, position_buckets=8, max_relative_positions=20),
                         torch.randn(16, 16, generator=gen, dtype=torch.float32)),
                        (lambda t: relpos.Shaw(k=3, wk=t), torch.randn(7, 16, generator=gen, dtype=torch.float32))):
        results = []
        for given in (table, table[None]):
            given = given.clone().requires_grad_()
            out = gpu().attention(q, k, v, make(given))
            out.sum().backward()
            assert given.grad.shape == given.shape
            results.append((out.detach(), given.grad.reshape(table.shape)))
        torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_deberta_scale_defaults_to_the_papers():
    """1 / sqrt(d (1 + tables)) by default, as the CPU path: same output with and without it."""
    gen = torch.Generator().manual_seed(3)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    q, k, v = (randn(1, 2, 20, 16) for _ in range(3))
    for tables in ({"c2p": randn(16, 16)}, {"c2p": randn(16, 16), "p2c": randn(2, 16, 16)}):
        scheme = relpos.DeBERTa(**tables, position_buckets=8, max_relative_positions=20)
        got = gpu().attention(q, k, v, scheme)
        expected = rt.attention(q, k, v, scheme, scale=(16 * (1 + len(tables))) ** -0.5)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


RECTANGLES = [Case(f"{scheme}_{m}", scheme, B=2, H=2, d=16, Lq=40, Lk=50, q_offset=13, k_offset=2, opts=opts,
                   **MASKS[m % len(MASKS)]) for m, (scheme, opts) in enumerate([
                       ("none", {}), ("alibi", {"learn": True}), ("t5", {"num_buckets": 16, "max_distance": 40}),
                       ("kerple_power", {}), ("xl", {"pos_dim": 12, "clamp_len": 7}), ("rope", {"dims": 8}),
                       ("sam", {"q_height": 5, "q_width": 8, "k_height": 5, "k_width": 10})])]


@pytest.mark.parametrize("shape", [(32, 16), (16, 32)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("case", RECTANGLES, ids=ids(RECTANGLES))
def test_tiles_taller_or_wider_than_square(case, shape, monkeypatch):
    """Tiles of BM != BN (the GPU's per-kernel tile shapes): every term but the tables per
    distance (whose tile pair reads BM + BN distances, a power of two only when square) against
    the float64 oracle, causal and padded, with offsets, over partial tiles both ways."""
    from relpos.gpu import config

    monkeypatch.setattr(config, "INTERPRETER", config.Launch(*shape, 4, 1))
    pb = make_problem(case)
    assert_matches_oracle(run_gpu(pb), run_oracle(pb), np.float32)


PER_KERNEL = [Case("alibi_dropout", "alibi", causal=True, padding="random", Lq=40, Lk=70, q_offset=30,
                   dropout_p=0.3, opts={"learn": True}),
              Case("t5_4heads", "t5", H=4, Lq=45, Lk=45, opts={"num_buckets": 16, "max_distance": 40}),
              Case("xl_causal", "xl", causal=True, Lq=33, Lk=60, q_offset=27, opts={"pos_dim": 12, "clamp_len": 9})]


@pytest.mark.parametrize("case", PER_KERNEL, ids=ids(PER_KERNEL))
def test_each_kernel_with_tiles_of_its_own(case, monkeypatch):
    """config.Launches with a configuration per kernel (tiles of 16, 32 and 64 keys; where they
    are 64 keys and the keys start at 0, dropout's draw per four keys, else per key): the same
    result, dropout's mask drawn alike by kernels whose tiles differ, against the float64 oracle."""
    from relpos.gpu import config, launch

    for tiles in [((32, 16), (16, 32), (16, 64)), ((16, 64), (32, 16), (32, 32))]:
        launches = config.Launches(*(config.Launch(*t, 4, 1) for t in tiles))
        monkeypatch.setattr(launch, "launch_for", lambda *_, **__: launches)
        pb = make_problem(case)
        assert_matches_oracle(run_gpu(pb), run_oracle(pb), np.float32)


def test_tables_refuse_tiles_that_are_not_square(monkeypatch):
    from relpos.gpu import config

    monkeypatch.setattr(config, "INTERPRETER", config.Launch(32, 16, 4, 1))
    q = torch.randn(1, 2, 8, 16, dtype=torch.float32)
    with pytest.raises(ValueError, match="tables per distance need square tiles, got 32 x 16"):
        gpu().attention(q, q, q, relpos.Shaw(k=2, wk=torch.zeros(5, 16, dtype=torch.float32)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_dots_are_each_rows_float32_sum(dtype):
    """The backward's D = rowsum(dout * out) (row_kernels.row_dots_kernel) against float64 sums of
    the same values, out a (B, L, H, dv) view and dout with a feature stride of L, over more rows
    than one program takes (70: 64 + 6)."""
    from relpos.gpu import launch

    B, L, H, dv = 2, 70, 3, 24
    out = torch.randn(B, L, H, dv).to(dtype).transpose(1, 2)
    dout = torch.randn(B, H, dv, L).to(dtype).transpose(2, 3)
    got = launch._row_dots(dout, out)
    assert got.dtype == torch.float32 and got.shape == (B, H, L) and got.is_contiguous()
    torch.testing.assert_close(got.double(), (dout.double() * out.double()).sum(-1), rtol=1e-5, atol=1e-5)


def test_fully_masked_rows_and_empty_calls():
    q, k, v = (torch.randn(1, 2, n, 16, dtype=torch.float32, requires_grad=True) for n in (5, 6, 6))
    out, lse = gpu().attention(q, k, v, causal=True, k_offset=3, return_lse=True)  # rows 0-2 see no key
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3])) and torch.isinf(lse[:, :, :3]).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.equal(q.grad[:, :, :3], torch.zeros_like(q.grad[:, :, :3]))
    empty = gpu().attention(q[:, :, :0], k, v)
    assert empty.shape == (1, 2, 0, 16)
    no_keys, lse = gpu().attention(q, k[:, :, :0], v[:, :, :0], return_lse=True)
    assert torch.equal(no_keys, torch.zeros_like(no_keys)) and torch.isinf(lse).all()


def test_rope_calls_without_keys_or_queries():
    """RoPE rotates q and k before the kernels and the gradients back after them: with no key,
    the outputs and q's gradient are zeros (rotated zeros), k's is empty; with no query, the
    output is empty and k's gradient zeros."""
    q, k, v = (torch.randn(1, 2, n, 16, dtype=torch.bfloat16, requires_grad=True) for n in (5, 6, 6))
    rope = relpos.RoPE(dims=8)
    for qq, kk, vv in ((q, k[:, :, :0], v[:, :, :0]), (q[:, :, :0], k, v)):
        q.grad = k.grad = None
        out = gpu().attention(qq, kk, vv, rope)
        assert torch.equal(out, torch.zeros_like(out))
        out.float().sum().backward()
        assert torch.equal(q.grad, torch.zeros_like(q)) and torch.equal(k.grad, torch.zeros_like(k))


@pytest.mark.parametrize("bad, message", [
    (dict(q=torch.randn(1, 2, 4, 16, dtype=torch.float64)), "float64"),
    (dict(k=torch.randn(1, 3, 4, 16, dtype=torch.float32), v=torch.randn(1, 3, 4, 16, dtype=torch.float32)),
     "heads must divide"),
    (dict(v=torch.randn(1, 2, 5, 16, dtype=torch.float32)), "do not match"),
    (dict(key_padding=torch.zeros(1, 3, dtype=torch.bool)), "key_padding"),
    (dict(key_padding=torch.zeros(1, 4, dtype=torch.bool, device="meta")), "key_padding: on device meta"),
    (dict(scheme=relpos.RoPE(dims=24)), "rope.dims: must be even, >= 2 and <= d=16, got 24"),
    (dict(scheme=relpos.RoPE(dims=6), q=torch.randn(1, 2, 4, 5, dtype=torch.float32),
          k=torch.randn(1, 2, 4, 5, dtype=torch.float32)), "rope.dims: .* <= d=5, got 6"),
    (dict(scheme=relpos.TransformerXL(*(torch.zeros(s, dtype=torch.float32) for s in ((2, 16), (2, 16), (2, 16, 4))),
                                      clamp_len=-1)), "clamp_len"),
    # tables of the wrong size or device: the kernels would read past them
    (dict(scheme=relpos.DeBERTa(c2p=torch.zeros(2, 12, 16), position_buckets=8, max_relative_positions=40)),
     r"deberta.c2p: expected shape \(16, 16\) or \(1, 16, 16\) or \(2, 16, 16\), got \(2, 12, 16\)"),
    (dict(scheme=relpos.Shaw(k=2, wk=torch.zeros(3, 16))), r"shaw.wk: expected shape \(5, 16\)"),
    (dict(scheme=relpos.T5(torch.zeros(3, 32))), r"t5.table: expected shape \(2, 32\)"),
    (dict(scheme=relpos.ALiBi(torch.zeros(2, device="meta"))), "alibi.slopes: expected a torch tensor on q's device"),
    (dict(scheme=relpos.DeBERTa(p2c=torch.zeros(16, 16), position_buckets=1, max_relative_positions=40)),
     "position_buckets"),
    (dict(scheme=relpos.DeBERTa(position_buckets=8, max_relative_positions=40)), "deberta: give c2p, p2c or both"),
    # the log ratio (2^25 + 1) / 2^25 rounds to 1 in float32: the CPU core refuses it too
    (dict(scheme=relpos.DeBERTa(c2p=torch.zeros(4, 16), position_buckets=1 << 26,
                                max_relative_positions=(1 << 25) + 2)), "max_relative_positions"),
])
def test_bad_input_is_refused_by_name(bad, message):
    args = dict(q=torch.randn(1, 2, 4, 16, dtype=torch.float32), k=torch.randn(1, 2, 4, 16, dtype=torch.float32),
                v=torch.randn(1, 2, 4, 16, dtype=torch.float32), scheme=None, key_padding=None)
    args.update(bad)
    with pytest.raises(ValueError, match=message):
        gpu().attention(args["q"], args["k"], args["v"], args["scheme"], key_padding=args["key_padding"])


def test_info_names_the_gpu_path():
    line = relpos.info()["gpu"]
    assert line.startswith("relpos.gpu: Triton ") and triton.__version__ in line
    assert ("no CUDA device" in line) != torch.cuda.is_available()
