"""The fused kernel's speed targets, measured as ratios in one run against PyTorch's SDPA
(its CPU flash kernel) and against relpos itself.

    .venv/bin/python bench/targets.py                 # every row, 2 threads (a few minutes)
    .venv/bin/python bench/targets.py --quick         # small sizes, one rep: checks that every row runs
    RELPOS_SIMD=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        .venv/bin/python bench/targets.py             # the AVX2 dispatch of relpos, oneDNN and torch (and
                                                      # torch's MKL, which runs AVX-512 on Intel CPUs without it)

Rows (float32; "speed" = peer time / relpos time, so > 1 means relpos is faster):

    plain     relpos fused vs SDPA without bias, B=1, H=8, L = 1024 ... 8192, causal and not,
              d = 64 and 128; forward and forward+backward                      target >= 1.0x
    encoder   T5 and ALiBi as an encoder runs them (B=2, H=12, d=64, L=1024, not causal; T5 with
              scale 1): forward against SDPA given the bias prebuilt outside the timed call (how HF
              runs T5), target >= 1.0x; forward+backward against SDPA with the bias built in the step
              from the T5 table (which receives its gradient) or the ALiBi slopes, target >= 1.5x
    overhead  each scheme's fused forward over plain fused attention, B=1, H=8, L=4096, d=64,
              causal: ALiBi, T5, RoPE <= 1.05x, Shaw K+V (k=64) <= 1.15x, Transformer-XL <= 1.4x
    threads   backward of one head (B=H=1, L=8192, d=64, causal): 1-thread time / 2-thread time,
              target >= 1.8x
    decode    one query (Lq=1) against Lk = 4096 and 32768 cached keys, B=8, H=8, d=64, ALiBi and
              T5: relpos vs SDPA given the prebuilt bias row                    target >= 1.0x
    bf16      plain attention stored in bfloat16, B=1, H=8, L=4096, d=128, causal, forward and
              forward+backward: against SDPA in bfloat16 (target >= 1.0x) and against relpos in
              float32 (target >= 1.5x where relpos runs bfloat16 products, >= 0.9x elsewhere)

Each timing is the median of --reps calls after one warm-up call; the calls of relpos and its
peer alternate, one of each in turn, in this process. Writes bench/results/targets_<simd>.md and .json (or --out PREFIX).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import relpos
import relpos.torch as rt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import hf_relative_position_bucket  # noqa: E402  (HF's bucket function, in torch)
from timing import cpu_model, interleaved_median_ms  # noqa: E402

T5_BUCKETS, T5_MAX_DISTANCE, SHAW_K, XL_POS_DIM = 32, 128, 64, 64


def leaves(*shapes, grad: bool):
    return [torch.randn(*s).requires_grad_(grad) for s in shapes]


def step(fn, grad: bool, *inputs):
    """fn(*inputs) forward, and backward with a fixed gradient when grad."""
    def run():
        for x in inputs:
            x.grad = None
        out = fn(*inputs)
        if grad:
            out.backward(torch.ones_like(out))
    return run


def distances(Lq: int, Lk: int, q_offset: int = 0) -> torch.Tensor:
    return torch.arange(Lk)[None, :] - (q_offset + torch.arange(Lq))[:, None]  # r = key - query


def alibi_bias(slopes: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return (-slopes[:, None, None] * r.abs().to(torch.float32))[None]


def t5_bias(table: torch.Tensor, r: torch.Tensor, bidirectional: bool) -> torch.Tensor:
    return table[:, hf_relative_position_bucket(r, bidirectional, T5_BUCKETS, T5_MAX_DISTANCE)][None]


def plain_rows(args, threads: int) -> list[dict]:
    rows = []
    for d in (64, 128):
        for causal in (True, False):
            for L in args.lengths:
                for grad in (False, True):
                    q, k, v = leaves(*[(1, 8, L, d)] * 3, grad=grad)
                    ours, peer = interleaved_median_ms(
                        [step(lambda q, k, v: rt.attention(q, k, v, causal=causal, threads=threads), grad, q, k, v),
                         step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), grad, q, k, v)],
                        args.reps)
                    rows.append({"group": "plain", "case": f"L={L} d={d} {'causal' if causal else 'full'}",
                                 "mode": "fwd+bwd" if grad else "fwd", "peer": "SDPA", "relpos_ms": ours,
                                 "peer_ms": peer, "ratio": peer / ours, "target": 1.0})
    return rows


def encoder_rows(args, threads: int) -> list[dict]:
    B, H, d, L = 2, 12, 64, args.encoder_length
    r = distances(L, L)
    rows = []
    for name in ("t5", "alibi"):
        for grad in (False, True):
            q, k, v = leaves(*[(B, H, L, d)] * 3, grad=grad)
            if name == "t5":
                table = (0.5 * torch.randn(H, T5_BUCKETS)).requires_grad_(grad)
                scheme, scale = relpos.T5(table, bidirectional=True, max_distance=T5_MAX_DISTANCE), 1.0
                build = lambda: t5_bias(table, r, True)  # noqa: E731
                extra = (table,)
            else:
                slopes = torch.tensor(relpos.alibi_slopes(H), dtype=torch.float32)
                scheme, scale = relpos.ALiBi(), None
                build = lambda: alibi_bias(slopes, r)  # noqa: E731
                extra = ()
            ours_fn = step(lambda q, k, v, *_: rt.attention(q, k, v, scheme, scale=scale, threads=threads),
                           grad, q, k, v, *extra)
            if grad:  # the bias is part of the step: HF builds position_bias in every forward
                peer_fn = lambda q, k, v, *_: F.scaled_dot_product_attention(q, k, v, attn_mask=build(), scale=scale)  # noqa: E731
                peer_name = "SDPA, bias built in the step"
            else:
                prebuilt = build().detach()
                peer_fn = lambda q, k, v, *_: F.scaled_dot_product_attention(q, k, v, attn_mask=prebuilt, scale=scale)  # noqa: E731
                peer_name = "SDPA, prebuilt bias"
            ours, peer = interleaved_median_ms([ours_fn, step(peer_fn, grad, q, k, v, *extra)], args.reps)
            rows.append({"group": "encoder", "case": f"{name} B={B} H={H} L={L} d={d} full",
                         "mode": "fwd+bwd" if grad else "fwd", "peer": peer_name, "relpos_ms": ours, "peer_ms": peer,
                         "ratio": peer / ours, "target": 1.5 if grad else 1.0})
    return rows


def overhead_rows(args, threads: int) -> list[dict]:
    H, d, L = 8, 64, args.overhead_length
    q, k, v = leaves(*[(1, H, L, d)] * 3, grad=False)
    schemes = {
        "alibi": (relpos.ALiBi(), 1.05),
        "t5": (relpos.T5(0.5 * torch.randn(H, T5_BUCKETS), bidirectional=False), 1.05),
        "rope": (relpos.RoPE(), 1.05),
        "shaw k=64 K+V": (relpos.Shaw(SHAW_K, wk=torch.randn(2 * SHAW_K + 1, d), wv=torch.randn(2 * SHAW_K + 1, d)),
                          1.15),
        "transformer-xl": (relpos.TransformerXL(torch.randn(H, d), torch.randn(H, d),
                                                0.1 * torch.randn(H, d, XL_POS_DIM)), 1.4),
    }
    rows = []
    for name, (scheme, target) in schemes.items():  # plain attention timed beside each scheme
        plain, ours = interleaved_median_ms([lambda: rt.attention(q, k, v, causal=True, threads=threads),
                                             lambda: rt.attention(q, k, v, scheme, causal=True, threads=threads)],
                                            args.reps)
        rows.append({"group": "overhead", "case": f"{name} L={L} d={d} causal", "mode": "fwd",
                     "peer": "relpos plain fused", "relpos_ms": ours, "peer_ms": plain, "ratio": ours / plain,
                     "target": target, "at_most": True})
    return rows


def thread_rows(args, threads: int) -> list[dict]:
    L = args.thread_length
    q, k, v = leaves(*[(1, 1, L, 64)] * 3, grad=True)
    def backward(n):
        out = rt.attention(q, k, v, causal=True, threads=n)
        grad = torch.ones_like(out)
        def run():
            q.grad = k.grad = v.grad = None
            out.backward(grad, retain_graph=True)
        return run
    one, many = interleaved_median_ms([backward(1), backward(threads)], args.reps)
    return [{"group": "threads", "case": f"backward B=1 H=1 L={L} d=64 causal", "mode": "bwd",
             "peer": f"relpos on 1 thread vs {threads}", "relpos_ms": many, "peer_ms": one, "ratio": one / many,
             "target": 1.8}]


def decode_rows(args, threads: int) -> list[dict]:
    B, H, d = 8, 8, 64
    rows = []
    for Lk in args.decode_lengths:
        q, k, v = leaves((B, H, 1, d), (B, H, Lk, d), (B, H, Lk, d), grad=False)
        r = distances(1, Lk, q_offset=Lk - 1)
        table = 0.5 * torch.randn(H, T5_BUCKETS)
        for name, scheme, scale, bias in (
            ("alibi", relpos.ALiBi(), None, alibi_bias(torch.tensor(relpos.alibi_slopes(H), dtype=torch.float32), r)),
            ("t5", relpos.T5(table, bidirectional=False), 1.0, t5_bias(table, r, False)),
        ):
            ours, peer = interleaved_median_ms(
                [lambda: rt.attention(q, k, v, scheme, q_offset=Lk - 1, scale=scale, threads=threads),
                 lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)], args.reps)
            rows.append({"group": "decode", "case": f"{name} Lq=1 Lk={Lk} B={B} H={H} d={d}", "mode": "fwd",
                         "peer": "SDPA, prebuilt bias row", "relpos_ms": ours, "peer_ms": peer,
                         "ratio": peer / ours, "target": 1.0})
    return rows


def bf16_rows(args, threads: int) -> list[dict]:
    rows = []
    L, d = args.bf16_length, 128
    # 1.5x where relpos runs bfloat16 products (the CPU has AVX512-BF16 or AMX and oneDNN's ISA is not
    # limited below it), 0.9x where bfloat16 is widened to float32
    float_target = 1.5 if relpos.info()["gemm_bf16"].startswith("bfloat16 products") else 0.9
    for grad in (False, True):
        q, k, v = leaves(*[(1, 8, L, d)] * 3, grad=False)
        half = [x.bfloat16().requires_grad_(grad) for x in (q, k, v)]
        single = [x.requires_grad_(grad) for x in (q, k, v)]
        ours = step(lambda q, k, v: rt.attention(q, k, v, causal=True, threads=threads), grad, *half)
        sdpa = step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), grad, *half)
        ours32 = step(lambda q, k, v: rt.attention(q, k, v, causal=True, threads=threads), grad, *single)
        ours_ms, sdpa_ms, ours32_ms = interleaved_median_ms([ours, sdpa, ours32], args.reps)
        mode, case = "fwd+bwd" if grad else "fwd", f"L={L} d={d} causal bfloat16"
        rows.append({"group": "bf16", "case": case, "mode": mode, "peer": "SDPA bf16", "relpos_ms": ours_ms,
                     "peer_ms": sdpa_ms, "ratio": sdpa_ms / ours_ms, "target": 1.0})
        rows.append({"group": "bf16", "case": case, "mode": mode, "peer": "relpos float32", "relpos_ms": ours_ms,
                     "peer_ms": ours32_ms, "ratio": ours32_ms / ours_ms, "target": float_target})
    return rows


def met(row: dict) -> bool:
    return row["ratio"] <= row["target"] if row.get("at_most") else row["ratio"] >= row["target"]


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# Fused-kernel targets",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}; relpos SIMD target {meta['simd']}, GEMM ISA {meta['gemm_isa']}; "
        f"torch {meta['torch']} (CPU capability {meta['torch_cpu']}); {meta['threads']} threads; float32 "
        "(bf16 rows: bfloat16); "
        f"median of {meta['reps']} after one warm-up.  ",
        "Ratio: peer time / relpos time (overhead rows: scheme time / plain time; threads row: 1-thread "
        "time / multi-thread time).",
        "",
        "| group | case | mode | against | relpos ms | other ms | ratio | target | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        target = f"{'<=' if r.get('at_most') else '>='} {r['target']:.2f}x"
        lines.append(f"| {r['group']} | {r['case']} | {r['mode']} | {r['peer']} | {r['relpos_ms']:.2f} | "
                     f"{r['peer_ms']:.2f} | {r['ratio']:.3f}x | {target} | {'yes' if met(r) else 'no'} |")
    n = sum(met(r) for r in rows)
    lines += ["", f"{n} of {len(rows)} rows meet their target.", ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 2048, 4096, 8192],
                        help="plain attention lengths (comma-separated)")
    parser.add_argument("--groups", default="plain,encoder,overhead,threads,decode,bf16",
                        help="which rows to run (comma-separated)")
    parser.add_argument("--quick", action="store_true", help="small sizes and one rep: checks that every row runs")
    parser.add_argument("--out", default=None, help="output prefix (default bench/results/targets_<simd>)")
    args = parser.parse_args()
    args.encoder_length, args.overhead_length, args.thread_length = 1024, 4096, 8192
    args.decode_lengths, args.bf16_length = [4096, 32768], 4096
    if args.quick:
        args.reps, args.lengths, args.encoder_length = 1, [256], 256
        args.overhead_length, args.thread_length, args.decode_lengths, args.bf16_length = 256, 512, [512], 256
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    info = relpos.info()
    meta = {"command": " ".join([".venv/bin/python", "bench/targets.py"] + sys.argv[1:]),
            "machine": f"{cpu_model()} ({platform.machine()}), {torch.get_num_threads()} torch threads",
            "simd": info["simd_target"], "gemm_isa": info["gemm_isa"], "torch": torch.__version__,
            "torch_cpu": torch.backends.cpu.get_cpu_capability(), "threads": args.threads, "reps": args.reps}
    runners = {"plain": plain_rows, "encoder": encoder_rows, "overhead": overhead_rows, "threads": thread_rows,
               "decode": decode_rows, "bf16": bf16_rows}
    rows = []
    for group in args.groups.split(","):
        if group not in runners:
            parser.error(f"--groups: unknown group {group!r} (known: {', '.join(runners)})")
        with torch.no_grad() if group in ("overhead", "decode") else torch.enable_grad():
            for row in runners[group](args, args.threads):
                rows.append(row)
                print(f"{row['group']:9s} {row['case']:38s} {row['mode']:8s} relpos {row['relpos_ms']:9.2f} ms  "
                      f"other {row['peer_ms']:9.2f} ms  {row['ratio']:.3f}x  {'met' if met(row) else 'not met'}",
                      flush=True)
    prefix = Path(args.out or f"bench/results/targets_{info['simd_target'].lower()}")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    Path(f"{prefix}.md").write_text(markdown(rows, meta))
    print(f"wrote {prefix}.md and {prefix}.json")


if __name__ == "__main__":
    main()
