"""bench/sam.py runs end to end at small sizes (--quick), each row's sides agreeing (it refuses
to time them otherwise), and writes its table and JSON with every row."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_quick_run_writes_every_row(tmp_path):
    prefix = tmp_path / "sam"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT / "bench")]))}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "sam.py"), "--quick", "--out", str(prefix)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(prefix.with_suffix(".json").read_text())["rows"]
    assert [(r["row"], r["peer"]) for r in rows] == [("encoder", "transformers"), ("global", "transformers"),
                                                     ("global", "SDPA, dense bias"), ("swin", "transformers")]
    for r in rows:
        assert r["peer_ms"] > 0 and r["relpos_ms"] > 0 and r["agreement"] < 1e-4
        assert r["peer_peak_mb"] >= 0 and r["relpos_peak_mb"] >= 0
    assert "| global | SDPA, dense bias |" in prefix.with_suffix(".md").read_text()
