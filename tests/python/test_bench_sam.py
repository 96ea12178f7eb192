"""bench/sam.py runs end to end at small sizes (--quick), each row's sides agreeing (it refuses
to time them otherwise), and writes its table and JSON with every row."""
from __future__ import annotations

import json

from bench_run import run_bench


def test_quick_run_writes_every_row(tmp_path):
    prefix = tmp_path / "sam"
    run = run_bench("sam.py", "--quick", "--out", str(prefix))
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(prefix.with_suffix(".json").read_text())["rows"]
    assert [(r["row"], r["peer"]) for r in rows] == [("encoder", "transformers"), ("global", "transformers"),
                                                     ("global", "SDPA, dense bias"), ("swin", "transformers")]
    for r in rows:
        assert r["peer_ms"] > 0 and r["relpos_ms"] > 0 and r["agreement"] < 1e-4
        assert r["peer_peak_mb"] >= 0 and r["relpos_peak_mb"] >= 0
    assert "| global | SDPA, dense bias |" in prefix.with_suffix(".md").read_text()
