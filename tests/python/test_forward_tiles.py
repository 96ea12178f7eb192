"""The fused forward's tiles: relpos.info() reports the CPU's caches and the tiles the rule chose,
RELPOS_FORWARD_TILES sets other tiles (read once per process, so each case runs in its own) and
every tile gives the float64 oracle's values, and a malformed value is refused by name."""
import os
import pathlib
import subprocess
import sys

import pytest

import relpos

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent

# A child process: fused float32 forward and backward of multi-tile problems (causal with key
# padding, Shaw K+V, T5, Transformer-XL with memory, a decode step), checked against the oracle.
CHILD = """
import sys, numpy as np, relpos
print("imported:", relpos.info()["forward_tiles"], flush=True)
sys.path.insert(0, {here!r})
from harness import Case, assert_matches_oracle, make_problem, run_oracle
cases = [Case("tiles-plain", "none", B=1, H=2, Lq=700, Lk=700, d=32, causal=True, padding="random"),
         Case("tiles-shaw", "shaw", B=1, H=2, Lq=300, Lk=520, d=16, opts=dict(k=5, tables="kv")),
         Case("tiles-t5", "t5", B=1, H=1, Lq=260, Lk=600, d=16, causal=True, q_offset=340,
              opts=dict(bidirectional=False, num_buckets=8, max_distance=64)),
         Case("tiles-xl", "xl", B=1, H=2, Lq=200, Lk=460, d=16, causal=True, q_offset=260, opts=dict(pos_dim=8)),
         Case("tiles-decode", "alibi", B=2, H=2, Lq=1, Lk=900, d=16, q_offset=899)]
for case in cases:
    pb = make_problem(case)
    scheme, kw = pb.scheme(np.float32), pb.call_kwargs()
    q, k, v, dout = (x.astype(np.float32) for x in (pb.q, pb.k, pb.v, pb.dout))
    out, lse = relpos.forward(q, k, v, scheme, algorithm="fused", **kw)
    grads = relpos.backward(q, k, v, out, lse, dout, scheme, algorithm="fused", **kw)
    assert_matches_oracle({{"out": out, "lse": lse, **{{"d" + n: g for n, g in grads.items()}}}},
                          run_oracle(pb, np.float32), np.float32)
print(relpos.info()["forward_tiles"])
"""


def run_child(tiles):
    env = {k: v for k, v in os.environ.items() if k != "RELPOS_FORWARD_TILES"}
    if tiles is not None:
        env["RELPOS_FORWARD_TILES"] = tiles
    return subprocess.run([sys.executable, "-c", CHILD.format(here=str(HERE))], env=env, capture_output=True,
                          text=True)


def test_info_reports_the_caches_and_the_rules_tiles():
    info = relpos.info()
    for name in ("l1d_bytes", "l2_bytes", "l3_bytes"):
        assert isinstance(info[name], int) and info[name] >= 0
    l2 = pathlib.Path("/sys/devices/system/cpu/cpu0/cache/index2/size")
    if l2.exists() and l2.read_text().strip().endswith("K"):
        assert info["l2_bytes"] == int(l2.read_text().strip()[:-1]) * 1024
    if "RELPOS_FORWARD_TILES" not in os.environ:
        tiles = info["forward_tiles"]
        assert "(d = 64)" in tiles and "(d = 128)" in tiles and "128 x 128 with a table read by the key" in tiles
        l2 = info["l2_bytes"]
        shown = f"{l2 >> 20} MiB" if l2 >= 8 << 20 else f"{l2 >> 10} KiB"  # as relpos info writes sizes
        rule = f"rule for {shown} of L2" if l2 else "rule for an unreported L2"
        assert rule in tiles


@pytest.mark.parametrize("tiles", [None, "32x128", "16x384", "256x1024"])
def test_every_forward_tile_matches_the_oracle(tiles):
    done = run_child(tiles)
    assert done.returncode == 0, done.stderr[-3000:]
    if tiles is not None:
        rows, keys = tiles.split("x")
        assert f"{rows} x {keys} (RELPOS_FORWARD_TILES)" in done.stdout


@pytest.mark.parametrize("tiles", ["128", "128x100", "8x128", "huge"])
def test_a_malformed_override_is_refused_by_name(tiles):
    done = run_child(tiles)
    assert done.returncode != 0
    assert "imported: none: relpos: RELPOS_FORWARD_TILES" in done.stdout  # import and info still work
    assert "ValueError: relpos: RELPOS_FORWARD_TILES" in done.stderr  # the attention call refuses it


def test_tiles_bench_runs_and_writes_its_table(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "tiles.py"), "--quick", "--threads", "1", "--out",
                           str(tmp_path / "tiles")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (tmp_path / "tiles.md").read_text()
    assert "| rule |" in table and "| 128x256 |" in table and "vs rule" in table
