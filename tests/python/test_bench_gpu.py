"""bench/gpu.py --smoke: the GPU benchmark's every step (correctness against the float64
oracle under the bfloat16 rule, bitwise repeat, attention dropout's mask and schemes with it,
the timing rows of SDPA, relpos.gpu and the PyTorch forms with and without dropout, the
targets, the markdown) at tiny sizes on CPU tensors, so that the one run
on a lent GPU does not fail on a mistake a CPU could have caught. It runs in a subprocess:
the script sets TRITON_INTERPRET itself and imports the repository's python/relpos by its
own path, whatever relpos this process imports. Beside it, the FlexAttention forms the GPU run
times (CUDA-only in the smoke run) computed forward on CPU tensors against the oracle."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("triton")


def _table(text: str, heading: str) -> list[dict]:
    """The rows of the first markdown table under ``## heading``, by column name."""
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def test_smoke_run_checks_times_and_writes_the_table(tmp_path):
    out = tmp_path / "gpu_smoke.md"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--smoke", "--out", str(out)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert f"relpos.gpu from {ROOT / 'python' / 'relpos' / 'gpu'}" in run.stdout  # the repository's package
    text = out.read_text()
    assert "Triton's interpreter truncated" not in text  # the smoke run rounds to nearest, as a GPU

    checks = _table(text, "Correctness")
    schemes = {r["scheme"] for r in checks}
    assert {"none", "alibi", "t5", "kerple", "kerple_power", "rope", "xl", "sam", "swin"} <= schemes
    assert all(r["rule"] == "met" for r in checks), [r for r in checks if r["rule"] != "met"]
    assert all(r["bitwise repeat"] in ("identical", "-") for r in checks)
    assert {r["tensor"] for r in checks if r["scheme"] == "xl"} >= {"out", "dq", "dk", "dv", "dxl_u", "dxl_v",
                                                                   "dxl_w_r"}
    assert {r["tensor"] for r in checks if r["scheme"] == "sam"} == {"out", "dq", "dk", "dv", "dsam_rel_h",
                                                                    "dsam_rel_w"}
    assert {r["tensor"] for r in checks if r["scheme"] == "swin"} == {"out", "dq", "dk", "dv", "dswin_table"}
    assert {"none + dropout 0.3", "t5 + dropout 0.3", "deberta + dropout 0.3"} <= schemes  # the mask's oracle
    assert text.count("(< 0.05: the layout, bit for bit)") == 2  # the mask from keys on and off the 64 grid
    assert "every check met" in text

    rows = _table(text, "Timing")
    timed = {r["row"] for r in rows if r["fwd+bwd ms"] != "-"}
    assert {"SDPA flash", "relpos plain", "relpos T5 (learned table)", "SDPA + T5 bias (Hugging Face)",
            "rotation + SDPA flash", "PyTorch XL, memory L/2 (rel-shift + SDPA bias)"} <= timed
    assert any(r.startswith("OpenNMT Shaw") for r in timed)
    # SAM's global layer (a 4 x 8 grid here): relpos against transformers' attention and SDPA with the dense bias
    sam = {r["row"]: r for r in rows if r["shape"].startswith("SAM global layer 4 x 8")}
    assert set(sam) == {"SDPA flash", "relpos SAM (global layer)", "transformers SamVisionAttention core",
                        "SDPA + SAM's decomposed bias (dense)"} and all(r["fwd+bwd ms"] != "-" for r in sam.values())
    assert all(float(r["diff"]) < 0.1 for n, r in sam.items() if n not in ("SDPA flash", "relpos SAM (global layer)"))
    with_dropout = [r for r in rows if r["row"].endswith(", dropout 0.1")]
    assert {r["row"] for r in with_dropout} == {"SDPA flash, dropout 0.1", "relpos plain, dropout 0.1",
                                               "relpos T5 (learned table), dropout 0.1",
                                               "relpos DeBERTa c2p+p2c (span 256), dropout 0.1"}
    assert all(r["fwd+bwd ms"] != "-" and r["note"].endswith("x without dropout") for r in with_dropout)
    # each PyTorch form computes relpos's function: its forward agrees to bfloat16 accuracy
    diffs = [float(r["diff"]) for r in rows if r["diff"] != "-"]
    assert len(diffs) >= 6 and max(diffs) < 0.1, diffs
    targets = _table(text, "Targets")
    assert sum(r["target"].endswith("fwd+bwd: without / with dropout") for r in targets) == 6  # 3 calls x 2 shapes


def _smoke(script: str, tmp_path, *args) -> tuple[subprocess.CompletedProcess, str]:
    out = tmp_path / f"{script}.md"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / f"{script}.py"), "--smoke", "--out", str(out), *args],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return run, out.read_text()


def test_schemes_option_checks_and_times_only_those(tmp_path):
    _, text = _smoke("gpu", tmp_path, "--schemes", "rope")
    assert {r["scheme"] for r in _table(text, "Correctness")} == {"rope"}
    timed = {r["row"] for r in _table(text, "Timing") if r["fwd+bwd ms"] != "-"}
    assert timed == {"SDPA flash", "relpos RoPE", "rotation + SDPA flash"}  # SDPA flash: the ratios' base


def test_schemes_option_refuses_an_unknown_scheme(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--smoke", "--schemes", "rope,bogus"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--schemes: unknown bogus" in run.stderr


def test_tile_sweep_checks_each_configuration_against_sdpa(tmp_path):
    """bench/gpu_tiles.py --smoke: each launch configuration's output and gradients checked
    against SDPA's before it is timed, and the table written; one configuration for all three
    kernels or one per kernel."""
    _, text = _smoke("gpu_tiles", tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| none | 16 |")]
    configs = [r for r in rows if "SDPA flash" not in r]
    assert len(configs) == 3, rows
    assert configs[-1].split("|")[3].strip() == "fwd 32x16 w4 s1, kv 16x32 w4 s1, q 32x16 w4 s1", rows
    errors = [float(r.strip("|").split("|")[-1]) for r in configs]
    assert all(0 < e < 2e-2 for e in errors), errors  # bfloat16 against bfloat16: close, never equal
    assert "fastest forward" in text


def test_tile_sweep_checks_a_table_scheme_against_the_shipped_configuration(tmp_path):
    """--schemes shaw: the configuration launch_for ships is timed first and each other one's
    output and gradients, the tables' included, are checked against it."""
    _, text = _smoke("gpu_tiles", tmp_path, "--schemes", "shaw")
    rows = [line for line in text.splitlines() if line.startswith("| shaw | 16 |")]
    assert "(launch_for)" in rows[1] and "SDPA flash" in rows[0], rows
    other = rows[-1].strip("|").split("|")
    assert other[2].strip() == "32x32 w4 s1" and 0 < float(other[-1]) < 2e-2, rows  # other tiles: other rounding
    assert not any(line.startswith("| none |") for line in text.splitlines())


def test_host_time_bench_refuses_without_a_gpu(tmp_path):
    """bench/gpu_host.py times the host against the GPU's kernels: without a CUDA device it says so."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the bench would run, not refuse")
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_host.py"), "--out", str(tmp_path / "h.txt")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no CUDA device" in run.stderr, run.stderr
    assert not (tmp_path / "h.txt").exists()


def test_flex_forms_compute_what_relpos_computes():
    """bench/gpu.py's FlexAttention rows read their positions through score_mods of their own (ALiBi's
    fixed slopes, T5's table through a row of buckets per distance, Shaw's key term through a per-query
    table of clipped distances): each form's forward against the float64 oracle, causal (T5 also
    bidirectional), on CPU tensors, where FlexAttention compiles its forward (its backward is CUDA-only),
    so that a GPU run's flex ratios compare the same function and its rows do not fail there first."""
    from torch_oracle import attention as oracle

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_forms as forms
    finally:
        sys.path.remove(str(ROOT / "bench"))
    torch.manual_seed(0)
    H, L, d, shaw_k, cpu = 2, 80, 16, 16, torch.device("cpu")  # 80 keys: Shaw's clip and T5's log buckets reached
    f32 = dict(dtype=torch.float32)  # FlexAttention on CPUs takes no float64 (the suite's default)
    q, k, v = (torch.randn(1, H, L, d, **f32) for _ in range(3))
    slopes, table = torch.rand(H, **f32), torch.randn(H, forms.T5_BUCKETS, **f32)
    wk = torch.randn(2 * shaw_k + 1, d, **f32)
    scale = d ** -0.5
    for causal in (True, False):
        mask = forms.causal_block_mask(L, cpu) if causal else None
        cases = {"t5": (lambda: forms.flex_t5(q, k, v, table, forms.t5_bucket_row(L, L, not causal, cpu), mask,
                                              scale=scale),
                        dict(opts=dict(bidirectional=not causal, max_distance=forms.T5_MAX_DISTANCE),
                             params=dict(t5_table=table.double())))}
        if causal:
            cases.update(none=(lambda: forms.flex_plain(q, k, v, mask, scale=scale), {}),
                         alibi=(lambda: forms.flex_alibi(q, k, v, slopes, mask, scale=scale),
                                dict(params=dict(alibi_slopes=slopes.double()))),
                         shaw=(lambda: forms.flex_shaw_keys(q, k, v, wk, shaw_k, mask, scale=scale),
                               dict(opts=dict(k=shaw_k), params=dict(shaw_wk=wk.double()))))
        for scheme, (form, kwargs) in cases.items():
            want, _ = oracle(q.double(), k.double(), v.double(), scheme, causal=causal, scale=scale, **kwargs)
            torch.testing.assert_close(form().double(), want, rtol=0, atol=2e-5, msg=f"{scheme} causal={causal}")
