"""bench/fresh.py --quick: every plain row (causal and not, forward and forward+backward) and the
decode row timed in fresh processes and in one process, with each side's first call and peak
memory, relpos's output and gradients checked against SDPA's before timing, written to its table
and JSON; a bad --shapes refused by name."""
from __future__ import annotations

import json

from bench_run import run_bench


def test_quick_run_writes_every_row(tmp_path):
    prefix = tmp_path / "fresh"
    run = run_bench("fresh.py", "--quick", "--out", str(prefix))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(prefix.with_suffix(".json").read_text())
    assert report["sgemm_gflops"] > 0
    rows = report["rows"]
    assert [(r["case"], r["mode"]) for r in rows] == [
        ("L=128 H=2 d=64 causal", "fwd"), ("L=128 H=2 d=64 causal", "fwd+bwd"),
        ("L=128 H=2 d=64 full", "fwd"), ("L=128 H=2 d=64 full", "fwd+bwd"), ("Lq=1 Lk=256 B=8 H=8 d=64", "fwd")]
    for r in rows:
        for side in ("relpos", "sdpa"):
            assert r[side]["ms"] > 0 and r[side]["first_ms"] > 0 and r[side]["peak_mb"] >= 0
            assert r[side]["calls"] >= 1 and r[side]["faults_per_call"] >= 0
        assert r["speed"] == r["sdpa"]["ms"] / r["relpos"]["ms"]
    for r in rows[:4]:
        assert len(r["in_process_ms"]) == 2 and min(r["in_process_ms"]) > 0
        assert 0 <= r["agreement"] < 1e-4  # relpos's output and gradients against SDPA's
        assert ("of_sgemm" in r) == (r["mode"] == "fwd")
    assert rows[4]["stream"]["ms"] > 0 and rows[4]["of_stream"] == rows[4]["stream"]["ms"] / rows[4]["relpos"]["ms"]
    text = prefix.with_suffix(".md").read_text()
    assert "| L=128 H=2 d=64 full | fwd+bwd |" in text and "of 5 rows meet their targets" in text


def test_bad_shapes_refused_by_name():
    run = run_bench("fresh.py", "--shapes", "2048by1", timeout=120)
    assert run.returncode == 2 and "--shapes: expected L x heads pairs" in run.stderr
