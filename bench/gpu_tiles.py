"""Launch configurations of relpos.gpu's kernels on one GPU, side by side: a scheme's attention
(bfloat16, B=4, H=16, causal L=4096, d=64 and 128) timed forward and forward+backward with
each (block_m, block_n, warps, stages) given to all three kernels, or one per kernel, beside SDPA's flash kernel
in the same run. Plain attention's configurations are first checked against SDPA flash's
output and gradients; a scheme's (--schemes shaw,deberta: Shaw's key and value tables at
k = 16, DeBERTa-v3-base's c2p and p2c) against those of the configuration config.launch_for
ships, timed first, the tables' gradients included (relative max error under 2e-2, bfloat16
against bfloat16). One that does not fit the card's shared memory is a row saying so. What
config.launch_for's choices rest on.

    python bench/gpu_tiles.py                  # bench/results/gpu_tiles_<card>.md
    python bench/gpu_tiles.py --schemes none,shaw,deberta --budget-s 240
    python bench/gpu_tiles.py --dtype float32 --schemes none,shaw,deberta   # ..._float32.md
    python bench/gpu_tiles.py --smoke --out /tmp/tiles.md   # tiny sizes, Triton's interpreter

--dtype float32 runs float32 inputs with TF32 off (torch's default), where the kernels multiply
in TF32 three times on the tensor cores (launch.precisions); rows marked ieee force exact float32
products (the CUDA cores; the tables' run merges excepted, kernels._merge_runs) to show what that choice saves and how far its results are from them.
Every configuration there, plain attention's too, is checked against the shipped one (relative
error under 1e-4), plain attention's shipped row and SDPA's against float64 too (f64 in the
error column); the baseline is SDPA's memory-efficient kernel (flash takes no float32).

The configuration is given by replacing relpos.gpu.launch's launch_for for the run (the
kernels take any tile sizes; the masks cover partial tiles).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

SMOKE = __name__ == "__main__" and "--smoke" in sys.argv[1:]
if SMOKE:  # before Triton is imported (torch may import it)
    os.environ["TRITON_INTERPRET"] = "1"
elif __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu as bench_gpu  # noqa: E402  (import_relpos, time_ms, free_memory, card_name)
import gpu_forms as forms  # noqa: E402
from gpu_schemes import scheme_record, scheme_values  # noqa: E402

# (block_m, block_n, warps, stages) per scheme kind (plain; tables per distance) and head size, for
# all three kernels; or three of them, the forward's, the dk, dv kernel's and the dq kernel's (config.Launches):
# the dk, dv kernel holds a key tile and walks query tiles, the forward and dq kernels the reverse, so the
# backward's two want tiles long on opposite sides (Triton's fused-attention tutorial: 32 x 128 and 128 x 32).
# The per-kernel rows are ones the compile check finds without spills on sm_90 in bfloat16 (the shipped
# 64 x 64 in 4 warps spills 40 bytes per thread in the dk, dv kernel at head 64 and 524 at head 128;
# 32 x 128 in 4 warps 336-380 at head 64, in 8 warps none).
CANDIDATES = {
    64: [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 32, 4, 3), (64, 128, 4, 2),
         (128, 128, 8, 2), (64, 32, 4, 3),
         ((128, 64, 8, 3), (32, 128, 8, 2), (128, 64, 8, 2)), ((64, 64, 4, 2), (32, 128, 8, 3), (128, 32, 4, 2)),
         ((128, 64, 8, 3), (16, 128, 8, 2), (128, 32, 4, 2))],
    128: [(64, 64, 8, 2), (64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 8, 3), (64, 32, 4, 3), (128, 64, 8, 1),
          ((128, 64, 8, 2), (32, 64, 8, 2), (128, 32, 8, 2)), ((64, 64, 4, 2), (16, 128, 8, 2), (64, 32, 4, 2))],
}
# Tables per distance take square tiles: a tile pair's band of BM + BN distances is a tl.arange,
# whose length must be a power of two.
TABLE_CANDIDATES = {
    64: [(64, 64, 8, 2), (64, 64, 4, 3), (32, 32, 4, 2), (64, 64, 8, 3)],
    128: [(32, 32, 4, 2), (64, 64, 8, 2), (64, 64, 8, 1), (32, 32, 4, 3)],
}
# float32 with TF32 off, (..., precision): TF32 x 3 (shipped: launch_for's split_float32 tiles) at
# other tiles, and exact float32 products at the small tiles that path needs (spills: compile_check).
FLOAT32_CANDIDATES = {
    64: [(64, 64, 4, 2, "tf32x3"), (32, 32, 4, 2, "tf32x3"), (32, 32, 4, 2, "ieee")],
    128: [(64, 64, 8, 1, "tf32x3"), (64, 64, 4, 1, "tf32x3"), (16, 16, 4, 1, "ieee")],
}
FLOAT32_TABLE_CANDIDATES = {
    64: [(64, 64, 4, 1, "tf32x3"), (64, 64, 4, 2, "tf32x3"), (32, 32, 4, 1, "ieee")],
    128: [(32, 32, 4, 1, "tf32x3"), (16, 16, 4, 1, "tf32x3"), (32, 32, 8, 1, "ieee")],
}
SMOKE_CANDIDATES = {16: [(16, 16, 4, 1), (32, 16, 4, 1), ((32, 16, 4, 1), (16, 32, 4, 1), (32, 16, 4, 1))]}
SMOKE_TABLE_CANDIDATES = {16: [(16, 16, 4, 1), (32, 32, 4, 1)]}
SCHEMES = ("none", "shaw", "deberta")
SHAW_K = 16
TOLERANCE = 2e-2
FLOAT32_TOLERANCE = 1e-4


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp(min=1e-30)).item()


def _scheme(S, name: str, H: int, d: int, device, dtype):
    """The scheme record and its learnable tensors (leaves of ``dtype``) for ``name``."""
    tensors = {f: t.to(device=device, dtype=dtype).requires_grad_()
               for f, t in scheme_values(name, H, d, SHAW_K).items()}
    return scheme_record(S, name, tensors, True, SHAW_K), list(tensors.values())


def _timed_row(row, base, fn, grads, device, reps):
    row["fwd"] = bench_gpu.time_ms(fn, device, reps)
    row["fb"] = bench_gpu.time_ms(grads, device, reps)
    row["fwd_x"], row["fb_x"] = base["fwd"] / row["fwd"], base["fb"] / row["fb"]
    bench_gpu.log(f"{row['scheme']} d={row['d']} {row['config']}: fwd {row['fwd']:.3f} ms ({row['fwd_x']:.2f}x "
                  f"SDPA), fwd+bwd {row['fb']:.3f} ms ({row['fb_x']:.2f}x SDPA)")


def sweep(args, device, written=lambda rows: None) -> list[dict]:
    """Every row; ``written(rows)`` after each configuration, so that a run stopped from
    outside keeps the report of what it measured."""
    S, gpu = bench_gpu.import_relpos()
    launch_module = sys.modules["relpos.gpu.launch"]
    shipped = launch_module.launch_for
    from relpos.gpu.config import Launch, Launches

    B, H, L = (1, 2, 32) if args.smoke else (4, 16, 4096)
    reps = 3 if args.smoke else 1
    dtype = getattr(torch, args.dtype)
    float32_default = dtype == torch.float32 and device.type == "cuda"
    if float32_default:  # torch's default, set here in case the environment changed it
        torch.backends.cuda.matmul.allow_tf32 = False
    tolerance = FLOAT32_TOLERANCE if float32_default else TOLERANCE
    shipped_precisions = launch_module.precisions
    rows = []
    for name in args.schemes:
        if args.smoke:
            candidates = SMOKE_CANDIDATES if name == "none" else SMOKE_TABLE_CANDIDATES
        elif float32_default:
            candidates = FLOAT32_CANDIDATES if name == "none" else FLOAT32_TABLE_CANDIDATES
        else:
            candidates = CANDIDATES if name == "none" else TABLE_CANDIDATES
        for d, configs in candidates.items():
            gen = torch.Generator().manual_seed(d)

            def leaf(*shape):
                return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype).requires_grad_()

            q, k, v = leaf(B, H, L, d), leaf(B, H, L, d), leaf(B, H, L, d)
            dout = torch.randn(B, H, L, d, generator=gen).to(device=device, dtype=dtype)
            scheme, tables = _scheme(S, name, H, d, device, dtype)
            inputs = (q, k, v, *tables)

            def flash():
                if not float32_default:
                    return forms.sdpa_flash(q, k, v, causal=True, scale=d ** -0.5)
                with forms.sdpa_kernel(forms.SDPBackend.EFFICIENT_ATTENTION):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                            scale=d ** -0.5)

            def ours():
                return gpu.attention(q, k, v, scheme, causal=True, scale=d ** -0.5)

            def grads(fn, wrt):
                return lambda: torch.autograd.grad(fn(), wrt, dout)

            base = {"scheme": name, "d": d, "config": "SDPA efficient" if float32_default else "SDPA flash",
                    "fwd": bench_gpu.time_ms(flash, device, reps),
                    "fb": bench_gpu.time_ms(grads(flash, (q, k, v)), device, reps)}
            rows.append(base)
            exact = None
            if float32_default and name == "none":  # float64 of the same values, SDPA's math kernel
                q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
                with forms.sdpa_kernel(forms.SDPBackend.MATH):
                    out64 = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=True,
                                                                             scale=d ** -0.5)
                exact = [out64.detach(), *torch.autograd.grad(out64, (q64, k64, v64), dout.double())]
                del q64, k64, v64, out64
                base["error64"] = max(relative_error(g, w) for g, w in zip([flash().detach(),
                                                                            *grads(flash, (q, k, v))()], exact))
            bench_gpu.log(f"{name} d={d} {base['config']}: fwd {base['fwd']:.3f} ms, fwd+bwd {base['fb']:.3f} ms")
            if name == "none" and not float32_default:
                want = [flash().detach(), *grads(flash, (q, k, v))()]
            else:  # the shipped configuration, timed, is the reference of the others
                launch_module.launch_for = shipped
                split = shipped_precisions(dtype, device.type)[0] == "tf32x3"
                cfg = shipped(d, device.type == "cuda", dtype.itemsize, name != "none", split_float32=split)
                row = {"scheme": name, "d": d, "config": _label(cfg) + " (launch_for)"}
                rows.append(row)
                want = [ours().detach(), *grads(ours, inputs)()]
                if exact is not None:
                    row["error64"] = max(relative_error(g, w) for g, w in zip(want, exact))
                _timed_row(row, base, ours, grads(ours, inputs), device, reps)
            for config in configs:
                precision = config[4] if len(config) > 4 else None
                launches = _launches(Launch, Launches, config)
                row = {"scheme": name, "d": d, "config": _label(launches) + (f" {precision}" if precision else "")}
                rows.append(row)
                if time.perf_counter() - bench_gpu.T0 > args.budget_s:
                    row["note"] = "skipped: time budget"
                    continue
                launch_module.launch_for = lambda *_, _c=launches, **__: _c
                launch_module.precisions = (lambda *_, _p=precision: (_p, _p)) if precision else shipped_precisions
                try:
                    got = [ours().detach(), *grads(ours, inputs)()]
                    row["error"] = max(relative_error(g, w) for g, w in zip(got, want))
                    if row["error"] <= tolerance:
                        _timed_row(row, base, ours, grads(ours, inputs), device, reps)
                    else:
                        row["note"] = f"FAILED: relative error {row['error']:.2e} > {tolerance}"
                except Exception as e:  # shared memory beyond the card's, a compile error: a row of the table
                    row["note"] = f"failed: {bench_gpu.first_line(e)}"
                    bench_gpu.log(f"{name} d={d} {row['config']}: {row['note']}")
                bench_gpu.free_memory(device)
                written(rows)
            launch_module.launch_for, launch_module.precisions = shipped, shipped_precisions
            del q, k, v, dout, tables, scheme, exact
            bench_gpu.free_memory(device)
    return rows


def _launches(Launch, Launches, config):
    """A candidate as config.Launches: one (block_m, block_n, warps, stages[, precision]) for all
    three kernels, or three of them."""
    if isinstance(config[0], tuple):
        return Launches(*(Launch(*c) for c in config))
    return Launches.every(Launch(*config[:4]))


def _label(launches) -> str:
    """``64x64 w4 s2``, or per kernel ``fwd 128x64 w4 s3, kv 32x128 w4 s3, q 128x32 w4 s3``."""
    def one(cfg):
        return f"{cfg.block_m}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"

    kernels = {"fwd": launches.forward, "kv": launches.backward_kv, "q": launches.backward_q}
    if len(set(kernels.values())) == 1:
        return one(launches.forward)
    return ", ".join(f"{name} {one(cfg)}" for name, cfg in kernels.items())


def report(rows: list[dict], device, dtype: str) -> str:
    peer = "SDPA flash" if dtype == "bfloat16" else "SDPA efficient"
    precision = "" if dtype == "bfloat16" else " with TF32 off (torch's default)"
    reference = "SDPA flash's (plain) or " if dtype == "bfloat16" else ""
    lines = [f"# relpos.gpu launch configurations on {bench_gpu.card_name(device)}", "",
             *bench_gpu.environment(device, "bench/gpu_tiles.py"), "",
             f"{dtype}{precision}, causal, B=4, H=16, L=4096; (block_m x block_n, warps, stages) given to the "
             "forward and both backward kernels (or per kernel: fwd, kv = dk and dv, q = dq); medians in ms "
             "(triton.testing.do_bench); bwd = fwd+bwd - fwd; "
             f"x SDPA = {peer}'s time (no positions, same shape) / the row's; error = max relative error of the "
             f"output and gradients against {reference}the configuration launch_for ships (Shaw's tables, "
             f"k = {SHAW_K}; DeBERTa's, span 256), the tables' gradients included.",
             "", "| scheme | d | config | fwd | fwd+bwd | bwd | x SDPA fwd | x SDPA fwd+bwd | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "fb" not in r:
            lines.append(f"| {r['scheme']} | {r['d']} | {r['config']} | {r.get('note', '')} | | | | | |")
            continue
        error = " ".join(([f"{r['error']:.1e}"] if "error" in r else [])
                         + ([f"(f64 {r['error64']:.1e})"] if "error64" in r else []))
        lines.append(f"| {r['scheme']} | {r['d']} | {r['config']} | {r['fwd']:.3f} | {r['fb']:.3f} | "
                     f"{r['fb'] - r['fwd']:.3f} | {r.get('fwd_x', 1.0):.2f} | {r.get('fb_x', 1.0):.2f} | {error} |")
    lines.append("")
    for name, d in sorted({(r["scheme"], r["d"]) for r in rows}):
        ran = [r for r in rows if (r["scheme"], r["d"]) == (name, d) and not r["config"].startswith("SDPA")
               and "fb" in r]
        if ran:
            fwd = min(ran, key=lambda r: r["fwd"])
            bwd = min(ran, key=lambda r: r["fb"] - r["fwd"])
            lines.append(f"- {name}, d={d}: fastest forward {fwd['config']} ({fwd['fwd_x']:.2f}x SDPA), fastest "
                         f"backward {bwd['config']} ({bwd['fb'] - bwd['fwd']:.3f} ms)")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU tensors under Triton's interpreter")
    parser.add_argument("--out", type=Path, help="the markdown file (default bench/results/gpu_tiles_<card>.md)")
    parser.add_argument("--budget-s", type=float, default=240.0,
                        help="seconds from start after which no configuration starts (default 240)")
    parser.add_argument("--schemes", type=lambda text: tuple(text.split(",")), default=("none",),
                        help=f"comma list of {', '.join(SCHEMES)} (default none)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="the inputs' type; float32 runs with TF32 off (default bfloat16)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.schemes) - set(SCHEMES))
    if unknown:
        parser.error(f"--schemes: unknown {', '.join(unknown)} (known: {', '.join(SCHEMES)})")
    device = bench_gpu.device_for(args, parser)
    out = args.out or bench_gpu.results_path(device, "gpu_tiles" + ("" if args.dtype == "bfloat16" else "_float32"))
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = sweep(args, device, lambda rows: out.write_text(report(rows, device, args.dtype)))
    text = report(rows, device, args.dtype)
    out.write_text(text)
    print(text, flush=True)
    failed = [r for r in rows if r.get("note", "").startswith("FAILED")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
