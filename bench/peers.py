"""relpos against the PyTorch ways of computing the same attention: same shapes, same threads, one run.

    .venv/bin/python bench/peers.py                 # L = 512, 2048, 8192; forward and forward+backward
    .venv/bin/python bench/peers.py --quick         # L = 256, one rep: checks that every case runs

B=1, H=8, d=64, float32, causal (decoder) attention. Per scheme:

    none   relpos fused | torch SDPA (no bias)
    t5     relpos fused | SDPA with a materialised float bias (table gathered per bucket, causal -inf
           folded in) | flex_attention compiled, score_mod (a per-distance bias row) + causal block mask
    alibi  relpos fused | SDPA with a materialised bias | flex_attention compiled, score_mod -m_h |r|
    shaw   relpos fused, K+V tables (k=16, shared by heads) | plain PyTorch as OpenNMT-py writes it:
           relation tables materialised (L, L, d) and multiplied by relative_matmul
    xl     relpos fused | plain PyTorch as the original Transformer-XL writes it: (L, B, H, d) layout,
           r_net on the [sin, cos] sinusoid, AC + pad-view rel-shift of BD

Each case (scheme, implementation, mode, L) runs in its own subprocess: one warm-up call (compiles
flex_attention), `--reps` timed calls (median reported), then one call for peak memory: the
process's resident-set high-water mark is reset (/proc/self/clear_refs, 5) right before that call
and peak memory = VmHWM after it - VmRSS before it, i.e. what the call allocates on top of its
inputs, outputs and gradients included (torch's CPU allocator and relpos both get memory from
malloc; MALLOC_MMAP_THRESHOLD_ is fixed at 1 MiB so large blocks go back to the system when freed
instead of hiding in malloc's cache). Cases whose estimated peak exceeds --budget-gb are skipped
and listed as such. A forward case also reports the largest difference of the peer's output from
relpos's (a check that both compute the same function).

Writes bench/results/peers.json and bench/results/peers.md (or --out PREFIX), the markdown with a
table of the targets at L=2048; --render JSON rewrites the markdown of an earlier run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

B, H, D, SHAW_K, T5_BUCKETS, T5_MAX_DISTANCE, XL_POS_DIM = 1, 8, 64, 16, 32, 128, 512
SCHEMES = ("none", "t5", "alibi", "shaw", "xl")
PEERS = {
    "none": ("sdpa",),
    "t5": ("sdpa_bias", "flex"),
    "alibi": ("sdpa_bias", "flex"),
    "shaw": ("opennmt",),
    "xl": ("xl_original",),
}
IMPL_NAMES = {
    "relpos": "relpos fused",
    "sdpa": "SDPA, no bias",
    "sdpa_bias": "SDPA + materialised bias",
    "flex": "flex_attention (compiled)",
    "opennmt": "PyTorch, OpenNMT-py style",
    "xl_original": "PyTorch, Transformer-XL original",
}


# ---------------------------------------------------------------------------
# Estimated peak of each implementation (for the memory budget only).
# ---------------------------------------------------------------------------


def estimated_peak_bytes(impl: str, mode: str, L: int) -> float:
    """An estimate from the tensors each implementation materialises (checked against the
    peaks measured at L = 512 and 2048, with a margin)."""
    scores = B * H * L * L * 4  # one (H, L, L) float32 matrix
    backward = mode == "fwdbwd"
    if impl in ("relpos", "sdpa", "flex"):
        return 64 * B * H * L * D * 4  # O(L) buffers
    if impl == "sdpa_bias":
        return scores * (5 if backward else 3) + L * L * 8  # bias, masked bias, grad; bucket/distance index
    if impl == "opennmt":
        relations = L * L * D * 4  # one (L, L, d) table, keys and values each
        return relations * (6 if backward else 2) + scores * (6 if backward else 3)
    if impl == "xl_original":
        return scores * 5  # measured: ~4 (L, L, B, H) matrices live at the peak, forward or backward
    raise ValueError(impl)


# ---------------------------------------------------------------------------
# One case, inside its own subprocess.
# ---------------------------------------------------------------------------


def hf_relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """HF transformers T5Attention._relative_position_bucket (relative_position = key - query)."""
    import torch

    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if_large = max_exact + (torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
                            * (num_buckets - max_exact)).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, if_large)


def memory_kb() -> tuple[int, int]:
    status = Path("/proc/self/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))
    return rss, hwm


def build_case(scheme: str, impl: str, mode: str, L: int, threads: int):
    """Inputs and a zero-argument function running one forward (no grad) or forward+backward."""
    import torch
    import torch.nn.functional as F

    import relpos
    import relpos.torch as rt

    torch.manual_seed(0)
    backward = mode == "fwdbwd"
    scale = 1.0 if scheme == "t5" else None
    # T5 runs with scale 1: smaller inputs keep its logits in a realistic range.
    std = D**-0.25 if scheme == "t5" else 1.0
    layout = (L, B, H, D) if impl == "xl_original" else (B, H, L, D)

    def leaf(*shape, s=1.0):
        return (s * torch.randn(*shape)).requires_grad_(backward)

    q, k, v = leaf(*layout, s=std), leaf(*layout, s=std), leaf(*layout)
    dout = torch.randn(*layout)
    r = torch.arange(L)[None, :] - torch.arange(L)[:, None]  # key - query
    params = {}
    if scheme == "t5":
        params["table"] = leaf(H, T5_BUCKETS)
    elif scheme == "alibi":
        params["slopes"] = torch.tensor(relpos.alibi_slopes(H)).requires_grad_(backward)
    elif scheme == "shaw":
        params["wk"], params["wv"] = leaf(2 * SHAW_K + 1, D, s=0.5), leaf(2 * SHAW_K + 1, D, s=0.5)
    elif scheme == "xl":
        params["u"], params["v"] = leaf(H, D, s=0.1), leaf(H, D, s=0.1)
        params["w_r"] = leaf(H, D, XL_POS_DIM, s=XL_POS_DIM**-0.5)

    def relpos_scheme():
        p = params
        return {
            "none": lambda: relpos.NoPosition(),
            "t5": lambda: relpos.T5(p["table"], bidirectional=False, max_distance=T5_MAX_DISTANCE),
            "alibi": lambda: relpos.ALiBi(p["slopes"]),
            "shaw": lambda: relpos.Shaw(k=SHAW_K, wk=p["wk"], wv=p["wv"]),
            "xl": lambda: relpos.TransformerXL(p["u"], p["v"], p["w_r"]),
        }[scheme]()

    def as_bhld(x):  # the relpos view of a peer's tensor (no copy)
        return x.permute(1, 2, 0, 3) if impl == "xl_original" else x

    def run_relpos():
        return rt.attention(as_bhld(q), as_bhld(k), as_bhld(v), relpos_scheme(), causal=True, scale=scale,
                            threads=threads)

    future = r > 0
    if impl == "relpos":
        fn = run_relpos
    elif impl == "sdpa":
        def fn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif impl == "sdpa_bias":
        if scheme == "t5":
            index = hf_relative_position_bucket(r, False, T5_BUCKETS, T5_MAX_DISTANCE)

            def bias():
                return params["table"][:, index]
        else:
            distance = r.abs().to(torch.float32)

            def bias():
                return -params["slopes"][:, None, None] * distance

        def fn():
            mask = bias().masked_fill(future, float("-inf"))[None]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    elif impl == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        block_mask = create_block_mask(lambda b, h, qi, ki: ki <= qi, B, H, L, L, device="cpu")
        distances = torch.arange(-(L - 1), L)  # r = -(L-1) ... L-1, row index r + L - 1
        if scheme == "t5":
            bucket_of_r = hf_relative_position_bucket(distances, False, T5_BUCKETS, T5_MAX_DISTANCE)

            def score_mod(score, b, h, qi, ki):
                return score + row[h, ki - qi + L - 1]
        else:
            def score_mod(score, b, h, qi, ki):
                return score - params["slopes"][h] * (ki - qi).abs()
        compiled = torch.compile(flex_attention)

        def fn():
            nonlocal row
            if scheme == "t5":
                row = params["table"][:, bucket_of_r]  # (H, 2L-1): one bias per distance
            return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
        row = None
    elif impl == "opennmt":
        index = r.clamp(-SHAW_K, SHAW_K) + SHAW_K

        def relative_matmul(x, z, transpose):  # OpenNMT-py onmt/modules/multi_headed_attn.py
            batch_size, heads, length, _ = x.shape
            x_t = x.permute(2, 0, 1, 3).reshape(length, heads * batch_size, -1)
            x_tz = torch.matmul(x_t, z.transpose(1, 2) if transpose else z)
            return x_tz.reshape(length, batch_size, heads, -1).permute(1, 2, 0, 3)

        def fn():
            relations_keys, relations_values = params["wk"][index], params["wv"][index]  # (L, L, d) each
            query = q / math.sqrt(D)
            scores = torch.matmul(query, k.transpose(2, 3)) + relative_matmul(query, relations_keys, True)
            attn = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            return torch.matmul(attn, v) + relative_matmul(attn, relations_values, False)
    elif impl == "xl_original":
        inv_freq = 1 / (10000 ** (torch.arange(0.0, XL_POS_DIM, 2.0) / XL_POS_DIM))
        mask = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)[:, :, None, None]

        def rel_shift(x):  # kimiyoung/transformer-xl mem_transformer.py _rel_shift
            zero_pad = torch.zeros((x.size(0), 1, *x.size()[2:]), dtype=x.dtype)
            x_padded = torch.cat([zero_pad, x], dim=1).view(x.size(1) + 1, x.size(0), *x.size()[2:])
            return x_padded[1:].view_as(x)

        def fn():
            pos_seq = torch.arange(L - 1, -1, -1.0)
            sinusoid = torch.outer(pos_seq, inv_freq)
            pos_emb = torch.cat([sinusoid.sin(), sinusoid.cos()], -1)
            r_head_k = F.linear(pos_emb, params["w_r"].reshape(H * D, XL_POS_DIM)).view(L, H, D)
            ac = torch.einsum("ibnd,jbnd->ijbn", q + params["u"], k)
            bd = rel_shift(torch.einsum("ibnd,jnd->ijbn", q + params["v"], r_head_k))
            prob = torch.softmax(((ac + bd) / math.sqrt(D)).masked_fill(mask, float("-inf")), dim=1)
            return torch.einsum("ijbn,jbnd->ibnd", prob, v)
    else:
        raise ValueError(impl)

    leaves = [q, k, v, *params.values()]

    def call():
        if backward:
            out = fn()
            out.backward(dout)
            for x in leaves:
                x.grad = None
            return None
        with torch.no_grad():
            return fn()

    def check():
        """Largest |peer - relpos| of the forward outputs (same layout)."""
        with torch.no_grad():
            return float((fn() - as_bhld_back(run_relpos())).abs().max())

    def as_bhld_back(x):
        return x.permute(2, 0, 1, 3) if impl == "xl_original" else x

    return call, check


def run_case(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    rec = {"scheme": args.scheme, "impl": args.impl, "mode": args.mode, "L": args.L, "threads": args.threads}
    try:
        call, check = build_case(args.scheme, args.impl, args.mode, args.L, args.threads)
        t0 = time.perf_counter()
        call()  # warm-up: compiles flex_attention, JIT kernels, first-touch of the allocator
        rec["warmup_s"] = time.perf_counter() - t0
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        rec["time_s"] = statistics.median(times)
        rec["times_s"] = times
        rss_before, _ = memory_kb()
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        call()
        _, hwm = memory_kb()
        rec["peak_mb"] = (hwm - rss_before) / 1024
        if args.mode == "fwd" and args.impl != "relpos":
            rec["max_abs_diff_vs_relpos"] = check()
    except Exception as e:  # reported in the table, e.g. a peer unsupported on this device
        rec["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
    return rec


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def spawn(scheme, impl, mode, L, args) -> dict:
    cmd = [sys.executable, __file__, "--case", scheme, impl, mode, str(L), "--threads", str(args.threads),
           "--reps", str(args.reps)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="1048576", MALLOC_TRIM_THRESHOLD_="1048576",
               OMP_NUM_THREADS=str(args.threads))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.case_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.case_timeout} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return {"error": f"subprocess exit {p.returncode}: {tail}"}
    return json.loads(lines[-1])


def fmt_time(rec):
    return f"{rec['time_s'] * 1e3:.1f}" if "time_s" in rec else "-"


def fmt_mb(rec):
    return f"{max(rec['peak_mb'], 0.0):.1f}" if "peak_mb" in rec else "-"


def speed(peer, ours):
    return f"{peer['time_s'] / ours['time_s']:.2f}x" if "time_s" in peer and "time_s" in ours else "-"


MEMORY_FLOOR_MB = 1.0  # below this, a page-granular RSS delta says little


def memory_ratio(peer, ours):
    """peer peak / relpos peak; a lower bound when relpos stays under the floor."""
    if "peak_mb" not in peer or "peak_mb" not in ours:
        return "-"
    p, o = peer["peak_mb"], ours["peak_mb"]
    if o >= MEMORY_FLOOR_MB:
        return f"{p / o:.1f}x"
    if p >= MEMORY_FLOOR_MB:
        return f">{p / MEMORY_FLOOR_MB:.0f}x"
    return "both < 1 MB"


def markdown(results: list, meta: dict) -> str:
    lines = [
        f"# relpos vs PyTorch peers",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}; torch {meta['torch']}; {meta['threads']} threads; B={B}, H={H}, d={D}, "
        f"float32, causal; median of {meta['reps']} reps after one warm-up.  ",
        "Speed = peer time / relpos time; memory = peer peak / relpos peak (both > 1: relpos better; "
        "`>Nx` where relpos stayed under 1 MB, the resolution of the method). "
        "Peak = VmHWM during one call minus VmRSS before it (see bench/peers.py).",
        "",
        "| scheme | mode | L | peer | relpos ms | peer ms | speed | relpos MB | peer MB | memory | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_key = {(r["scheme"], r["mode"], r["L"], r["impl"]): r for r in results}
    for r in results:
        if r["impl"] == "relpos":
            continue
        ours = by_key.get((r["scheme"], r["mode"], r["L"], "relpos"), {})
        note = r.get("skipped") or r.get("error") or ours.get("error") or ""
        note = note.split(". ")[0]
        if "max_abs_diff_vs_relpos" in r:
            note = (note + "; " if note else "") + f"max diff {r['max_abs_diff_vs_relpos']:.1e}"
        lines.append(
            f"| {r['scheme']} | {r['mode']} | {r['L']} | {IMPL_NAMES[r['impl']]} | {fmt_time(ours)} | {fmt_time(r)} | "
            f"{speed(r, ours)} | {fmt_mb(ours)} | {fmt_mb(r)} | {memory_ratio(r, ours)} | {note} |")
    return "\n".join(lines + target_rows(results)) + "\n"


# Targets at L = 2048: relpos speed (and peak memory) against the fastest peer of each scheme.
TARGETS = {"none": (1.0, None), "t5": (1.5, None), "alibi": (1.5, None), "shaw": (3.0, 10.0), "xl": (3.0, 10.0)}
TARGET_L = 2048


def target_rows(results: list) -> list:
    """One line per (scheme, mode) at TARGET_L: the fastest peer that ran, and whether the targets hold."""
    lines = ["", f"Targets at L={TARGET_L} (against the fastest peer that ran; reported, not asserted):", "",
             "| scheme | mode | fastest peer | speed | target | memory | target | met |", "|---|---|---|---|---|---|---|---|"]
    for scheme, (speed_target, memory_target) in TARGETS.items():
        for mode in ("fwd", "fwdbwd"):
            rows = [r for r in results if r["scheme"] == scheme and r["mode"] == mode and r["L"] == TARGET_L]
            ours = next((r for r in rows if r["impl"] == "relpos"), None)
            peers = [r for r in rows if r["impl"] != "relpos" and "time_s" in r]
            if ours is None or "time_s" not in ours or not peers:
                continue
            best = min(peers, key=lambda r: r["time_s"])
            sp = best["time_s"] / ours["time_s"]
            mem = best["peak_mb"] / max(ours["peak_mb"], MEMORY_FLOOR_MB)
            met = sp >= speed_target and (memory_target is None or mem >= memory_target)
            lines.append(f"| {scheme} | {mode} | {IMPL_NAMES[best['impl']]} | {sp:.2f}x | >= {speed_target:g}x | "
                         f"{mem:.1f}x | {'-' if memory_target is None else f'>= {memory_target:g}x'} | "
                         f"{'yes' if met else 'no'} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="512,2048,8192")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--modes", default="fwd,fwdbwd")
    ap.add_argument("--budget-gb", type=float, default=12.0)
    ap.add_argument("--case-timeout", type=int, default=900)
    ap.add_argument("--quick", action="store_true", help="L=256, one rep: checks every case runs")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "peers"))
    ap.add_argument("--render", metavar="JSON", help="rewrite the markdown table of an earlier run's JSON")
    ap.add_argument("--case", nargs=4, metavar=("SCHEME", "IMPL", "MODE", "L"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.case:
        args.scheme, args.impl, args.mode, args.L = args.case[0], args.case[1], args.case[2], int(args.case[3])
        print(json.dumps(run_case(args)), flush=True)
        return
    if args.render:
        data = json.loads(Path(args.render).read_text())
        Path(args.render).with_suffix(".md").write_text(markdown(data["results"], data["meta"]))
        return
    if args.quick:
        args.lengths, args.reps = "256", 1
    lengths = [int(x) for x in args.lengths.split(",")]
    schemes = [s for s in args.schemes.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    for s in schemes:
        if s not in SCHEMES:
            sys.exit(f"peers.py: unknown scheme {s!r}; choose from {', '.join(SCHEMES)}")
    for m in modes:
        if m not in ("fwd", "fwdbwd"):
            sys.exit(f"peers.py: unknown mode {m!r}; choose fwd, fwdbwd")

    import torch

    results = []
    for scheme in schemes:
        for mode in modes:
            for L in lengths:
                for impl in ("relpos",) + PEERS[scheme]:
                    rec = {"scheme": scheme, "impl": impl, "mode": mode, "L": L, "threads": args.threads}
                    est = estimated_peak_bytes(impl, mode, L)
                    if est > args.budget_gb * 2**30:
                        rec["skipped"] = f"skipped: estimated peak {est / 2**30:.0f} GB > {args.budget_gb:g} GB budget"
                    else:
                        rec.update(spawn(scheme, impl, mode, L, args))
                    results.append(rec)
                    print(f"{scheme:6s} {mode:6s} L={L:5d} {impl:12s} time {fmt_time(rec):>9s} ms  "
                          f"peak {fmt_mb(rec):>6s} MB  {rec.get('skipped') or rec.get('error') or ''}", flush=True)

    meta = {
        "command": " ".join(["python", "bench/peers.py", *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "threads": args.threads,
        "reps": args.reps,
        "shapes": {"B": B, "H": H, "d": D, "shaw_k": SHAW_K, "t5_buckets": T5_BUCKETS, "xl_pos_dim": XL_POS_DIM},
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    Path(f"{out}.md").write_text(markdown(results, meta))
    print(f"wrote {out}.json and {out}.md")


if __name__ == "__main__":
    main()
