"""Training speed of `relpos train` on a quiet machine and beside busy processes.

Idle OpenMP threads that spin take cores from whatever else runs; a team that
spins while another process holds a core also waits for that core at every
barrier. This benchmark trains the same small model with the default thread
count (all cores) two ways, one after the other in this run:

    quiet   nothing else running
    busy    with --busy CPU-bound processes beside it (default 1: one core taken)

and reports training tokens per second for each relpos binary given (e.g. an
older build against the current one, to measure a change of wait policy):

    .venv/bin/python bench/shared_cores.py                                  # the installed relpos
    .venv/bin/python bench/shared_cores.py --relpos old/relpos --relpos .venv/bin/relpos
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def spin() -> None:
    while True:
        pass


def tokens_per_second(relpos: str, steps: int, workdir: pathlib.Path, tag: str) -> float:
    report = workdir / f"{tag}.json"
    cmd = [relpos, "train", "--positions", "alibi", "--length", "64", "--layers", "2", "--width", "128",
           "--heads", "4", "--ffn", "512", "--batch", "16", "--steps", str(steps), "--eval-bytes", "4096",
           "--checkpoint", str(workdir / f"{tag}.ckpt"), "--json", str(report)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = json.loads(report.read_text())
    return (r["steps"] - r["first_step"]) * r["batch"] * r["length"] / r["seconds"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relpos", action="append", help="relpos binary (repeatable; default .venv/bin/relpos)")
    ap.add_argument("--steps", type=int, default=300, help="training steps per run")
    ap.add_argument("--busy", type=int, default=1, help="CPU-bound processes beside the busy runs")
    args = ap.parse_args()
    binaries = args.relpos or [str(ROOT / ".venv" / "bin" / "relpos")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        for i, binary in enumerate(binaries):
            quiet = tokens_per_second(binary, args.steps, work, f"quiet{i}")
            spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
            for p in spinners:
                p.start()
            try:
                busy = tokens_per_second(binary, args.steps, work, f"busy{i}")
            finally:
                for p in spinners:
                    p.terminate()
                    p.join()
            rows.append((binary, quiet, busy))
    print(f"relpos train, alibi, 2 layers, width 128, L=64, batch 16, {args.steps} steps, default threads; "
          f"busy = {args.busy} CPU-bound process(es) beside it\n")
    print("| relpos binary | quiet tokens/s | busy tokens/s | busy / quiet |")
    print("|---|---|---|---|")
    for binary, quiet, busy in rows:
        print(f"| {binary} | {quiet:,.0f} | {busy:,.0f} | {busy / quiet:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
