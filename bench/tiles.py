"""The fused forward's tiles measured: the plain forward (float32, B=1, H=8) with each candidate
tile (RELPOS_FORWARD_TILES=ROWSxKEYS, one process per candidate, since relpos reads it once), against
SDPA in the same process, calls alternating. Shows what the tile rule (src/attention/tiles.hpp)
chooses on this CPU and how far each candidate is from the best.

    .venv/bin/python bench/tiles.py                  # 8 runs (the rule and 7 candidates) x 4 shapes, 2 threads (about 5 minutes)
    .venv/bin/python bench/tiles.py --quick          # small shapes, two candidates: checks that it runs

Writes bench/results/forward_tiles_<simd>.md and .json (or --out PREFIX). "vs SDPA" = SDPA time /
relpos time in one process, so > 1 means relpos is faster; "vs rule" = the candidate's "vs SDPA" /
the rule's: candidates run in separate processes, and a shared machine's speed drifts between
processes by more than the tiles change (identical tiles measured 154 and 271 ms one after the
other), so each is compared through the peer that ran beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CANDIDATES = ["128x512", "128x256", "128x1024", "128x128", "256x512", "64x512", "32x512"]
SHAPES = [(4096, 64, True), (2048, 64, False), (4096, 128, True), (4096, 128, False)]  # L, d, causal


def measure(args) -> None:
    """Child: times each shape with the tiles this process was started with; prints JSON rows."""
    import torch
    import torch.nn.functional as F

    import relpos.torch as rt
    from timing import interleaved_median_ms

    torch.set_num_threads(args.threads)
    rows = []
    for L, d, causal in args.shapes:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 8, L, d) for _ in range(3))
        ours, sdpa = interleaved_median_ms(
            [lambda: rt.attention(q, k, v, causal=causal, threads=args.threads),
             lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)], args.reps)
        rows.append({"L": L, "d": d, "causal": causal, "relpos_ms": ours, "sdpa_ms": sdpa})
    print(json.dumps(rows))


def speed(row: dict) -> float:
    """SDPA time / relpos time, measured side by side in one process."""
    return row["sdpa_ms"] / row["relpos_ms"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="small shapes, two candidates, one rep")
    parser.add_argument("--out", default=None, help="output prefix (default bench/results/forward_tiles_<simd>)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.shapes = [(256, 64, True), (256, 128, False)] if args.quick else SHAPES
    if args.quick:
        args.reps = 1
    if args.child is not None:
        return measure(args)
    import relpos
    from targets import cpu_model

    info = relpos.info()
    candidates = ["rule"] + (CANDIDATES[:2] if args.quick else CANDIDATES)
    results = {}
    for tiles in candidates:
        env = {k: v for k, v in os.environ.items() if k != "RELPOS_FORWARD_TILES"}
        if tiles != "rule":
            env["RELPOS_FORWARD_TILES"] = tiles
        cmd = [sys.executable, __file__, "--child", tiles, "--threads", str(args.threads), "--reps", str(args.reps)]
        done = subprocess.run(cmd + (["--quick"] if args.quick else []), env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"tiles {tiles}: the measuring process failed:\n{done.stderr}")
        results[tiles] = json.loads(done.stdout.strip().splitlines()[-1])
        print(tiles, " ".join(f"{r['relpos_ms']:.1f}" for r in results[tiles]), flush=True)
    header = " | ".join(f"L={L} d={d} {'causal' if c else 'full'}" for L, d, c in args.shapes)
    lines = [f"# Fused forward tiles on {cpu_model()}", "",
             f"`{' '.join(['.venv/bin/python', 'bench/tiles.py'] + sys.argv[1:])}`: {args.threads} threads, "
             f"median of {args.reps}, SIMD {info['simd_target']}, L2 {info['l2_bytes'] // 1024} KiB per core; "
             f"the rule chose {info['forward_tiles']}.", "",
             "Each cell: relpos ms, vs SDPA (SDPA ms / relpos ms), vs rule (rule ms / this ms).", "",
             f"| tiles | {header} |", "|---|" + "---|" * len(args.shapes)]
    for tiles, rows in results.items():
        cells = [f"{r['relpos_ms']:.1f} ms, {speed(r):.3f}x, {speed(r) / speed(rule):.3f}x"
                 for r, rule in zip(rows, results["rule"])]
        lines.append(f"| {tiles} | " + " | ".join(cells) + " |")
    prefix = Path(args.out or f"bench/results/forward_tiles_{info['simd_target'].lower()}")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.md").write_text("\n".join(lines) + "\n")
    Path(f"{prefix}.json").write_text(json.dumps({"threads": args.threads, "reps": args.reps, "info": info,
                                                  "results": results}, indent=1))
    print(f"wrote {prefix}.md and {prefix}.json")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
