"""bench/deberta.py runs end to end at small sizes (--quick), its two sides agreeing (it
refuses to time them otherwise), and writes its table and JSON with every row."""
from __future__ import annotations

import json

from bench_run import run_bench


def test_quick_run_writes_every_row(tmp_path):
    prefix = tmp_path / "deberta"
    run = run_bench("deberta.py", "--quick", "--out", str(prefix))
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(prefix.with_suffix(".json").read_text())["rows"]
    assert [r["L"] for r in rows] == [64, 128]
    for r in rows:
        assert r["transformers_ms"] > 0 and r["relpos_ms"] > 0 and r["plain_ms"] > 0
        assert r["transformers_peak_mb"] >= 0 and r["relpos_peak_mb"] >= 0
    table = prefix.with_suffix(".md").read_text()
    assert "| 2 | 64 |" in table and "| 2 | 128 |" in table


def test_training_step_quick_run_agrees_and_writes_its_row(tmp_path):
    """bench/deberta_step.py --quick: a tiny DebertaV2ForSequenceClassification step patched
    against unpatched; it refuses to time them unless their first losses agree."""
    out = tmp_path / "step.md"
    run = run_bench("deberta_step.py", "--quick", "--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| tiny |")]
    assert len(rows) == 2  # without dropout and with 0.1
    for row, dropout in zip(rows, (0.0, 0.1)):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[6]) == dropout and float(cells[7]) > 0 and float(cells[8]) > 0 and float(cells[10]) < 1e-4


def test_training_step_refuses_an_unknown_size(tmp_path):
    run = run_bench("deberta_step.py", "--sizes", "huge", timeout=120)
    assert run.returncode == 2 and "--sizes: unknown huge" in run.stderr
