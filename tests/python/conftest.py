"""pytest setup for the relpos Python tests: make the helper modules (torch_oracle,
harness) importable and make float64 torch's default dtype. torch is required:
the oracle is written in it."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_default_dtype(torch.float64)
