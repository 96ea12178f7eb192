"""Runs inside the fresh venv of tests/wheel/check.sh, with only the wheel and NumPy
installed: relpos.forward on NumPy arrays, every algorithm that serves the call, against
a softmax attention written here in float64 NumPy; then the shared libraries mapped
into this process, read from /proc/self/maps: each one that the wheel bundles
(relpos.libs: oneDNN, Highway, libgomp, ...) must be mapped from the venv, and no
other copy of it (the system's) may be mapped at all."""
import os
import sys
import sysconfig

import numpy as np

import relpos

site = os.path.realpath(sysconfig.get_path("platlib"))
assert os.path.realpath(relpos.__file__).startswith(site + os.sep), f"relpos imported from {relpos.__file__}, not {site}"


def attention(q, k, v, causal):
    """softmax(q k^T / sqrt(d)) v in float64, the future masked when causal."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tri(s.shape[-2], s.shape[-1], dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


rng = np.random.default_rng(32)
q, k, v = (rng.standard_normal((2, 3, 37, 16)).astype(np.float32) for _ in range(3))
runs = 0
for causal in (False, True):
    want = attention(q, k, v, causal)
    for algorithm in relpos.available_algorithms(q, k, v, causal=causal):
        out, lse = relpos.forward(q, k, v, causal=causal, algorithm=algorithm)
        err = float(np.abs(out - want).max())
        assert out.shape == want.shape and err < 1e-5, f"{algorithm}, causal={causal}: max error {err}"
        if causal:  # row 0 sees key 0 only: its output is v's row 0
            np.testing.assert_allclose(out[:, :, 0], v[:, :, 0], rtol=0, atol=1e-6)
        runs += 1
assert runs >= 2, f"only {runs} runs"

bundled = os.listdir(os.path.join(site, "relpos.libs"))
stems = {name.split("-")[0] for name in bundled}  # libdnnl-<hash>.so.2.6 -> libdnnl
with open("/proc/self/maps") as maps:
    mapped = {line.split()[-1] for line in maps if ".so" in line.split()[-1]}
ours = [p for p in mapped if os.path.basename(p).split("-")[0].split(".so")[0] in stems]
outside = [p for p in ours if not os.path.realpath(p).startswith(site + os.sep)]
assert not outside, f"bundled libraries mapped from outside the venv: {outside}"
assert any("/relpos.libs/libdnnl-" in p for p in ours), f"oneDNN of the wheel not mapped: {sorted(mapped)}"
info = relpos.info()
print(f"wheel check: {runs} forward calls agree with NumPy; {info['gemm']}; SIMD {info['simd_target']}")
print("wheel check: mapped from the wheel:", " ".join(sorted(os.path.relpath(p, site) for p in ours)))
sys.exit(0)
