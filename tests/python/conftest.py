"""pytest setup for the relpos Python tests: make the helper modules (torch_oracle,
harness) importable and make float64 torch's default dtype. torch is required:
the oracle is written in it."""
import os
import sys

# relpos.gpu's Triton kernels run on CPU tensors in Triton's interpreter (test_gpu.py);
# Triton reads this when it is first imported, so it is set before anything imports it.
# Compiling kernels for a GPU (test_gpu_compile.py) runs in a process of its own.
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_default_dtype(torch.float64)
