"""How the fused kernel scales with threads, beside sgemm's own scaling on the same machine.

    .venv/bin/python bench/scaling.py                       # 1, 2, 4, 8, 16 threads (as many as there are cores)
    .venv/bin/python bench/scaling.py --threads 1,2 --quick # small sizes: checks that every row runs

Rows (float32, relpos.forward / relpos.backward on NumPy arrays, causal):

    plain     B=1, H=16, L=4096, d=64: the work split over heads and query tiles
    one head  B=1, H=1, L=8192, d=64: one head's query tiles (forward) and key-tile groups (backward)
    xl        Transformer-XL, B=1, H=16, L=4096 with 2048 memory keys, d=64, pos_dim 64: the band
              products of its sinusoidal term beside the content products
    sgemm     torch.mm of (4096 x 4096) by (4096 x 1024) float32 on torch's threads

For each row and thread count n: the median time of --reps calls after one warm-up (the thread
counts alternate, one call of each in turn, so a drift of the machine reaches all of them), the
speed-up t(1) / t(n), and that speed-up over sgemm's at the same n ("of sgemm": 1.00 scales as
sgemm does; the target of the fused kernel is >= 0.90). Writes bench/results/scaling_<cpu>.md
and .json (or --out PREFIX).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import numpy as np

import relpos

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import cpu_model, interleaved_median_ms  # noqa: E402

TARGET_OF_SGEMM = 0.90


def _randn(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def attention_cases(quick: bool) -> dict:
    """name -> (forward(n), backward(n)) callables making a timed call on n threads."""
    rng = np.random.default_rng(0)
    H, L, d = (4, 512, 64) if quick else (16, 4096, 64)
    one_L = 1024 if quick else 8192
    memory = L // 2
    xl = relpos.TransformerXL(_randn(rng, H, d), _randn(rng, H, d), 0.1 * _randn(rng, H, d, 64))
    specs = {
        f"plain B=1 H={H} L={L} d={d}": (L, L, H, None, 0),
        f"one head B=1 H=1 L={one_L} d={d}": (one_L, one_L, 1, None, 0),
        f"xl B=1 H={H} L={L} memory {memory} d={d}": (L, L + memory, H, xl, memory),
    }
    cases = {}
    for name, (Lq, Lk, heads, scheme, q_offset) in specs.items():
        q, k, v = _randn(rng, 1, heads, Lq, d), _randn(rng, 1, heads, Lk, d), _randn(rng, 1, heads, Lk, d)
        dout = _randn(rng, 1, heads, Lq, d)
        kw = dict(causal=True, q_offset=q_offset)
        out, lse = relpos.forward(q, k, v, scheme, **kw)

        def fwd(n, q=q, k=k, v=v, scheme=scheme, kw=kw):
            return lambda: relpos.forward(q, k, v, scheme, threads=n, **kw)

        def bwd(n, q=q, k=k, v=v, out=out, lse=lse, dout=dout, scheme=scheme, kw=kw):
            return lambda: relpos.backward(q, k, v, out, lse, dout, scheme, threads=n, **kw)

        cases[name] = (fwd, bwd)
    return cases


def sgemm_case(quick: bool):
    import torch

    m, k, n = (1024, 1024, 256) if quick else (4096, 4096, 1024)
    a, b = torch.randn(m, k), torch.randn(k, n)

    def at(threads):
        def run():
            torch.set_num_threads(threads)
            torch.mm(a, b)
        return run
    return f"sgemm {m}x{k} by {k}x{n} (torch.mm)", at


def measure(threads: list[int], reps: int, quick: bool) -> list[dict]:
    rows = []
    sgemm_name, sgemm_at = sgemm_case(quick)
    times = interleaved_median_ms([sgemm_at(n) for n in threads], reps)
    sgemm = dict(zip(threads, times))
    rows.append({"case": sgemm_name, "mode": "-", "ms": sgemm})
    print(f"{sgemm_name}: " + ", ".join(f"{n} threads {t:.1f} ms" for n, t in sgemm.items()), flush=True)
    for name, (fwd, bwd) in attention_cases(quick).items():
        for mode, make in (("fwd", fwd), ("bwd", bwd)):
            ms = dict(zip(threads, interleaved_median_ms([make(n) for n in threads], reps)))
            rows.append({"case": name, "mode": mode, "ms": ms})
            print(f"{name} {mode}: " + ", ".join(f"{n} threads {t:.1f} ms" for n, t in ms.items()), flush=True)
    base = threads[0]
    for row in rows:
        row["speedup"] = {n: row["ms"][base] / t for n, t in row["ms"].items()}
        row["of_sgemm"] = {n: row["speedup"][n] / rows[0]["speedup"][n] for n in threads}
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    threads = list(rows[0]["ms"])
    head = " | ".join(f"{n} thr ms | x{threads[0]} | of sgemm" for n in threads)
    lines = ["# Thread scaling of the fused kernel against sgemm", "",
             f"Command: `{meta['command']}`  ",
             f"Machine: {meta['machine']}; relpos SIMD target {meta['simd']}, GEMM ISA {meta['gemm_isa']}; "
             f"float32, causal; median of {meta['reps']} after one warm-up, thread counts alternating.  ",
             f"x{threads[0]}: time at {threads[0]} thread(s) / time at n; of sgemm: that speed-up over sgemm's at n "
             f"(target >= {TARGET_OF_SGEMM:.2f} for the fused kernel).", "",
             f"| case | mode | {head} |", "|---|---|" + "---|---|---|" * len(threads)]
    for r in rows:
        cells = " | ".join(f"{r['ms'][n]:.1f} | {r['speedup'][n]:.2f} | {r['of_sgemm'][n]:.2f}" for n in threads)
        lines.append(f"| {r['case']} | {r['mode']} | {cells} |")
    top = threads[-1]
    fused = rows[1:]
    met = sum(r["of_sgemm"][top] >= TARGET_OF_SGEMM for r in fused)
    lines += ["", f"At {top} threads, {met} of {len(fused)} fused rows scale within "
              f"{100 * (1 - TARGET_OF_SGEMM):.0f}% of sgemm.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default=None,
                        help="comma list of thread counts (default 1, 2, 4, 8, 16 up to the cores there are)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes and one rep: checks that every row runs")
    parser.add_argument("--out", default=None, help="output prefix (default bench/results/scaling_<cpu>)")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    if args.threads:
        try:
            threads = [int(n) for n in args.threads.split(",")]
        except ValueError:
            parser.error(f"--threads: not a comma list of integers: {args.threads!r}")
    else:
        threads = [n for n in (1, 2, 4, 8, 16) if n <= cores]
    if not threads or min(threads) < 1:
        parser.error("--threads: every count must be at least 1")
    if args.quick:
        args.reps = 1
    info = relpos.info()
    meta = {"command": " ".join(["python", "bench/scaling.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": f"{cpu_model()}, {cores} logical CPUs, L2 {info['l2_bytes'] >> 10} KiB per core, "
                       f"L3 {info['l3_bytes'] >> 20} MiB", "simd": info["simd_target"],
            "gemm_isa": info["gemm_isa"], "reps": args.reps}
    rows = measure(threads, args.reps, args.quick)
    slug = re.sub(r"[^a-z0-9]+", "_", cpu_model().lower()).strip("_")
    prefix = Path(args.out or Path(__file__).resolve().parent / "results" / f"scaling_{slug}")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, meta)
    prefix.with_suffix(".md").write_text(text)
    prefix.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
