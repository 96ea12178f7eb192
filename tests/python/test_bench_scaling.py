"""bench/scaling.py --quick: the thread-scaling table (the fused kernel's rows beside sgemm's)
written at small sizes, each row's speed-up at the first thread count 1 by definition, and a
bad thread list refused by name."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _scaling(*args, cwd):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "scaling.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_quick_run_writes_every_row(tmp_path):
    run = _scaling("--threads", "1,2", "--quick", "--out", str(tmp_path / "scaling"), cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((tmp_path / "scaling.json").read_text())["rows"]
    cases = [(r["case"].split()[0], r["mode"]) for r in rows]
    assert cases == [("sgemm", "-"), ("plain", "fwd"), ("plain", "bwd"), ("one", "fwd"), ("one", "bwd"),
                     ("xl", "fwd"), ("xl", "bwd")]
    for r in rows:
        assert set(r["ms"]) == {"1", "2"} and all(t > 0 for t in r["ms"].values())
        assert r["speedup"]["1"] == 1.0 and r["of_sgemm"]["1"] == 1.0
    text = (tmp_path / "scaling.md").read_text()
    assert "| plain B=1 H=4 L=512 d=64 | bwd |" in text and "fused rows scale within 10% of sgemm" in text


def test_bad_thread_list_is_refused(tmp_path):
    for bad in ("0,2", "one"):
        run = _scaling("--threads", bad, "--quick", cwd=tmp_path)
        assert run.returncode == 2 and "--threads" in run.stderr, run.stderr
