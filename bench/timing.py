"""Timing helpers of the CPU benchmarks (standard library only, so that a benchmark that needs
no relpos.torch, bench/scaling.py, runs where relpos's NumPy API and torch alone are installed)."""
from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


def interleaved_median_ms(fns, reps: int) -> list[float]:
    """The median time in ms of each fn over reps calls after one warm-up call, the calls of all fns
    alternating so that each sees the same spells of a noisy machine (a whole series of one side, then
    of the other, put a drift of the machine into the ratio)."""
    for fn in fns:
        fn()  # warm-up
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, t in zip(fns, times):
            start = time.perf_counter()
            fn()
            t.append(time.perf_counter() - start)
    return [statistics.median(t) * 1e3 for t in times]


def resident_kb(field: str) -> int:
    """VmRSS (now) or VmHWM (the high-water mark) of this process, in KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_growth_mb(run) -> float:
    """The high-water mark of one call of ``run`` over the resident set before it, in MB; the mark
    reset first (clear_refs 5), so that what importing torch and transformers touched does not hide
    it. Run it in a fresh process, whose allocator starts empty."""
    Path("/proc/self/clear_refs").write_text("5")
    base = resident_kb("VmRSS")
    run()
    return (resident_kb("VmHWM") - base) / 1024


def cpu_model() -> str:
    """The CPU's model name (Linux), or what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def in_fresh_process(module: str, call: str):
    """The JSON value that ``call`` (a call of a function of bench/<module>.py, as source text) returns,
    computed in a fresh Python process: it starts from an empty allocator, no threads spun up and no
    cached plans or kernels, whatever ran before it."""
    code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            f"import {module} as b; print(json.dumps(b.{call}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"bench/{module}.py: {call} failed in its process:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def results_prefix(out: str, name: str) -> Path:
    """--out as given, or bench/results/<name>_<the CPU's model, as an identifier>."""
    if out:
        return Path(out)
    slug = "".join(c if c.isalnum() else "_" for c in cpu_model().lower()).strip("_")
    return Path(__file__).resolve().parent / "results" / f"{name}_{slug}"
