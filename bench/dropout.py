"""What attention dropout costs relpos on the CPU: forward+backward with dropout 0.1 against the
same call without it, plain attention, T5 and DeBERTa (c2p + p2c), L = 512 and 2048, float32,
one run, the calls alternating (bench/timing.py). Target: at most 1.15x (about what
FlashAttention-2's dropout costs it). Beside them, PyTorch's SDPA forward+backward with the same
dropout (on CPU its dropout runs the unfused math path, the (L, L) probabilities materialised)
against relpos's plain row with dropout.

    .venv/bin/python bench/dropout.py                   # every row (a few minutes on 2 cores)
    .venv/bin/python bench/dropout.py --quick           # small sizes, one rep: checks that every row runs
    RELPOS_SIMD=avx2 .venv/bin/python bench/dropout.py  # the AVX2 dispatch of relpos's kernels

Writes bench/results/dropout_<simd>.md and .json (or --out PREFIX).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import relpos

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import cpu_model, interleaved_median_ms  # noqa: E402

P = 0.1
B, H, D = 2, 12, 64


def scheme_of(name: str, rng: np.random.Generator):
    if name == "plain":
        return None
    if name == "t5":
        return relpos.T5(rng.standard_normal((H, 32)).astype(np.float32), bidirectional=True, max_distance=128)
    tables = (0.02 * rng.standard_normal((H, 512, D))).astype(np.float32)  # DeBERTa-v3's 256 buckets to 512
    return relpos.DeBERTa(c2p=tables, p2c=tables.copy(), position_buckets=256, max_relative_positions=512)


def relpos_step(L: int, scheme, threads: int, dropout_p: float, rng: np.random.Generator):
    """relpos.forward then relpos.backward (every gradient), with dropout at dropout_p (seed and
    offset new each call, as a training run's calls draw them)."""
    q, k, v, dout = (rng.standard_normal((B, H, L, D)).astype(np.float32) for _ in range(4))
    calls = iter(range(1 << 30))

    def run():
        kw = dict(threads=threads, dropout_p=dropout_p, dropout_seed=12345, dropout_offset=next(calls))
        out, lse = relpos.forward(q, k, v, scheme, **kw)
        relpos.backward(q, k, v, out, lse, dout, scheme, **kw)
    return run


def sdpa_step(L: int, dropout_p: float):
    q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, H, L, D)

    def run():
        for x in (q, k, v):
            x.grad = None
        F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p).backward(dout)
    return run


def rows(lengths, reps: int, threads: int) -> list[dict]:
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    out = []
    for L in lengths:
        for name in ("plain", "t5", "deberta"):
            scheme = scheme_of(name, rng)
            with_dropout, without = relpos_step(L, scheme, threads, P, rng), relpos_step(L, scheme, threads, 0.0, rng)
            dropped, plain = interleaved_median_ms([with_dropout, without], reps)
            out.append(dict(case=f"{name}, L = {L}", relpos_dropout_ms=dropped, relpos_ms=plain,
                            ratio=dropped / plain, target=1.15))
        sdpa, ours = interleaved_median_ms([sdpa_step(L, P), relpos_step(L, None, threads, P, rng)], reps)
        out.append(dict(case=f"SDPA with dropout / relpos with dropout, plain, L = {L}", relpos_dropout_ms=ours,
                        sdpa_dropout_ms=sdpa, ratio=sdpa / ours, target=None))
    return out


def markdown(rs: list[dict], meta: dict) -> str:
    lines = [f"# Attention dropout's cost, {meta['cpu']}, {meta['threads']} threads, relpos SIMD {meta['simd']}",
             "", f"Command: `{meta['command']}`; B = {B}, H = {H}, d = {D}, dropout {P}, forward+backward, "
             "float32, medians of alternating calls.", "",
             "| case | with dropout (ms) | without / peer (ms) | ratio | target |", "|---|---|---|---|---|"]
    for r in rs:
        other = r.get("relpos_ms", r.get("sdpa_dropout_ms"))
        target = f"<= {r['target']}x ({'met' if r['ratio'] <= r['target'] else 'not met'})" if r["target"] else \
            "speed (> 1: relpos faster)"
        lines.append(f"| {r['case']} | {r['relpos_dropout_ms']:.1f} | {other:.1f} | {r['ratio']:.3f}x | {target} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="L = 128 and 256, one rep: check that every row runs")
    ap.add_argument("--reps", type=int, default=5, help="calls of each side (median; default 5)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="output prefix (default bench/results/dropout_<simd>)")
    args = ap.parse_args()
    lengths, reps = ((128, 256), 1) if args.quick else ((512, 2048), args.reps)
    rs = rows(lengths, reps, args.threads)
    info = relpos.info()
    meta = dict(cpu=cpu_model(), threads=args.threads, simd=info["simd_target"],
                command="python bench/dropout.py" + (" --quick" if args.quick else ""))
    text = markdown(rs, meta)
    print(text)
    if args.quick:
        return
    prefix = Path(args.out or Path(__file__).resolve().parent / "results" / f"dropout_{info['simd_target'].lower()}")
    prefix.with_suffix(".md").write_text(text)
    prefix.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rs), indent=1) + "\n")


if __name__ == "__main__":
    main()
