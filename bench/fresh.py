"""Plain attention as a user's process meets it: relpos against SDPA with each side alone in a fresh
process, beside the figure bench/targets.py takes with both sides in one long process.

    .venv/bin/python bench/fresh.py             # every row below, 2 threads (about 20 minutes)
    .venv/bin/python bench/fresh.py --quick     # small sizes, one rep: checks that every row runs
    RELPOS_SIMD=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        .venv/bin/python bench/fresh.py --out bench/results/fresh_<cpu>_avx2   # the AVX2 dispatch

Rows (float32, torch.set_num_threads(--threads) and nothing passed to relpos, as a user calls it;
"speed" = SDPA time / relpos time, > 1: relpos faster):

    plain   rt.attention against F.scaled_dot_product_attention, one batch entry of H heads, L x H =
            2048 x 1, 2048 x 32, 4096 x 8, 8192 x 2 and 16384 x 1 (--shapes), d = 64 and 128 (--dims), causal
            and not, forward and forward+backward                                 target >= 1.1x
    sgemm   the forward's two products (4 d flops per query/key pair the mask keeps, diagonal
            tiles' masked halves not counted) at relpos's forward time, over the machine's sgemm
            rate (torch.mm, 4096 x 4096 by 4096 x 1024, in its own fresh process)  target >= 0.8
    decode  one query against Lk = 4096 and 32768 cached keys, B = 8, H = 8, d = 64: the bytes of K
            and V over relpos's time, against the same bytes read by torch's sum (a streaming
            read), with SDPA's time beside it                                     target >= 0.9

Methods, both in every row:

    fresh       each side alone in a fresh Python process: its first call (the time, and the peak
                memory: the growth of the resident set's high-water mark over the resident set with
                the inputs made), --warmup more calls, then the median of --reps calls or of
                enough for --seconds of calls (1 s), whichever is more (at most 100)
    in-process  both sides in one fresh process, a first and a warm-up call each, then as many calls
                of each, alternating (bench/targets.py's method); the first calls' outputs and
                gradients must agree within 1e-4 of SDPA's largest, or the bench stops naming the row

Writes bench/results/fresh_<cpu>.md and .json (or --out PREFIX).
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import relpos
import relpos.torch as rt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import cpu_model, in_fresh_process, interleaved_median_ms, peak_growth_mb, results_prefix  # noqa: E402

SIDES = ("relpos", "sdpa")
SPEED_TARGET, SGEMM_TARGET, STREAM_TARGET = 1.1, 0.8, 0.9
DECODE_BATCH, DECODE_HEADS, DECODE_D = 8, 8, 64
MAX_REPS = 100
AGREEMENT = 1e-4  # relpos's output and gradients against SDPA's, relative to SDPA's largest: checked before timing


def plain_call(side: str, L: int, heads: int, d: int, causal: bool, grad: bool):
    """One call of `side` on fresh inputs (1, heads, L, d), with its backward when grad; it returns
    the output and the inputs' gradients (no copies)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, L, d).requires_grad_(grad) for _ in range(3))
    attend = ((lambda: rt.attention(q, k, v, causal=causal)) if side == "relpos" else
              (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)))

    def run():
        for x in (q, k, v):
            x.grad = None
        out = attend()
        if grad:
            out.backward(torch.ones_like(out))
            return [out, q.grad, k.grad, v.grad]
        return [out]
    return run


def decode_call(side: str, Lk: int):
    """One decode step of `side`: relpos or SDPA on one query against Lk cached keys, or "stream",
    torch's sum over the same K and V (the bytes a decode step must read, read once)."""
    torch.manual_seed(0)
    shape = (DECODE_BATCH, DECODE_HEADS, Lk, DECODE_D)
    q, k, v = torch.randn(DECODE_BATCH, DECODE_HEADS, 1, DECODE_D), torch.randn(shape), torch.randn(shape)
    if side == "relpos":
        return lambda: rt.attention(q, k, v, causal=True, q_offset=Lk - 1)
    if side == "sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v)  # one query sees every cached key
    return lambda: (k.sum(), v.sum())


def sgemm_call():
    a, b = torch.randn(4096, 4096), torch.randn(4096, 1024)
    return lambda: torch.mm(a, b)


CALLS = {"plain": plain_call, "decode": decode_call, "sgemm": sgemm_call}


def calls_for(one_ms: float, reps: int, seconds: float) -> int:
    """reps, or more where calls are short: enough for `seconds` of calls (at most MAX_REPS), since a
    median of three 5 ms calls moves by tens of percent on a busy machine."""
    return max(reps, min(MAX_REPS, math.ceil(seconds * 1e3 / max(one_ms, 1e-3))))


def alone(call: list, threads: int, warmup: int, reps: int, seconds: float) -> dict:
    """In this process (a fresh one): the first call's ms and peak MB, then, after `warmup` more calls,
    the median ms of calls_for(.., reps, seconds) calls, of the call that CALLS[call[0]](*call[1:]) makes."""
    torch.set_num_threads(threads)
    run = CALLS[call[0]](*call[1:])
    first = {}

    def timed_first():
        first["ms"] = timed_ms(run)
    peak = peak_growth_mb(timed_first)
    warm = [timed_ms(run) for _ in range(warmup)]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = [timed_ms(run) for _ in range(calls_for(min(warm, default=first["ms"]), reps, seconds))]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"first_ms": first["ms"], "peak_mb": peak, "ms": statistics.median(times), "calls": len(times),
            "faults_per_call": faults / len(times)}


def timed_ms(run) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e3


def together(calls: list[list], threads: int, reps: int, seconds: float) -> list:
    """In this process: [the two calls' largest difference in their results, relative to the second's
    largest magnitude; [each call's median ms]], the calls CALLS makes of `calls` (two plain calls),
    timed alternating (bench/targets.py's method) after a first call of each that gives the results."""
    torch.set_num_threads(threads)
    runs = [CALLS[c[0]](*c[1:]) for c in calls]
    results, slowest = [], 0.0
    for run in runs:
        start = time.perf_counter()
        results.append(run())
        slowest = max(slowest, (time.perf_counter() - start) * 1e3)
    ours, peer = results
    difference = max((a - b).abs().max().item() / max(b.abs().max().item(), 1e-30) for a, b in zip(ours, peer))
    return [difference, interleaved_median_ms(runs, calls_for(slowest, reps, seconds))]


def fresh(call: list, args) -> dict:
    return in_fresh_process("fresh", f"alone({call!r}, {args.threads}, {args.warmup}, {args.reps}, {args.seconds})")


def kept_pairs(L: int, causal: bool) -> int:
    return L * (L + 1) // 2 if causal else L * L


def plain_rows(args, sgemm_gflops: float) -> list[dict]:
    rows = []
    for L, heads in args.shapes:
        for d in args.dims:
            for causal in (True, False):
                for grad in (False, True):
                    calls = [["plain", side, L, heads, d, causal, grad] for side in SIDES]
                    ours, sdpa = (fresh(c, args) for c in calls)
                    agreement, inproc = in_fresh_process(
                        "fresh", f"together({calls!r}, {args.threads}, {args.reps}, {args.seconds})")
                    case = f"L={L} H={heads} d={d} {'causal' if causal else 'full'}"
                    if not agreement < AGREEMENT:
                        raise SystemExit(f"fresh bench: {case}: relpos and SDPA differ by {agreement:g} (relative)")
                    row = {"group": "plain", "case": case,
                           "mode": "fwd+bwd" if grad else "fwd", "relpos": ours, "sdpa": sdpa,
                           "speed": sdpa["ms"] / ours["ms"], "in_process_ms": inproc,
                           "in_process_speed": inproc[1] / inproc[0], "agreement": agreement,
                           "target": SPEED_TARGET}
                    if not grad:
                        gflops = 4 * d * heads * kept_pairs(L, causal) / (ours["ms"] * 1e6)
                        row["of_sgemm"] = gflops / sgemm_gflops
                    row["met"] = row["speed"] >= SPEED_TARGET and row.get("of_sgemm", 1) >= SGEMM_TARGET
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def decode_rows(args) -> list[dict]:
    rows = []
    for Lk in args.decode_lengths:
        ours, sdpa, stream = (fresh(["decode", side, Lk], args) for side in ("relpos", "sdpa", "stream"))
        gigabytes = 2 * DECODE_BATCH * DECODE_HEADS * Lk * DECODE_D * 4 / 1e9
        row = {"group": "decode", "case": f"Lq=1 Lk={Lk} B={DECODE_BATCH} H={DECODE_HEADS} d={DECODE_D}",
               "mode": "fwd", "relpos": ours, "sdpa": sdpa, "stream": stream, "speed": sdpa["ms"] / ours["ms"],
               "relpos_gb_s": gigabytes / ours["ms"] * 1e3, "stream_gb_s": gigabytes / stream["ms"] * 1e3,
               "of_stream": stream["ms"] / ours["ms"], "target": STREAM_TARGET}
        row["met"] = row["of_stream"] >= STREAM_TARGET
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    met = sum(r["met"] for r in rows)
    lines = ["# Plain attention in a fresh process against SDPA", "",
             f"Command: `{meta['command']}`  ", f"Machine: {meta['cpu']}, {meta['threads']} threads; relpos SIMD "
             f"{meta['simd']}, GEMM {meta['gemm']}; torch {meta['torch']}; sgemm {meta['sgemm_gflops']:.0f} GFLOP/s "
             f"(torch.mm, fresh process)  ", f"{met} of {len(rows)} rows meet their targets.", "",
             "| case | mode | relpos ms (first call) | SDPA ms (first call) | speed, fresh | in one process: "
             "relpos / SDPA ms | speed, in one process | peak MB relpos / SDPA | products, of sgemm | met |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["group"] == "plain":
            inproc = f"{r['in_process_ms'][0]:.1f} / {r['in_process_ms'][1]:.1f} | {r['in_process_speed']:.2f}x"
            of_sgemm = f"{r['of_sgemm']:.2f}" if "of_sgemm" in r else "-"
        else:
            inproc = f"stream {r['stream']['ms']:.2f} ms ({r['stream_gb_s']:.0f} GB/s) | -"
            of_sgemm = f"{r['relpos_gb_s']:.0f} GB/s, {r['of_stream']:.2f} of the stream"
        lines.append(f"| {r['case']} | {r['mode']} | {r['relpos']['ms']:.1f} ({r['relpos']['first_ms']:.0f}) "
                     f"| {r['sdpa']['ms']:.1f} ({r['sdpa']['first_ms']:.0f}) | {r['speed']:.2f}x | {inproc} "
                     f"| {r['relpos']['peak_mb']:.0f} / {r['sdpa']['peak_mb']:.0f} | {of_sgemm} "
                     f"| {'yes' if r['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def shapes(text: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(n) for n in item.split("x")) for item in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"--shapes: expected L x heads pairs such as 2048x1,4096x8, got {text!r}")
    return pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shapes", type=shapes, default=shapes("2048x1,2048x32,4096x8,8192x2,16384x1"),
                    help="the plain rows' L x heads (one batch entry)")
    ap.add_argument("--dims", default="64,128", help="the plain rows' head sizes")
    ap.add_argument("--decode-lengths", default="4096,32768")
    ap.add_argument("--quick", action="store_true", help="small sizes, one rep: check that every row runs")
    ap.add_argument("--warmup", type=int, default=2, help="calls after the first, before the timed ones")
    ap.add_argument("--reps", type=int, default=3, help="timed calls at least")
    ap.add_argument("--seconds", type=float, default=1.0, help="timed calls at least this long in all")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    args.dims, args.decode_lengths = ([int(n) for n in a.split(",")] for a in (args.dims, args.decode_lengths))
    if args.quick:
        args.shapes, args.dims, args.decode_lengths = [(128, 2)], [64], [256]
        args.warmup, args.reps, args.seconds = 1, 1, 0.0
    sgemm = fresh(["sgemm"], args)
    sgemm_gflops = 2 * 4096 * 4096 * 1024 / (sgemm["ms"] * 1e6)
    rows = plain_rows(args, sgemm_gflops) + decode_rows(args)
    info = relpos.info()
    meta = {"command": "python " + " ".join(sys.argv), "cpu": cpu_model(), "threads": args.threads,
            "simd": info["simd_target"], "gemm": info["gemm_isa"], "torch": torch.__version__,
            "sgemm_gflops": sgemm_gflops}
    text = markdown(rows, meta)
    print(text)
    if args.quick and not args.out:
        return
    prefix = results_prefix(args.out, "fresh")
    prefix.with_suffix(".md").write_text(text)
    prefix.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
