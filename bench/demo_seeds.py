"""How far bfloat16 mixed precision moves `relpos demo`'s bits per byte, judged against how
far float32 itself moves when only the seed changes.

One demo run per seed and dtype compares a single pair of trajectories; at the lengths where a
scheme fails (absolute embeddings, RoPE past the training length) a seed change moves float32
by more than 0.1 bits. This runs `relpos demo --seed S --dtype D` for every seed and both
dtypes and reports, per scheme and evaluation length (non-overlapping windows):

    bf16 - f32   the mean over seeds of bfloat16's bits/byte minus float32's (same seed)
    +-           the standard error of that mean (paired over seeds)
    f32 spread   the standard deviation of float32 over seeds (the run-to-run noise);
    bf16 spread  the same of bfloat16

    .venv/bin/python bench/demo_seeds.py --seeds 1,2,3,4          # 18 minutes on a 2-core Zen 4
    .venv/bin/python bench/demo_seeds.py --seeds 1,2 --positions learned,alibi --out /tmp/ds

A seed's run that already exists in --out (its demo.json with that seed, dtype and schemes) is reused,
so an interrupted run resumes. Writes OUT/demo_seeds.md and OUT/demo_seeds.json.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DTYPES = ("float32", "bfloat16")


def run_demo(relpos_cli: str, out: Path, seed: int, dtype: str, positions: str | None) -> dict:
    """One demo run's demo.json, running it unless out/<dtype>_seed<seed> already holds it."""
    folder = out / f"{dtype}_seed{seed}"
    result = folder / "demo.json"
    if result.exists():
        previous = json.loads(result.read_text())
        schemes = [r["position"] for r in previous.get("schemes", [])]
        wanted = positions.split(",") if positions else schemes
        if previous.get("seed") == seed and previous.get("dtype") == dtype and sorted(schemes) == sorted(wanted):
            print(f"reusing {result}", flush=True)
            return previous
    cmd = [relpos_cli, "demo", "--seed", str(seed), "--dtype", dtype, "--out", str(folder)]
    if positions:
        cmd += ["--positions", positions]
    print(" ".join(cmd), flush=True)
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        sys.exit(f"demo_seeds.py: {' '.join(cmd)} failed (its message is above)")
    return json.loads(result.read_text())


def windows_bits(demo: dict) -> dict[str, list[float]]:
    """Scheme -> bits/byte at each evaluation multiple (non-overlapping windows)."""
    return {s["position"]: [score["windows"]["bits_per_byte"] for score in s["scores"]] for s in demo["schemes"]}


def summarise(runs: dict[tuple[str, int], dict], seeds: list[int]) -> list[dict]:
    first = runs[(DTYPES[0], seeds[0])]
    multiples = [score["multiple"] for score in first["schemes"][0]["scores"]]
    rows = []
    for scheme in windows_bits(first):
        f32 = [windows_bits(runs[("float32", s)])[scheme] for s in seeds]
        bf16 = [windows_bits(runs[("bfloat16", s)])[scheme] for s in seeds]
        row = {"scheme": scheme, "multiples": multiples, "shift": [], "stderr": [], "f32_spread": [], "bf16_spread": [],
               "f32_mean": []}
        for i in range(len(multiples)):
            diffs = [b[i] - f[i] for b, f in zip(bf16, f32)]
            row["shift"].append(statistics.fmean(diffs))
            row["stderr"].append(statistics.stdev(diffs) / math.sqrt(len(diffs)))
            row["f32_spread"].append(statistics.stdev([f[i] for f in f32]))
            row["bf16_spread"].append(statistics.stdev([b[i] for b in bf16]))
            row["f32_mean"].append(statistics.fmean([f[i] for f in f32]))
        rows.append(row)
    return rows


def markdown(rows: list[dict], seeds: list[int], command: str) -> str:
    multiples = rows[0]["multiples"]
    head = " / ".join(f"{m}x" for m in multiples)
    lines = [f"# bfloat16 against float32 over seeds {','.join(map(str, seeds))}", "",
             f"Command: `{command}`", "",
             "Bits per byte, non-overlapping windows; bf16 - f32: mean over seeds of the paired "
             "difference, +- its standard error; spread: standard deviation over seeds.", "",
             f"| scheme | float32 mean, {head} | bf16 - f32 | f32 spread | bf16 spread |", "|---|---|---|---|---|"]
    for r in rows:
        mean = " ".join(f"{x:.3f}" for x in r["f32_mean"])
        shift = " ".join(f"{x:+.3f}±{e:.3f}" for x, e in zip(r["shift"], r["stderr"]))
        spreads = [" ".join(f"{x:.3f}" for x in r[key]) for key in ("f32_spread", "bf16_spread")]
        lines.append(f"| {r['scheme']} | {mean} | {shift} | {spreads[0]} | {spreads[1]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3,4", help="comma-separated seeds (at least two for a spread)")
    ap.add_argument("--positions", default=None, help="comma-separated schemes (default: the demo's)")
    ap.add_argument("--relpos", default=shutil.which("relpos") or str(ROOT / ".venv/bin/relpos"),
                    help="the relpos command-line tool (default: the one scripts/setup.sh installs)")
    ap.add_argument("--out", default="results/demo_seeds", help="folder for the runs and the tables")
    a = ap.parse_args()
    try:
        seeds = sorted({int(s) for s in a.seeds.split(",")})
    except ValueError:
        ap.error(f"--seeds: expected comma-separated integers, got {a.seeds!r}")
    if len(seeds) < 2:
        ap.error("--seeds: give at least two seeds (one pair tells nothing of the noise)")
    if not Path(a.relpos).is_file():
        ap.error(f"--relpos: {a.relpos} does not exist (run scripts/setup.sh first)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {(d, s): run_demo(a.relpos, out, s, d, a.positions) for s in seeds for d in DTYPES}
    rows = summarise(runs, seeds)
    command = "bench/demo_seeds.py " + " ".join(sys.argv[1:])
    text = markdown(rows, seeds, command)
    (out / "demo_seeds.md").write_text(text)
    (out / "demo_seeds.json").write_text(json.dumps({"seeds": seeds, "rows": rows}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
