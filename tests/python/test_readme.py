"""The README's Python blocks run as written and their outputs are right.

Every ```python block of the README runs here (test_readme_every_python_block_runs).
A block whose first line is the marker `# needs: cuda` is skipped where torch has no
CUDA device: it is the only kind of block skipped, and only for that reason.
"""
import re
from pathlib import Path

import numpy as np
import pytest

import relpos

README = Path(__file__).resolve().parents[2] / "README.md"
CUDA_MARKER = "# needs: cuda"


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.S | re.M)


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_readme_every_python_block_runs(index):
    block = _python_blocks()[index]
    if block.startswith(CUDA_MARKER):
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("README block marked '# needs: cuda' and torch sees no CUDA device")
    exec(compile(block, f"{README}:python block {index}", "exec"), {})


def test_readme_blocks_without_marker_need_no_cuda():
    """Only a marked block may name a CUDA device, so no CPU-runnable block is skipped."""
    for block in _python_blocks():
        if not block.startswith(CUDA_MARKER):
            assert "cuda" not in block, block


def test_readme_python_example_runs_and_matches_reference_semantics():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README lost its Python example"
    scope: dict = {}
    exec(compile(blocks[0], str(README), "exec"), scope)
    # The example's last call is Transformer-XL with 16 memory keys: rows must be
    # finite, and the first query (position 16) sees exactly keys 0..16.
    out, lse = scope["out"], scope["lse"]
    assert out.shape == (2, 4, 64, 32) and np.isfinite(out).all() and np.isfinite(lse).all()
    kv, q, xl = scope["kv"], scope["q"], scope["xl"]
    out_first, _ = relpos.forward(q[:, :, :1], kv[:, :, :17], kv[:, :, :17], xl, q_offset=16)
    np.testing.assert_allclose(out[:, :, :1], out_first, rtol=1e-5, atol=1e-6)


def test_readme_pytorch_example_runs_and_trains():
    """The README's PyTorch example (its second Python block) runs and fills the gradients it names."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2 and "relpos.torch" in blocks[1], "README lost its PyTorch example"
    scope: dict = {}
    exec(compile(blocks[1], str(README), "exec"), scope)
    layer, table = scope["layer"], scope["table"]
    assert scope["y"].shape == (2, 32, 64)
    for p in (layer.xl_u, layer.xl_v, layer.xl_w_r, layer.q_proj.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert table.grad.shape == (4, 32) and table.grad.abs().sum() > 0
