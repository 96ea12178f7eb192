"""Positions on a grid (SAM, Swin) and segments in relpos.gpu's Triton kernels, run in Triton's
interpreter as test_gpu.py runs them (docs/design.md, section 1, "Positions on a grid" and
"Segments"; docs/gpu.md):

* SAM on equal grids, pooled keys and pooled queries, grids narrower than a key tile (the dq
  kernel sums dS's columns by a 0/1 product) and at least as wide (dS added by column), in
  16- and 64-key tiles; Swin's 7 x 7 windows with the shifted windows' regions as segments;
  segments on a plain and a T5 call, with dropout too: the output and every gradient (q, k, v,
  rel_h, rel_w, Swin's table) in float32 against the float64 oracle and the C++ kernels;
* segments that mask nothing are the call without segments bit for bit, one tensor of ids is
  the pair, the gradients repeat bit for bit; bad arguments are refused by name.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest (conftest.py sets TRITON_INTERPRET=1)"

import relpos  # noqa: E402
from harness import Case, assert_close, assert_matches_oracle, make_problem, run_oracle, run_relpos  # noqa: E402
from test_gpu import gpu, run_gpu  # noqa: E402

SQUARE_64 = (64, 64)  # the GPU's tiles: a whole 7 x 7 window in one tile pair


@pytest.fixture
def tiles(monkeypatch):
    """Sets the interpreter's tiles (BM, BN) for the test."""
    from relpos.gpu import config

    def use(shape):
        monkeypatch.setattr(config, "INTERPRETER", config.Launch(*shape, 4, 1))

    return use


def swin_regions(images: int, side: int, window: int, shift: int) -> np.ndarray:
    """Swin's shifted-window attention mask as segment ids, ``(images * windows, window^2)``: the
    image's cells labelled by the regions transformers' SwinLayer.get_attn_mask slices out
    (``[0, -window)``, ``[-window, -shift)``, ``[-shift, side)`` per axis), cut into windows row by
    row; two cells of a window see each other where their labels agree."""
    axis = np.digitize(np.arange(side), [side - window, side - shift])
    labels = axis[:, None] * 3 + axis[None, :]
    n = side // window
    windows = labels.reshape(n, window, n, window).transpose(0, 2, 1, 3).reshape(n * n, window * window)
    return np.tile(windows, (images, 1))


def float32(*shape):
    return torch.zeros(*shape, dtype=torch.float32)


C = Case
SAM, SWIN = "sam", "swin"
CASES = [
    # SAM: key grid narrower than the 16-key tiles (columns summed by a 0/1 product)
    (C("grid-sam-6x8", SAM, Lq=48, Lk=48, opts=dict(q_height=6, q_width=8)), None, None),
    # at least a tile wide, tiles wrapping across grid rows; causal, padded, offsets (positions mask only)
    (C("grid-sam-3x18-causal-pad", SAM, Lq=54, Lk=54, causal=True, padding="random", q_offset=3, k_offset=3,
       opts=dict(q_height=3, q_width=18)), None, None),
    (C("grid-sam-pooled-keys-8x8-4x4", SAM, Lq=64, Lk=16, opts=dict(q_height=8, q_width=8, k_height=4, k_width=4)),
     None, None),
    (C("grid-sam-pooled-queries-4x4-8x8", SAM, Lq=16, Lk=64, padding="batch",
       opts=dict(q_height=4, q_width=4, k_height=8, k_width=8)), None, None),
    # 64-key tiles: keys 3 wide span 22 grid rows of a tile (the rows' 0/1 product 32 wide), each axis
    # pooled its own way (queries scaled on y, keys on x)
    (C("grid-sam-64-tiles-8x12-24x3", SAM, B=1, Lq=96, Lk=72, opts=dict(q_height=8, q_width=12, k_height=24,
                                                                         k_width=3)), SQUARE_64, None),
    # a grid wider than a 64-key tile (dS added by column, tiles wrapping), with dropout and segments
    (C("grid-sam-64-tiles-2x70-dropout-segments", SAM, B=1, Lq=140, Lk=140, segment_length=50, dropout_p=0.3,
       opts=dict(q_height=2, q_width=70)), SQUARE_64, None),
    # exactly a 16-key tile wide: the switch between the columns' two sums (dS as it is)
    (C("grid-sam-3x16-causal", SAM, Lq=48, Lk=48, causal=True, opts=dict(q_height=3, q_width=16)), None, None),
    # one key per grid row: a 64-key tile spans 64 grid rows (the rows' 0/1 product 64 wide)
    (C("grid-sam-64-tiles-40x1", SAM, B=1, Lq=40, Lk=40, padding="random", opts=dict(q_height=40, q_width=1)),
     SQUARE_64, None),
    # Swin: a 12 x 12 window over several tiles of 64 queries and 16 keys (BM != BN)
    (C("grid-swin-12x12-tiles-64x16", SWIN, B=2, H=2, Lq=144, Lk=144, causal=True, padding="random",
       opts=dict(window_height=12, window_width=12)), (64, 16), None),
    # Swin: 7 x 7 windows of two 14 x 14 images, shifted by 3: the regions as segments
    (C("grid-swin-7x7-shifted", SWIN, B=4, H=2, Lq=49, Lk=49, opts=dict(window_height=7, window_width=7)), None,
     swin_regions(1, 14, 7, 3)),
    (C("grid-swin-7x7-shifted-64-tiles-dropout", SWIN, B=8, H=3, Lq=49, Lk=49, dropout_p=0.2,
       opts=dict(window_height=7, window_width=7)), SQUARE_64, swin_regions(2, 14, 7, 3)),
    (C("grid-swin-4x10-causal-pad", SWIN, B=2, H=2, Lq=40, Lk=40, causal=True, padding="random",
       opts=dict(window_height=4, window_width=10)), None, None),
    # segments on a plain and a T5 call (packed documents), with dropout too
    (C("seg-none-causal-dropout", "none", Lq=40, Lk=40, causal=True, segment_length=7, dropout_p=0.3), None, None),
    (C("seg-t5-cross-pad", "t5", Lq=21, Lk=50, q_offset=29, padding="random", segment_length=9,
       opts=dict(num_buckets=16, max_distance=40)), None, None),
    (C("seg-t5-causal-dropout", "t5", Lq=37, Lk=37, causal=True, segment_length=6, dropout_p=0.2,
       opts=dict(num_buckets=16, max_distance=40, bidirectional=False)), None, None),
]


def problem(case, regions):
    pb = make_problem(case)
    if regions is not None:  # the same ids for queries and keys (one window's cells)
        pb.segments = lambda: (regions, regions)
    return pb


@pytest.mark.parametrize("case, shape, regions", CASES, ids=[c.id for c, _, _ in CASES])
def test_grids_and_segments_match_the_oracle_and_the_cpu_kernels(case, shape, regions, tiles):
    """Forward and every gradient in float32 against the float64 oracle, and against the C++
    kernels (float32, the same record, segments and dropout) within two float32 tolerances."""
    if shape:
        tiles(shape)
    pb = problem(case, regions)
    if pb.segments() is not None:
        q_ids, k_ids = pb.segments()
        assert (q_ids[:, :, None] != k_ids[:, None, :]).any()  # the segments mask some pairs
    got = run_gpu(pb)
    assert_matches_oracle(got, run_oracle(pb), np.float32)
    for name, ref in run_relpos(pb, np.float32).items():
        finite = np.isfinite(ref)
        assert_close(name, got[name], ref, np.float32, magnitude=2 * max(float(np.abs(ref[finite]).max()), 1.0))


def _call(scheme_of, segments=None, rng=None, H=2, Lq=32, Lk=32, d=16, **kw):
    """(out, lse, dq, dk, dv, grads of the scheme's tensors) of one float32 call."""
    g = torch.Generator().manual_seed(21)
    q = torch.randn(2, H, Lq, d, generator=g).float().requires_grad_()
    k, v = (torch.randn(2, H, Lk, d, generator=g).float().requires_grad_() for _ in range(2))
    tensors = [t.float().requires_grad_() for t in scheme_of(g)[1]]
    extra = {} if segments is None else {"segments": segments}
    if rng is not None:
        extra.update(dropout_p=0.25, dropout_rng=rng)
    out, lse = gpu().attention(q, k, v, scheme_of(g)[0](*tensors), return_lse=True, **extra, **kw)
    out.backward(torch.randn(out.shape, generator=g).float())
    return [out.detach(), lse, q.grad, k.grad, v.grad, *(t.grad for t in tensors)]


def _sam(g):
    return (lambda h, w: relpos.SAM(h, w, q_height=4, q_width=8)), [torch.randn(7, 16, generator=g),
                                                                    torch.randn(15, 16, generator=g)]


def _swin(g):
    return (lambda t: relpos.Swin(t, window_height=4, window_width=8)), [torch.randn(2, 105, generator=g)]


def _t5(g):
    return (lambda t: relpos.T5(t, max_distance=30)), [torch.randn(2, 16, generator=g)]


@pytest.mark.parametrize("scheme_of", [_sam, _swin, _t5], ids=["sam", "swin", "t5"])
def test_segments_that_mask_nothing_are_the_call_without_bit_for_bit(scheme_of):
    """One segment for every row: the kernels' arithmetic is the call's without segments, so every
    result has its bits (the mask adds no other operation); with dropout too."""
    same = torch.full((2, 32), 7, dtype=torch.int16)
    for extra in ({}, {"rng": torch.tensor([-11, 5])}) if scheme_of is _t5 else ({},):
        for a, b in zip(_call(scheme_of, **extra), _call(scheme_of, segments=same, **extra)):
            assert torch.equal(a, b)


def test_one_tensor_is_the_pair_and_the_gradients_repeat():
    ids = torch.tensor([[0] * 20 + [1] * 12, [4] * 9 + [2] * 23], dtype=torch.int32)
    for a, b in zip(_call(_swin, segments=ids), _call(_swin, segments=(ids, ids.long()))):
        assert torch.equal(a, b)
    for a, b in zip(_call(_sam, segments=ids), _call(_sam, segments=ids)):
        assert torch.equal(a, b)


def test_each_segment_is_its_own_call():
    """A row of segments 0 | 1 computes what each segment's own call does (SAM's grid is the
    whole call's: a segment is a band of its rows)."""
    ids = torch.tensor([[0] * 13 + [1] * 19] * 2)
    out = _call(_t5, segments=ids)[0]
    g = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(2, 2, 32, 16, generator=g).float() for _ in range(3))
    table = torch.randn(2, 16, generator=g).float()
    for rows in (slice(0, 13), slice(13, 32)):
        alone = gpu().attention(q[:, :, rows], k[:, :, rows], v[:, :, rows], relpos.T5(table, max_distance=30),
                                q_offset=rows.start, k_offset=rows.start)
        torch.testing.assert_close(out[:, :, rows], alone, rtol=1e-6, atol=1e-6)


def _args(**bad):
    args = dict(q=float32(1, 2, 12, 16), k=float32(1, 2, 12, 16), v=float32(1, 2, 12, 16), scheme=None, segments=None)
    args.update(bad)
    return args


@pytest.mark.parametrize("bad, message", [
    (dict(scheme=relpos.SAM(torch.zeros(5, 16), torch.zeros(9, 16), q_height=3, q_width=5)),
     r"sam.q_height x sam.q_width: 3 x 5 = 15 cells, but q has Lq=12 rows \(one per cell, row by row\)"),
    (dict(scheme=relpos.SAM(torch.zeros(5, 16), torch.zeros(7, 16), q_height=3, q_width=4, k_height=2, k_width=5)),
     "sam.k_height x sam.k_width: 2 x 5 = 10 cells, but k has Lk=12 rows"),
    (dict(scheme=relpos.SAM(torch.zeros(5, 16), torch.zeros(9, 16), q_height=3, q_width=4)),
     r"sam.rel_w: expected shape \(7, 16\), got \(9, 16\)"),
    (dict(scheme=relpos.SAM(torch.zeros(5, 16, device="meta"), torch.zeros(7, 16), q_height=3, q_width=4)),
     "sam.rel_h: expected a torch tensor on q's device"),
    (dict(scheme=relpos.Swin(torch.zeros(2, 30), window_height=3, window_width=4)),
     r"swin.table: expected shape \(2, 35\), got \(2, 30\)"),
    (dict(scheme=relpos.Swin(torch.zeros(2, 35), window_height=3, window_width=4), k=float32(1, 2, 9, 16),
          v=float32(1, 2, 9, 16)), "swin.window_height x swin.window_width: 3 x 4 = 12 cells, but k has Lk=9"),
    (dict(segments=float32(1, 12)), "q_segments: expected a tensor of integer segment ids, got torch.float32"),
    (dict(segments=torch.zeros(1, 12, dtype=torch.bool)), "q_segments: expected a tensor of integer segment ids"),
    (dict(segments=(torch.zeros(1, 12, dtype=torch.int32), np.zeros((1, 12), np.int32))),
     "k_segments: expected a tensor of integer segment ids, got ndarray"),
    (dict(segments=(torch.zeros(1, 12, dtype=torch.int32), torch.zeros(1, 11, dtype=torch.int32))),
     r"k_segments: expected shape \(1, 12\), got \(1, 11\)"),
    (dict(segments=torch.zeros(2, 12, dtype=torch.int32)), r"q_segments: expected shape \(1, 12\)"),
    (dict(segments=(torch.zeros(1, 12, dtype=torch.int32),) * 3), "segments: expected a tensor of ids or a pair"),
    (dict(segments=torch.zeros(1, 12, dtype=torch.int32), k=float32(1, 2, 9, 16), v=float32(1, 2, 9, 16)),
     "segments: one tensor of ids serves Lq == Lk only"),
    (dict(segments=torch.zeros(1, 12, dtype=torch.int32, device="meta")), "q_segments: on device meta"),
])
def test_bad_arguments_are_refused_by_name(bad, message):
    a = _args(**bad)
    with pytest.raises(ValueError, match=message):
        gpu().attention(a["q"], a["k"], a["v"], a["scheme"], segments=a["segments"])
    if a["segments"] is not None and a["scheme"] is None:  # the gradients' entry checks them alike
        with pytest.raises(ValueError, match=message):
            gpu().gradients(a["q"], a["k"], a["v"], a["q"], a["q"][..., 0], a["q"], segments=a["segments"])


def test_grid_offsets_are_sams_get_rel_pos():
    """The per-axis offset index the GPU path gathers by is transformers' get_rel_pos's, in float32
    (as the CPU core's grid_offset_index), on equal, pooled and uneven axes."""
    from relpos.gpu.terms import grid_offsets

    for q_size, k_size in ((64, 64), (14, 64), (64, 14), (7, 3), (3, 7), (12, 5), (5, 12), (1, 9)):
        expected = torch_oracle_index(q_size, k_size)
        assert torch.equal(grid_offsets(q_size, k_size), expected), (q_size, k_size)


def torch_oracle_index(q_size: int, k_size: int) -> torch.Tensor:
    """transformers' get_rel_pos index with torch's default float32 (the tests run in float64)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        import torch_oracle

        return torch_oracle.sam_rel_index(q_size, k_size)
    finally:
        torch.set_default_dtype(previous)


def test_compiled_fullgraph_with_a_grid_and_segments_equals_eager():
    """SAM's per-row scores are torch operations before the op, the segments one more tensor
    argument: torch.compile(fullgraph=True) traces both and computes the eager call's bits."""
    ids = torch.tensor([[0] * 10 + [1] * 22, [3] * 32])

    def call(q, k, v, h, w):
        return gpu().attention(q, k, v, relpos.SAM(h, w, q_height=4, q_width=8), segments=ids)

    def run(fn):
        g = torch.Generator().manual_seed(3)
        leaves = [torch.randn(*s, generator=g).float().requires_grad_() for s in ((2, 2, 32, 16),) * 3 +
                  ((7, 16), (15, 16))]
        out = fn(*leaves)
        out.backward(torch.ones_like(out))
        return [out.detach(), *(x.grad for x in leaves)]

    for a, b in zip(run(call), run(torch.compile(call, fullgraph=True, backend="aot_eager"))):
        assert torch.equal(a, b)
