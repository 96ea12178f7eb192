"""Ring attention (relpos.context_parallel) on torch.distributed with gloo over
loopback: 1 (nothing travels), 2 and 4 processes, each holding a chunk of one sequence, against one
process computing the whole sequence with rt.attention (itself checked against the
oracle), float64 to 1e-12: the output rows, dq, dk, dv of the rank's chunk and the
scheme's parameter gradients, for every scheme, causal and not, with key padding,
uneven contiguous chunks and the zigzag assignment, and cross-attention with queries
and keys sharded on their own boundaries; the gathered output; a second run gives
the same bits; a rank that leaves makes the
others raise instead of hanging; the module trains in a group of one; the all-to-all
strategy with ALiBi's own slopes in float32 and bfloat16."""
from __future__ import annotations

import datetime
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import relpos
import relpos.torch as rt
from relpos.context_parallel import gather_sequence, ring_attention, shard_sequence, ulysses_attention

B, H, HKV, D = 2, 4, 2, 5
CHUNKS = {1: [13], 2: [9, 14], 4: [5, 7, 3, 8]}
POSITION = 3  # absolute position of the sequence's first token
SCHEMES = ["none", "shaw", "t5", "alibi", "rope", "xl", "kerple", "kerple_power", "deberta"]


def make_scheme(name, params):
    return {
        "none": lambda: relpos.NoPosition(),
        "shaw": lambda: relpos.Shaw(k=4, wk=params["wk"], wv=params["wv"]),
        "t5": lambda: relpos.T5(params["table"], bidirectional=True, max_distance=12),
        "alibi": lambda: relpos.ALiBi(params["slopes"]),
        "rope": lambda: relpos.RoPE(dims=4),
        "xl": lambda: relpos.TransformerXL(params["u"], params["v"], params["w_r"]),
        "kerple": lambda: relpos.KERPLE(params["r1"], params["r2"]),
        "kerple_power": lambda: relpos.KERPLEPower(params["r1"], params["r2"]),
        # buckets 4, max 7: exact to +-2, logarithmic to +-6, edge rows past (the sequences span 22)
        "deberta": lambda: relpos.DeBERTa(c2p=params["c2p"], p2c=params["p2c"], position_buckets=4,
                                          max_relative_positions=7),
    }[name]()


def make_params(name, g):
    shapes = {"none": {}, "shaw": {"wk": (H, 9, D), "wv": (9, D)}, "t5": {"table": (H, 10)},
              "alibi": {"slopes": (H,)}, "rope": {}, "xl": {"u": (H, D), "v": (H, D), "w_r": (H, D, 6)},
              "kerple": {"r1": (H,), "r2": (H,)}, "kerple_power": {"r1": (H,), "r2": (H,)},
              "deberta": {"c2p": (H, 8, D), "p2c": (8, D)}}[name]
    params = {n: 0.5 * torch.randn(s, generator=g, dtype=torch.float64) for n, s in shapes.items()}
    if name == "alibi":
        params["slopes"] = torch.rand(H, generator=g, dtype=torch.float64) + 0.1
    if name in ("kerple", "kerple_power"):  # r1, r2 > 0 (and r2 <= 2 for the power)
        params = {n: torch.rand(H, generator=g, dtype=torch.float64) + 0.1 for n in ("r1", "r2")}
    return params


def whole_problem(name, L, seed, hkv=HKV):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, hkv, L, D, generator=g, dtype=torch.float64) for _ in range(2))
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[1, L // 3: L // 3 + 4] = True  # padding inside a chunk, not only at the end
    dout = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    return q, k, v, pad, dout, make_params(name, g)


def rank_rows(chunks, rank, zigzag):
    """This rank's rows of the whole sequence and their segments: shard_sequence's zigzag
    pieces, or the rank's contiguous chunk."""
    if zigzag:
        return shard_sequence(torch.arange(sum(chunks)), rank, len(chunks), dim=0, position=POSITION)
    start = sum(chunks[:rank])
    return torch.arange(start, start + chunks[rank]), [(POSITION + start, chunks[rank])]


def whole_sequence(name, causal, q, k, v, pad, dout, params):
    """The whole sequence in this process (the C++ kernels, float64): out and the gradients
    of q, k, v and the scheme's parameters."""
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    whole_params = {n: p.clone().requires_grad_() for n, p in params.items()}
    out = rt.attention(*leaves, make_scheme(name, whole_params), causal=causal, key_padding=pad,
                       q_offset=POSITION, k_offset=POSITION)
    return out, torch.autograd.grad(out, [*leaves, *whole_params.values()], dout)


def run_case(name, causal, chunks, rank, seed, zigzag=False, strategy="ring", hkv=HKV, kv_pieces=None):
    """Uneven contiguous chunks, or shard_sequence's zigzag pieces of the same length;
    ring attention (its key/value chunks travelling in kv_pieces pieces) or the
    all-to-all strategy."""
    q, k, v, pad, dout, params = whole_problem(name, sum(chunks), seed, hkv)
    rows, segments = rank_rows(chunks, rank, zigzag)
    out, expected = whole_sequence(name, causal, q, k, v, pad, dout, params)
    # this rank's chunk through the ring
    mine = [x[:, :, rows].clone().requires_grad_() for x in (q, k, v)]
    my_params = {n: p.clone().requires_grad_() for n, p in params.items()}
    if strategy == "ring":
        ring_out = ring_attention(*mine, make_scheme(name, my_params), causal=causal, key_padding=pad[:, rows],
                                  q_segments=segments, k_segments=segments, kv_pieces=kv_pieces)
    else:
        ring_out = ulysses_attention(*mine, make_scheme(name, my_params), causal=causal, key_padding=pad[:, rows],
                                     segments=segments)
    got = torch.autograd.grad(ring_out, [*mine, *my_params.values()], dout[:, :, rows])
    where = f"{strategy} {name} causal={causal} chunks={chunks} zigzag={zigzag} pieces={kv_pieces} rank={rank}"
    torch.testing.assert_close(gather_sequence(ring_out.detach(), segments, dim=2), out.detach(), rtol=1e-12,
                               atol=1e-12, msg=f"{where}: gathered")
    torch.testing.assert_close(ring_out, out[:, :, rows].detach(), rtol=1e-12, atol=1e-12, msg=where)
    for what, a, e in zip(["q", "k", "v"], got[:3], expected[:3]):
        torch.testing.assert_close(a, e[:, :, rows], rtol=1e-12, atol=1e-12, msg=f"{where}: d{what}")
    for what, a, e in zip(params, got[3:], expected[3:]):
        torch.testing.assert_close(a, e, rtol=1e-11, atol=1e-12, msg=f"{where}: d{what}")
    return [ring_out.detach(), *got]


def init(rank, world, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))


def worker_every_case(rank, world, store):
    init(rank, world, store)
    try:
        for i, name in enumerate(SCHEMES):
            for causal in (False, True):
                for zigzag in (False, True):
                    case_repeats_its_bits(name, causal, world, rank, 10 * i + causal, zigzag)
            cross_attention_case(name, rank, world)
    finally:
        dist.destroy_process_group()


def case_repeats_its_bits(name, causal, world, rank, seed, zigzag, **options):
    """run_case twice: both equal one process on the whole sequence, and to each other bit for bit."""
    first = run_case(name, causal, CHUNKS[world], rank, seed, zigzag, **options)
    again = run_case(name, causal, CHUNKS[world], rank, seed, zigzag, **options)
    assert all(torch.equal(a, b) for a, b in zip(first, again)), f"{name}: a second run differs"


def cross_attention_case(name, rank, world):
    """Queries of one sequence and keys of another, each sharded contiguously on its
    own (uneven) boundaries: no mask, key padding."""
    Lq, chunks_k = 11, CHUNKS[world]
    Lk = sum(chunks_k)
    q, _, _, _, dout, params = whole_problem(name, Lq, seed=77)
    _, k, v, pad, _, _ = whole_problem(name, Lk, seed=78)
    q_bounds = [round(i * Lq / world) for i in range(world + 1)]
    qrows = slice(q_bounds[rank], q_bounds[rank + 1])
    kstart = sum(chunks_k[:rank])
    krows = slice(kstart, kstart + chunks_k[rank])
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    whole_params = {n: p.clone().requires_grad_() for n, p in params.items()}
    out = rt.attention(*leaves, make_scheme(name, whole_params), key_padding=pad, q_offset=POSITION + 20,
                       k_offset=POSITION)
    expected = torch.autograd.grad(out, [*leaves, *whole_params.values()], dout)
    mine = [q[:, :, qrows].clone().requires_grad_(), k[:, :, krows].clone().requires_grad_(),
            v[:, :, krows].clone().requires_grad_()]
    my_params = {n: p.clone().requires_grad_() for n, p in params.items()}
    ring_out = ring_attention(*mine, make_scheme(name, my_params), key_padding=pad[:, krows],
                              q_offset=POSITION + 20 + q_bounds[rank], k_offset=POSITION + kstart)
    got = torch.autograd.grad(ring_out, [*mine, *my_params.values()], dout[:, :, qrows])
    where = f"cross {name} rank={rank}"
    torch.testing.assert_close(ring_out, out[:, :, qrows].detach(), rtol=1e-12, atol=1e-12, msg=where)
    for what, a, e in zip(["q", "k", "v"], got[:3], (expected[0][:, :, qrows], expected[1][:, :, krows],
                                                      expected[2][:, :, krows])):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12, msg=f"{where}: d{what}")
    for what, a, e in zip(params, got[3:], expected[3:]):
        torch.testing.assert_close(a, e, rtol=1e-11, atol=1e-12, msg=f"{where}: d{what}")


def worker_all_to_all(rank, world, store):
    """The all-to-all strategy: every scheme with Hkv = 2 on 2 processes; on 4, Hkv = 4
    (and Hkv = 2 refused: the heads must divide by the group)."""
    init(rank, world, store)
    try:
        hkv = 2 if world == 2 else 4
        for i, name in enumerate(SCHEMES):
            for causal in (False, True):
                for zigzag in (False, True):
                    case_repeats_its_bits(name, causal, world, rank, 10 * i + causal, zigzag, strategy="ulysses",
                                          hkv=hkv)
        if world == 4:
            q = torch.randn(1, 4, 3, 2, dtype=torch.float64)
            kv = torch.randn(1, 2, 3, 2, dtype=torch.float64)
            try:
                ulysses_attention(q, kv, kv)
                raise AssertionError("2 key heads over 4 processes were accepted")
            except ValueError as e:
                assert "must divide by the group size 4" in str(e), e
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 4])
def test_all_to_all_equals_one_process_on_the_whole_sequence(world):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker_all_to_all, args=(world, os.path.join(tmp, "store")), nprocs=world, join=True)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ring_attention_equals_one_process_on_the_whole_sequence(world):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker_every_case, args=(world, os.path.join(tmp, "store")), nprocs=world, join=True)


def worker_pieces(rank, world, store):
    """Key/value chunks travelling in 3 uneven pieces (a piece may straddle the two
    zigzag segments); too many pieces are refused."""
    init(rank, world, store)
    try:
        for i, name in enumerate(SCHEMES):
            for causal, zigzag in ((True, True), (False, False)):
                case_repeats_its_bits(name, causal, world, rank, 10 * i + causal, zigzag, kv_pieces=3)
        q = torch.randn(1, 2, 4, 3, dtype=torch.float64)
        try:
            ring_attention(q, q, q, q_offset=4 * rank, k_offset=4 * rank, kv_pieces=5)
            raise AssertionError("5 pieces of 4 keys were accepted")
        except ValueError as e:
            assert "kv_pieces: must be in [1, 4]" in str(e), e
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ring_attention_in_pieces_equals_one_process(world):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker_pieces, args=(world, os.path.join(tmp, "store")), nprocs=world, join=True)


def worker_bfloat16(rank, world, store):
    """bfloat16 chunks through the ring and the all-to-all strategy: out and every
    gradient equal one process's bfloat16 call on the whole sequence to within two
    bfloat16 steps of the largest entry (both compute in float32 and round once; the
    whole call's backward reads its out rounded to bfloat16, the ring's its float32
    out, so their float32 values differ by a little more than rounding)."""
    init(rank, world, store)
    try:
        for name in ("t5", "shaw", "xl"):
            q, k, v, pad, dout, params = whole_problem(name, sum(CHUNKS[world]), 50)
            q, k, v, dout = (x.bfloat16() for x in (q, k, v, dout))
            params = {n: p.bfloat16() for n, p in params.items()}
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            whole_params = {n: p.clone().requires_grad_() for n, p in params.items()}
            out = rt.attention(*leaves, make_scheme(name, whole_params), causal=True, key_padding=pad,
                               q_offset=POSITION, k_offset=POSITION)
            expected = [out, *torch.autograd.grad(out, [*leaves, *whole_params.values()], dout)]
            start = sum(CHUNKS[world][:rank])
            rows = torch.arange(start, start + CHUNKS[world][rank])
            segments = [(POSITION + start, len(rows))]
            for strategy in ("ring", "ulysses"):
                mine = [x[:, :, rows].clone().requires_grad_() for x in (q, k, v)]
                my_params = {n: p.clone().requires_grad_() for n, p in params.items()}
                attend = ring_attention if strategy == "ring" else ulysses_attention
                extra = dict(q_segments=segments, k_segments=segments) if strategy == "ring" else dict(segments=segments)
                got_out = attend(*mine, make_scheme(name, my_params), causal=True, key_padding=pad[:, rows], **extra)
                got = [got_out, *torch.autograd.grad(got_out, [*mine, *my_params.values()], dout[:, :, rows])]
                for what, a, e in zip(["out", "dq", "dk", "dv", *params], got, expected):
                    e = e if what in params else e[:, :, rows]
                    assert a.dtype == torch.bfloat16, f"{strategy} {name} {what}: {a.dtype}"
                    tolerance = 2 ** -6 * max(1.0, float(e.float().abs().max()))
                    error = float((a.float() - e.float()).abs().max())
                    assert error <= tolerance, f"{strategy} {name} {what} rank {rank}: error {error}, tolerance {tolerance}"
    finally:
        dist.destroy_process_group()


def test_bfloat16_chunks_equal_one_process_within_rounding():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker_bfloat16, args=(2, os.path.join(tmp, "store")), nprocs=2, join=True)


def worker_module_alone(rank, world, store):
    """The module with context_parallel=True in a group of one process, zigzag shards:
    its output and every parameter's gradient equal the same module's without it."""
    init(rank, world, store)
    try:
        for scheme in ("shaw", "t5", "alibi", "xl", "kerple", "deberta"):
            torch.manual_seed(0)
            alone = rt.RelativeMultiheadAttention(16, 4, scheme, context_parallel=True).double()
            plain = rt.RelativeMultiheadAttention(16, 4, scheme).double()
            plain.load_state_dict(alone.state_dict())
            x = torch.randn(2, 11, 16, dtype=torch.float64)
            rows, segments = shard_sequence(x, rank, world)
            assert segments == [(0, 6), (6, 5)]  # two pieces: the zigzag's segments, in order
            got, want = alone(rows, causal=True, segments=segments), plain(x, causal=True)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=scheme)
            dy = torch.randn_like(want)
            (got * dy).sum().backward()
            (want * dy).sum().backward()
            for (name, a), b in zip(alone.named_parameters(), plain.parameters()):
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-11, atol=1e-12, msg=f"{scheme} {name}")
    finally:
        dist.destroy_process_group()


def test_the_module_trains_in_a_group_of_one():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker_module_alone, args=(1, os.path.join(tmp, "store")), nprocs=1, join=True)


def worker_all_to_all_alibi(rank, world, store):
    """ALiBi's own slopes (none given) through the all-to-all strategy, 12 heads (slopes
    that are not powers of two) split over 2 processes: float32 equals rt.attention on
    the whole sequence; bfloat16 gives exactly the bfloat16 rounding of that float32
    call (the paper's slopes unrounded, as one bfloat16 call on all heads computes them),
    equal to rt.attention's bfloat16 call within its rounding, gradients within two
    bfloat16 steps."""
    init(rank, world, store)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(5)
            q, k, v, dout = (torch.randn(2, 12, 40, 4, generator=g).to(dtype) for _ in range(4))
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            out = rt.attention(*leaves, relpos.ALiBi(), causal=True)
            expected = [out, *torch.autograd.grad(out, leaves, dout)]
            rows, segments = shard_sequence(torch.arange(40), rank, world, dim=0)
            mine = [x[:, :, rows].clone().requires_grad_() for x in (q, k, v)]
            got_out = ulysses_attention(*mine, relpos.ALiBi(), causal=True, segments=segments)
            got = [got_out, *torch.autograd.grad(got_out, mine, dout[:, :, rows])]
            if dtype == torch.bfloat16:
                single = rt.attention(q.float(), k.float(), v.float(), relpos.ALiBi(), causal=True)
                assert torch.equal(got_out, single.to(dtype)[:, :, rows]), "bfloat16: not the float32 call rounded"
            for what, a, e in zip(["out", "dq", "dk", "dv"], got, expected):
                e = e[:, :, rows]
                assert a.dtype == dtype, f"{dtype} {what}: {a.dtype}"
                steps = 0 if dtype == torch.float32 else 2 ** -6
                tolerance = max(1e-6, steps) * max(1.0, float(e.float().abs().max()))
                error = float((a.float() - e.float()).abs().max())
                assert error <= tolerance, f"{dtype} {what} rank {rank}: error {error}, tolerance {tolerance}"
    finally:
        dist.destroy_process_group()


def test_all_to_all_with_alibi_slopes_of_its_own_in_float32_and_bfloat16():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker_all_to_all_alibi, args=(2, os.path.join(tmp, "store")), nprocs=2, join=True)


def worker_one_leaves(rank, world, store):
    init(rank, world, store)
    if rank == 1:
        return  # leaves before the ring: rank 0 must not wait forever
    q = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    ring_attention(q, q, q, relpos.ALiBi(), q_offset=0, k_offset=0)


def test_a_rank_that_leaves_makes_the_others_raise():
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        with pytest.raises(Exception):
            mp.spawn(worker_one_leaves, args=(2, os.path.join(tmp, "store")), nprocs=2, join=True)
    assert time.monotonic() - start < 120


def test_ring_attention_needs_an_initialised_group():
    if dist.is_initialized():
        pytest.fail("the test process must not hold a process group")
    q = torch.randn(1, 1, 2, 2)
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        ring_attention(q, q, q)


@pytest.mark.parametrize("scheme", ["shaw", "xl"])
def test_torchrun_example_trains_with_the_losses_of_one_process(scheme, tmp_path):
    """examples/context_parallel.py under torchrun with 2 processes (the module with
    context_parallel=True, zigzag shards, summed gradients, AdamW) gives the losses of
    one process on the whole sequences, float64."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "context_parallel.py"
    common = [str(example), "--scheme", scheme, "--steps", "3", "--length", "64", "--dtype", "float64"]
    torchrun = Path(sys.executable).with_name("torchrun")
    # --standalone: a free port for the rendezvous, not 29500 (other test processes may run beside it)
    subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", *common, "--json",
                    str(tmp_path / "two.json")], check=True, capture_output=True, timeout=300)
    subprocess.run([sys.executable, *common, "--json", str(tmp_path / "one.json")], check=True,
                   capture_output=True, timeout=300)
    two, one = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("two", "one"))
    assert two["processes"] == 2 and one["processes"] == 1
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-10, abs=1e-10)
    assert one["losses"][-1] < one["losses"][0]
