"""Runs a bench/ script as a user would (python bench/<name>.py ...), with bench/ importable."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT / "bench")]))
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
