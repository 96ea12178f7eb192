"""One relpos forward and backward call (float32, B = 1, H = 2, d = 64, one
thread) for counting instructions under callgrind, where timings of a shared
machine are too noisy to see a 1% change:

    valgrind --tool=callgrind --collect-atstart=no \\
      --toggle-collect='*attention_forward*' --toggle-collect='*attention_backward*' \\
      python bench/nonfinite_cost_probe.py 1024 causal alibi

Arguments: L, causal | full, none | alibi | shaw_kv | xl. Results:
bench/results/nonfinite_instruction_counts_zen3.txt."""
import sys

import numpy as np

import relpos

L, causal, name = int(sys.argv[1]), sys.argv[2] == "causal", sys.argv[3]
rng = np.random.default_rng(0)
H, d = 2, 64
q, k, v, dout = (rng.standard_normal((1, H, L, d), dtype=np.float32) for _ in range(4))
table = lambda: rng.standard_normal((33, d), dtype=np.float32)  # noqa: E731
per_head = lambda *shape: rng.standard_normal((H, *shape), dtype=np.float32)  # noqa: E731
scheme = {"none": lambda: relpos.NoPosition(), "alibi": lambda: relpos.ALiBi(),
          "shaw_kv": lambda: relpos.Shaw(k=16, wk=table(), wv=table()),
          "xl": lambda: relpos.TransformerXL(per_head(d), per_head(d), per_head(d, d))}[name]()
out, lse = relpos.forward(q, k, v, scheme, causal=causal, threads=1)
relpos.backward(q, k, v, out, lse, dout, scheme, causal=causal, threads=1)
