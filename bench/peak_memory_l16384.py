#!/usr/bin/env python3
# Run: OMP_NUM_THREADS=1 .venv/bin/python bench/peak_memory_l16384.py
# Peak resident memory of relpos fused attention at L = 16384 (B=1, H=8, d=64, causal):
# the rise of the process's high-water mark during forward and backward, against the
# inputs and outputs, and against one (L, L) float32 matrix (1 GiB).
import resource, time, numpy as np, relpos
L, H, d = 16384, 8, 64
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, H, L, d), dtype=np.float32) for _ in range(3))
dout = rng.standard_normal((1, H, L, d), dtype=np.float32)
tensor_mb = q.nbytes / 2**20
schemes = {"alibi": relpos.ALiBi(), "xl": relpos.TransformerXL(u=np.zeros((H, d), np.float32), v=np.zeros((H, d), np.float32), w_r=0.05 * rng.standard_normal((H, d, d)).astype(np.float32))}
for name, scheme in schemes.items():
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.time(); out, lse = relpos.forward(q, k, v, scheme, causal=True, algorithm="fused"); tf = time.time() - t
    after_fwd = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.time(); g = relpos.backward(q, k, v, out, lse, dout, scheme, causal=True, algorithm="fused"); tb = time.time() - t
    after_bwd = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{name}: one (L,d) tensor {tensor_mb:.0f} MB; peak RSS rise forward {after_fwd - base:.0f} MB (outputs: out {tensor_mb:.0f} MB + lse), "
          f"backward {after_bwd - after_fwd:.0f} MB more (outputs dq dk dv {3 * tensor_mb:.0f} MB); one (L, L) matrix = 1024 MB; fwd {tf:.1f} s bwd {tb:.1f} s")
    del out, lse, g
