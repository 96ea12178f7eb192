"""Where a relpos.gpu call's time goes on one NVIDIA GPU: the host's time to enqueue it against
the kernels' own, for plain attention beside SDPA's flash kernel (bfloat16, B=4, H=16).

    python bench/gpu_host.py                # bench/results/gpu_host_<card>.txt (about a minute)
    python bench/gpu_host.py --out FILE

Per shape (d=64 causal L=4096, d=64 non-causal L=2048, d=128 causal L=4096) and call (relpos
forward, SDPA flash forward, relpos forward+backward): the host time per call of 50 calls
enqueued back to back (wall clock before the synchronisation), the wall time per call after it,
the forward's host time under torch.no_grad, and triton.testing.do_bench's median. A call
whose host time exceeds its kernels' runs at the host's pace: do_bench then measures the host.
Then torch.profiler's table of 10 forward+backward calls (each kernel's device time), and at
L=2048 cProfile's top functions of 100 forwards and 50 forward+backwards (the host's Python).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)  # the kernels compiled, not interpreted

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu as bench_gpu  # noqa: E402  (import_relpos, results_path, environment)

SHAPES = [(4096, 64, True), (2048, 64, False), (4096, 128, True)]


def per_call_ms(fn, calls: int) -> tuple[float, float]:
    """(host ms per call enqueuing ``calls`` calls, wall ms per call once the device is done)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e3
    torch.cuda.synchronize()
    return host, (time.perf_counter() - start) / calls * 1e3


def profile_text(statement: str, names: dict, rows: int = 18) -> str:
    profiler = cProfile.Profile()
    profiler.runctx(statement, names, names)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(rows)
    return out.getvalue()


def measure(report, S, gpu) -> None:
    import triton.testing
    from torch.profiler import ProfilerActivity, profile

    for L, d, causal in SHAPES:
        q, k, v = (torch.randn(4, 16, L, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)

        def ours():
            return gpu.attention(q, k, v, S.NoPosition(), causal=causal)

        def flash():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def ours_fb():
            return torch.autograd.grad(ours(), (q, k, v), dout)

        for fn in (ours, flash, ours_fb):  # compiled and warm
            for _ in range(3):
                fn()
        for name, fn in (("relpos fwd", ours), ("flash fwd", flash), ("relpos fwd+bwd", ours_fb)):
            host, wall = per_call_ms(fn, 50)
            line = f"L={L} d={d} causal={causal} {name}: host {host:.3f} ms/call, wall {wall:.3f}"
            if name != "relpos fwd+bwd":
                with torch.no_grad():
                    for _ in range(3):  # warm: without autograd SDPA may pick another kernel
                        fn()
                    line += f", no_grad host {per_call_ms(fn, 50)[0]:.3f}"
            report(line + f", do_bench {triton.testing.do_bench(fn, return_mode='median'):.3f}")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                ours_fb()
            torch.cuda.synchronize()
        report(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=60))
        if L == 2048:
            names = {"ours": ours, "ours_fb": ours_fb}
            report(profile_text("for _ in range(100): ours()", names))
            report(profile_text("for _ in range(50): ours_fb()", names))
        del q, k, v, dout
        bench_gpu.free_memory(torch.device("cuda"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the text file (default bench/results/gpu_host_<card>.txt)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("no CUDA device: bench/gpu_host.py times the host against the GPU's kernels")
    device = torch.device("cuda")
    out = args.out or bench_gpu.results_path(device, "gpu_host").with_suffix(".txt")
    S, gpu = bench_gpu.import_relpos()  # before environment(), which names the relpos.gpu it ran
    lines = [f"# relpos.gpu host time per call on {bench_gpu.card_name(device)}", "",
             *bench_gpu.environment(device, "bench/gpu_host.py"), ""]

    def report(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    measure(report, S, gpu)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
