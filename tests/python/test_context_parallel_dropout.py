"""Attention dropout under context parallelism (gloo over loopback, 2 processes, float64).

Every rank seeds its generator differently; the group takes rank 0's draw. Ring attention then
equals one process's rt.attention on the whole sequence with rank 0's generator, to 1e-12
(out, dq, dk, dv and the scheme's gradients; causal zigzag shards with key padding, chunks in
pieces, cross-attention sharded on both sides), and so does the module with
context_parallel=True in training; each rank's generator advances as one call's draw. The
all-to-all strategy equals its documented mask: rank r's heads drawn with the offset moved by r.
"""
from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import relpos
import relpos.torch as rt
from relpos._autograd import draw_dropout_rng
from relpos.context_parallel import ring_attention, shard_sequence, ulysses_attention
from test_context_parallel import CHUNKS, POSITION, init, make_scheme, rank_rows, whole_problem

P = 0.3
WORLD = 2
SEED = 1000  # rank r seeds SEED + r: the group's draw is rank 0's


def grads_of(out, tensors, dout):
    return [out.detach(), *torch.autograd.grad(out, tensors, dout)]


def assert_close_all(got, want, where):
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12, msg=f"{where}: result {i}")


def ring_case(name, rank, kv_pieces=None):
    """Causal zigzag shards with key padding."""
    q, k, v, pad, dout, params = whole_problem(name, sum(CHUNKS[WORLD]), seed=len(name))
    rows, segments = rank_rows(CHUNKS[WORLD], rank, zigzag=True)
    leaves, whole_params = [x.clone().requires_grad_() for x in (q, k, v)], {n: p.clone().requires_grad_()
                                                                             for n, p in params.items()}
    torch.manual_seed(SEED)
    out = rt.attention(*leaves, make_scheme(name, whole_params), causal=True, key_padding=pad, q_offset=POSITION,
                       k_offset=POSITION, dropout_p=P)
    want = grads_of(out, [*leaves, *whole_params.values()], dout)
    want = [w[:, :, rows] for w in want[:4]] + want[4:]
    mine, my_params = [x[:, :, rows].clone().requires_grad_() for x in (q, k, v)], {n: p.clone().requires_grad_()
                                                                                    for n, p in params.items()}
    torch.manual_seed(SEED + rank)
    out = ring_attention(*mine, make_scheme(name, my_params), causal=True, key_padding=pad[:, rows],
                         q_segments=segments, k_segments=segments, kv_pieces=kv_pieces, dropout_p=P)
    assert_close_all(grads_of(out, [*mine, *my_params.values()], dout[:, :, rows]), want,
                     f"ring {name} pieces={kv_pieces} rank={rank}")


def cross_case(rank):
    """Queries and keys of two sequences, each sharded on its own boundaries (T5, no mask)."""
    Lq, Lk = 11, sum(CHUNKS[WORLD])
    q, _, _, _, dout, params = whole_problem("t5", Lq, seed=77)
    _, k, v, pad, _, _ = whole_problem("t5", Lk, seed=78)
    qrows = slice(rank * Lq // WORLD, (rank + 1) * Lq // WORLD)
    kstart = sum(CHUNKS[WORLD][:rank])
    krows = slice(kstart, kstart + CHUNKS[WORLD][rank])
    leaves, table = [x.clone().requires_grad_() for x in (q, k, v)], params["table"].clone().requires_grad_()
    torch.manual_seed(SEED)
    out = rt.attention(*leaves, relpos.T5(table, max_distance=12), key_padding=pad, q_offset=POSITION + 20,
                       k_offset=POSITION, dropout_p=P)
    dq, dk, dv, dtable = torch.autograd.grad(out, [*leaves, table], dout)
    want = [out.detach()[:, :, qrows], dq[:, :, qrows], dk[:, :, krows], dv[:, :, krows], dtable]
    mine = [q[:, :, qrows].clone().requires_grad_(), k[:, :, krows].clone().requires_grad_(),
            v[:, :, krows].clone().requires_grad_()]
    table = params["table"].clone().requires_grad_()
    torch.manual_seed(SEED + rank)
    out = ring_attention(*mine, relpos.T5(table, max_distance=12), key_padding=pad[:, krows],
                         q_offset=POSITION + 20 + qrows.start, k_offset=POSITION + kstart, dropout_p=P)
    assert_close_all(grads_of(out, [*mine, table], dout[:, :, qrows]), want, f"cross rank={rank}")


def module_case(rank):
    """The module with context_parallel=True in training: its rows of one process's training call
    with rank 0's generator; the parameters' gradients, summed over the group, that call's."""
    torch.manual_seed(0)
    sharded = rt.RelativeMultiheadAttention(16, 4, "t5", dropout=0.2, context_parallel=True).double().train()
    plain = rt.RelativeMultiheadAttention(16, 4, "t5", dropout=0.2).double().train()
    plain.load_state_dict(sharded.state_dict())
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    dy = torch.randn(2, 13, 16, dtype=torch.float64)
    torch.manual_seed(SEED)
    want = plain(x, causal=True)
    (want * dy).sum().backward()
    rows, segments = shard_sequence(x, rank, WORLD)
    torch.manual_seed(SEED + rank)
    got = sharded(rows, causal=True, segments=segments)
    (got * shard_sequence(dy, rank, WORLD)[0]).sum().backward()
    torch.testing.assert_close(got, shard_sequence(want, rank, WORLD)[0], rtol=1e-11, atol=1e-12)
    for (name, a), b in zip(sharded.named_parameters(), plain.parameters()):
        dist.all_reduce(a.grad)
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12, msg=f"module {name}")


def generator_advances_as_one_draw(rank):
    q = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    torch.manual_seed(SEED + rank)
    ring_attention(q, q, q, q_offset=4 * rank, k_offset=4 * rank, dropout_p=P)
    after_ring = torch.get_rng_state()
    torch.manual_seed(SEED + rank)
    draw_dropout_rng("cpu")
    assert torch.equal(after_ring, torch.get_rng_state())


def worker_ring(rank, world, store):
    init(rank, world, store)
    try:
        for name in ("t5", "shaw", "xl", "deberta"):
            ring_case(name, rank)
        ring_case("alibi", rank, kv_pieces=3)
        cross_case(rank)
        module_case(rank)
        generator_advances_as_one_draw(rank)
    finally:
        dist.destroy_process_group()


def worker_all_to_all(rank, world, store):
    """T5 with a per-head table, causal zigzag shards, key padding: rank r' computes heads
    [r' H / P, (r' + 1) H / P) with rank 0's [seed, offset + r']."""
    init(rank, world, store)
    try:
        q, k, v, pad, dout, params = whole_problem("t5", sum(CHUNKS[world]), seed=5)
        rows, segments = rank_rows(CHUNKS[world], rank, zigzag=True)
        leaves, table = [x.clone().requires_grad_() for x in (q, k, v)], params["table"].clone().requires_grad_()
        torch.manual_seed(SEED)
        rng = draw_dropout_rng("cpu")
        H, Hkv = q.shape[1], k.shape[1]
        parts = []
        for r in range(world):
            heads, kv_heads = slice(r * H // world, (r + 1) * H // world), slice(r * Hkv // world,
                                                                                (r + 1) * Hkv // world)
            parts.append(rt.attention(leaves[0][:, heads], leaves[1][:, kv_heads], leaves[2][:, kv_heads],
                                      relpos.T5(table[heads], max_distance=12), causal=True, key_padding=pad,
                                      q_offset=POSITION, k_offset=POSITION, dropout_p=P,
                                      dropout_rng=rng + torch.tensor([0, r])))
        want = grads_of(torch.cat(parts, 1), [*leaves, table], dout)
        want = [w[:, :, rows] for w in want[:4]] + want[4:]
        mine, my_table = [x[:, :, rows].clone().requires_grad_() for x in (q, k, v)], params["table"].clone()
        my_table.requires_grad_()
        torch.manual_seed(SEED + rank)
        out = ulysses_attention(*mine, relpos.T5(my_table, max_distance=12), causal=True, key_padding=pad[:, rows],
                                segments=segments, dropout_p=P)
        assert_close_all(grads_of(out, [*mine, my_table], dout[:, :, rows]), want, f"all-to-all rank={rank}")
    finally:
        dist.destroy_process_group()


def test_ring_attention_with_dropout_equals_one_process():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker_ring, args=(WORLD, os.path.join(tmp, "store")), nprocs=WORLD, join=True)


def test_all_to_all_with_dropout_draws_its_documented_mask():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker_all_to_all, args=(WORLD, os.path.join(tmp, "store")), nprocs=WORLD, join=True)
