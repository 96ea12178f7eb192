"""Ring attention's steps on relpos.gpu's kernels, the path CUDA tensors take, run on CPU
tensors through Triton's interpreter over gloo (NCCL needs GPUs): 2 processes, every
scheme the GPU kernels serve, causal (zigzag chunks) or not (contiguous ones), whole and
pieced key chunks, against one process computing the whole sequence in float64 on the
C++ kernels; and a second run gives the same bits. With attention dropout, the ranks seeded
differently, the GPU steps draw the whole sequence's mask with rank 0's rng, as the C++
kernels of one process do.

The processes send CPU tensors to the GPU steps by replacing
relpos.torch.context_parallel._steps_for, which picks them by device."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import relpos
import relpos.torch as rt

pytest.importorskip("triton")
assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest (conftest.py sets TRITON_INTERPRET=1)"

from relpos.context_parallel import gather_sequence, ring_attention  # noqa: E402
from test_context_parallel import (CHUNKS, POSITION, SCHEMES, init, make_scheme, rank_rows, whole_problem,  # noqa: E402
                                   whole_sequence)


# relpos.gpu has kernels for every scheme.
GPU_SCHEMES = list(SCHEMES)


def gpu_ring_case(name, causal, rank, world, seed, zigzag, kv_pieces=None):
    q, k, v, pad, dout, params = whole_problem(name, sum(CHUNKS[world]), seed)
    rows, segments = rank_rows(CHUNKS[world], rank, zigzag)
    out, expected = whole_sequence(name, causal, q, k, v, pad, dout, params)
    mine = [x[:, :, rows].float().requires_grad_() for x in (q, k, v)]
    my_params = {n: p.float().requires_grad_() for n, p in params.items()}
    ring_out = ring_attention(*mine, make_scheme(name, my_params), causal=causal, key_padding=pad[:, rows],
                              q_segments=segments, k_segments=segments, kv_pieces=kv_pieces)
    got = torch.autograd.grad(ring_out, [*mine, *my_params.values()], dout[:, :, rows].float())
    where = f"gpu steps {name} causal={causal} zigzag={zigzag} pieces={kv_pieces} rank={rank}"

    def close(a, e, what):  # float32 kernels against the float64 whole
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=2e-5 * max(1.0, e.abs().max().item()),
                                   msg=f"{where}: {what}")

    close(gather_sequence(ring_out.detach(), segments, dim=2), out.detach(), "gathered out")
    for what, a, e in zip(["q", "k", "v"], got[:3], expected[:3]):
        close(a, e[:, :, rows], f"d{what}")
    for what, a, e in zip(params, got[3:], expected[3:]):
        close(a, e, f"d{what}")
    return [ring_out.detach(), *got]


def gpu_ring_dropout_case(rank, world):
    """T5, causal zigzag chunks with padding, dropout 0.3: rank r seeds 50 + r, and the group
    draws rank 0's mask; one process on the C++ kernels seeds 50."""
    q, k, v, pad, dout, params = whole_problem("t5", sum(CHUNKS[world]), 3)
    rows, segments = rank_rows(CHUNKS[world], rank, True)
    leaves, table = [x.clone().requires_grad_() for x in (q, k, v)], params["table"].clone().requires_grad_()
    torch.manual_seed(50)
    out = rt.attention(*leaves, relpos.T5(table, max_distance=12), causal=True, key_padding=pad,
                       q_offset=POSITION, k_offset=POSITION, dropout_p=0.3)
    expected = [out.detach()[:, :, rows], *(g[:, :, rows] for g in torch.autograd.grad(out, leaves, dout))]
    mine = [x[:, :, rows].float().requires_grad_() for x in (q, k, v)]
    torch.manual_seed(50 + rank)
    ring_out = ring_attention(*mine, relpos.T5(table.detach().float(), max_distance=12), causal=True,
                              key_padding=pad[:, rows], q_segments=segments, k_segments=segments, dropout_p=0.3)
    got = [ring_out.detach(), *torch.autograd.grad(ring_out, mine, dout[:, :, rows].float())]
    for what, a, e in zip(["out", "dq", "dk", "dv"], got, expected):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=2e-5 * max(1.0, e.abs().max().item()),
                                   msg=f"gpu steps with dropout rank={rank}: {what}")


def worker_gpu_steps(rank, world, store):
    from relpos.torch import context_parallel

    context_parallel._steps_for = lambda q: context_parallel._GpuSteps
    init(rank, world, store)
    try:
        for i, name in enumerate(GPU_SCHEMES):  # causal and zigzag in rotation: each kind of call for every scheme
            gpu_ring_case(name, bool(i % 2), rank, world, seed=10 * i, zigzag=bool(i % 2))
        gpu_ring_case("shaw", True, rank, world, seed=5, zigzag=False, kv_pieces=3)
        first = gpu_ring_case("t5", True, rank, world, seed=6, zigzag=True, kv_pieces=2)
        again = gpu_ring_case("t5", True, rank, world, seed=6, zigzag=True, kv_pieces=2)
        assert all(torch.equal(a, b) for a, b in zip(first, again)), "a second run differs"
        gpu_ring_dropout_case(rank, world)
    finally:
        dist.destroy_process_group()


def test_ring_attention_on_the_gpu_kernels_equals_one_process():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker_gpu_steps, args=(2, os.path.join(tmp, "store")), nprocs=2, join=True)
