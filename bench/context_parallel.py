"""Context parallelism (relpos.context_parallel.ring_attention) measured on this machine:

    .venv/bin/python bench/context_parallel.py               # writes bench/results/context_parallel.md and .json
    .venv/bin/python bench/context_parallel.py --quick       # small sizes: checks that it runs

Three measurements, float32, B=1, H=8, d=64, causal, zigzag shards, gloo over loopback,
for plain attention, Shaw K+V (k=64) and Transformer-XL:

1. Longest trainable sequence under a memory budget: for P = 1, 2, 4 processes (ring
   attention with kv_pieces: as many pieces of at least 512 keys as a rank's chunk
   holds, at most 16), L grows
   by 1.25x (multiples of 64) from --start until one forward+backward step needs more than
   --budget-mb on some process (peak resident memory during the step over the resident
   memory before it, after a warm-up step, per process: /proc/self/clear_refs then VmHWM,
   malloc returning blocks over 1 MiB to the system, as bench/peers.py measures); the
   longest L that fitted is reported.
2. Time per forward+backward step at --time-length: P = 2 processes with one thread each
   (ring attention, and the all-to-all strategy) against one process with two threads,
   the same cores. On one machine the processes
   share the cores and talk through loopback; this measures what the ring adds (its extra
   calls, merges and copies), not the speed-up of more machines.
3. Communication hidden behind compute in the P = 2 forward: the time of the ring's
   transfers alone (T_comm: the same sends and receives, no attention), of its attention
   calls alone (T_calc: the same relpos calls, no transfers), of the ring (T_ring), and
   the time the ring spent waiting for its transfers to finish (T_wait, timed inside
   the ring: the communication it did not hide); hidden = 1 - T_wait / T_comm.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import relpos
from relpos.context_parallel import _Ring, ring_attention, shard_sequence, ulysses_attention

H, D, SHAW_K, XL_POS = 8, 64, 64, 64
SCHEMES = ("none", "shaw", "xl")


def scheme_of(name: str):
    g = torch.Generator().manual_seed(0)
    if name == "shaw":
        return relpos.Shaw(SHAW_K, wk=torch.randn(2 * SHAW_K + 1, D, generator=g),
                           wv=torch.randn(2 * SHAW_K + 1, D, generator=g))
    if name == "xl":
        return relpos.TransformerXL(torch.randn(H, D, generator=g), torch.randn(H, D, generator=g),
                                    0.1 * torch.randn(H, D, XL_POS, generator=g))
    return relpos.NoPosition()


def resident_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def shards(L: int, rank: int, world: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    whole = [torch.randn(1, H, L, D, generator=g) for _ in range(4)]  # q, k, v, dout
    if world == 1:
        return whole, [(0, L)]
    parts = [shard_sequence(x, rank, world, dim=2) for x in whole]
    return [p[0] for p in parts], parts[0][1]


def step(q, k, v, dout, scheme, segments, world, strategy="ring", kv_pieces=None):
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    if world == 1:
        out = relpos.torch.attention(*leaves, scheme, causal=True)
    elif strategy == "ring":
        out = ring_attention(*leaves, scheme, causal=True, q_segments=segments, k_segments=segments,
                             kv_pieces=kv_pieces)
    else:
        out = ulysses_attention(*leaves, scheme, causal=True, segments=segments)
    out.backward(dout)


def lean_pieces(L: int, world: int):
    """The ring's most memory-lean default-sized pieces for the memory search: as
    many pieces of at least 512 keys as a rank's chunk holds, at most 16."""
    return None if world == 1 else max(1, min(16, (L // world) // 512))


def worker(rank, world, store, job, results):
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=600))
    torch.set_num_threads(job["threads"])
    import relpos.torch  # noqa: F401  (the op, in this process)
    scheme = scheme_of(job["scheme"])
    result = {}
    if job["kind"] == "memory":  # lengths in turn until one does not fit; every rank stops together
        (wq, wk, wv, wd), wsegments = shards(64 * world, rank, world)
        step(wq, wk, wv, wd, scheme, wsegments, world)  # libraries, JIT kernels, gloo buffers: not the step's
        result["peaks"] = []
        for L in job["lengths"]:
            (q, k, v, dout), segments = shards(L, rank, world)
            before = resident_kb("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")
            step(q, k, v, dout, scheme, segments, world, kv_pieces=lean_pieces(L, world))
            peak = torch.tensor([(resident_kb("VmHWM") - before) / 1024])
            if world > 1:
                dist.all_reduce(peak, op=dist.ReduceOp.MAX)
            result["peaks"].append((L, peak.item()))
            del q, k, v, dout
            if peak.item() > job["budget_mb"]:
                break
        results[rank] = result
        if world > 1:
            dist.destroy_process_group()
        return
    (q, k, v, dout), segments = shards(job["length"], rank, world)
    if job["kind"] == "time":
        strategy = job.get("strategy", "ring")
        pieces = job.get("kv_pieces")
        step(q, k, v, dout, scheme, segments, world, strategy, pieces)  # warm-up
        times = []
        for _ in range(job["reps"]):
            if world > 1:
                dist.barrier()
            start = time.perf_counter()
            step(q, k, v, dout, scheme, segments, world, strategy, pieces)
            times.append(time.perf_counter() - start)
        result["ms"] = statistics.median(times) * 1e3
    else:  # hidden: the ring forward, its transfers alone, its calls alone
        with torch.no_grad():
            ring = _Ring(None, segments)
            pad = torch.zeros(1, k.shape[2], dtype=torch.uint8)

            def transfers():  # the ring's sends and receives, piece by piece, no attention
                for i in range(ring.pieces):
                    rows = ring.piece(ring.rank, i)[0]
                    for _ in ring.visit(i, [k[:, :, rows], v[:, :, rows], pad[:, rows]], backward=False):
                        pass

            def calls():  # the ring's relpos calls on this rank's keys, no transfers
                for i in range(ring.pieces):
                    rows = ring.piece(ring.rank, i)[0]
                    for s in range(world):
                        for qrows, krows, qo, ko in ring.pairs(segments, ring.piece(ring.owner(s), i)[1], True):
                            relpos.forward(q[:, :, qrows], k[:, :, rows][:, :, krows], v[:, :, rows][:, :, krows],
                                           scheme, causal=True, q_offset=qo, k_offset=ko, threads=job["threads"])

            def whole():
                ring_attention(q, k, v, scheme, causal=True, q_segments=segments, k_segments=segments)

            for name, fn in (("comm", transfers), ("calc", calls), ("ring", whole)):
                fn()
                times, waits = [], []
                for _ in range(job["reps"]):
                    dist.barrier()
                    _Ring.waited = 0.0
                    start = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - start)
                    waits.append(_Ring.waited)
                result[name + "_ms"] = statistics.median(times) * 1e3
                if name == "ring":
                    result["wait_ms"] = statistics.median(waits) * 1e3
    results[rank] = result
    if world > 1:
        dist.destroy_process_group()


def run(job, world):
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(worker, args=(world, os.path.join(tmp, "store"), job, results), nprocs=world, join=True)
        return [results[r] for r in range(world)]


def main():
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)  # the workers' large blocks go back to the system when freed
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-mb", type=float, default=96.0, help="memory per process for one step")
    parser.add_argument("--start", type=int, default=1024, help="first length of the doubling search")
    parser.add_argument("--max-length", type=int, default=65536)
    parser.add_argument("--time-length", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="bench/results/context_parallel")
    args = parser.parse_args()
    if args.quick:
        args.budget_mb, args.start, args.max_length, args.time_length, args.reps = 8.0, 256, 2048, 512, 1
    rows = {"memory": [], "time": [], "hidden": []}
    for scheme in SCHEMES:
        lengths = [args.start]
        while lengths[-1] < args.max_length:
            lengths.append(max(lengths[-1] + 64, round(lengths[-1] * 1.25 / 64) * 64))
        for world in (1, 2, 4):
            peaks = run(dict(kind="memory", scheme=scheme, lengths=lengths, budget_mb=args.budget_mb, threads=1),
                        world)[0]["peaks"]
            for L, peak in peaks:
                print(f"memory {scheme:5s} P={world} L={L:6d}: {peak:8.1f} MB per process", flush=True)
            fitting = [L for L, peak in peaks if peak <= args.budget_mb]
            rows["memory"].append(dict(scheme=scheme, processes=world, longest=max(fitting, default=0),
                                       capped=peaks[-1][1] <= args.budget_mb, peaks=peaks))
        one = run(dict(kind="time", scheme=scheme, length=args.time_length, threads=2, reps=args.reps), 1)[0]["ms"]
        two, a2a = (max(r["ms"] for r in run(dict(kind="time", scheme=scheme, length=args.time_length, threads=1,
                                                  reps=args.reps, strategy=s), 2)) for s in ("ring", "ulysses"))
        rows["time"].append(dict(scheme=scheme, length=args.time_length, one_ms=one, two_ms=two, ratio=two / one,
                                 all_to_all_ms=a2a, all_to_all_ratio=a2a / one))
        print(f"time   {scheme:5s} L={args.time_length}: 1 process {one:.1f} ms, 2 processes {two:.1f} ms "
              f"({two / one:.2f}x), all-to-all {a2a:.1f} ms ({a2a / one:.2f}x)", flush=True)
        h = run(dict(kind="hidden", scheme=scheme, length=args.time_length, threads=1, reps=args.reps), 2)
        comm, calc, ring, wait = (max(r[n] for r in h) for n in ("comm_ms", "calc_ms", "ring_ms", "wait_ms"))
        hidden = min(1.0, max(0.0, 1 - wait / comm)) if comm > 0 else 0.0
        rows["hidden"].append(dict(scheme=scheme, comm_ms=comm, calc_ms=calc, ring_ms=ring, wait_ms=wait,
                                   hidden=hidden))
        print(f"hidden {scheme:5s}: transfers {comm:.1f} ms, calls {calc:.1f} ms, ring {ring:.1f} ms, "
              f"waiting in the ring {wait:.1f} ms, hidden {hidden:.0%}", flush=True)
    meta = dict(machine=f"{platform.machine()}, {os.cpu_count()} cores", torch=torch.__version__,
                command="python bench/context_parallel.py" + (" --quick" if args.quick else ""), **vars(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(dict(meta=meta, **rows), indent=1))
    Path(args.out + ".md").write_text(markdown(rows, meta))
    print(f"wrote {args.out}.md and {args.out}.json")


def markdown(rows, meta) -> str:
    lines = ["# Context parallelism", "", f"Command: `.venv/bin/{meta['command']}`  ",
             f"Machine: {meta['machine']}; torch {meta['torch']}; float32, B=1, H={H}, d={D}, causal, zigzag shards, "
             f"gloo over loopback.", "",
             f"Longest sequence whose forward+backward step fits {meta['budget_mb']:.0f} MB per process "
             f"(ring attention with kv_pieces = min(16, chunk / 512); L grown by 1.25x from {meta['start']}; '+': "
             f"still fitting at --max-length):", "", "| scheme | 1 process | 2 processes | 4 processes | 4 / 1 |",
             "|---|---|---|---|---|"]
    for scheme in SCHEMES:
        got = {r["processes"]: r for r in rows["memory"] if r["scheme"] == scheme}
        cell = lambda p: f"{got[p]['longest']}{'+' if got[p]['capped'] else ''}"  # noqa: E731
        ratio = got[4]["longest"] / got[1]["longest"] if got[1]["longest"] else float("nan")
        lines.append(f"| {scheme} | {cell(1)} | {cell(2)} | {cell(4)} | {ratio:.1f}x |")
    lines += ["", "Time per forward+backward step, 2 processes (1 thread each) over 1 process (2 threads), the same "
              "2 cores, ring attention (default kv_pieces: whole chunks here) and all-to-all:", "",
              "| scheme | L | 1 process ms | ring, 2 processes ms | ratio | all-to-all, 2 processes ms | ratio |",
              "|---|---|---|---|---|---|---|"]
    for r in rows["time"]:
        lines.append(f"| {r['scheme']} | {r['length']} | {r['one_ms']:.1f} | {r['two_ms']:.1f} | {r['ratio']:.2f}x | "
                     f"{r['all_to_all_ms']:.1f} | {r['all_to_all_ratio']:.2f}x |")
    lines += ["", "Communication hidden behind compute (forward, 2 processes):", "",
              "| scheme | transfers alone ms | calls alone ms | ring ms | waiting in the ring ms | hidden |",
              "|---|---|---|---|---|---|"]
    for r in rows["hidden"]:
        lines.append(f"| {r['scheme']} | {r['comm_ms']:.1f} | {r['calc_ms']:.1f} | {r['ring_ms']:.1f} | "
                     f"{r['wait_ms']:.1f} | {r['hidden']:.0%} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
