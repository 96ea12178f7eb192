"""The README's Python example runs as written and its outputs are right."""
import re
from pathlib import Path

import numpy as np

import relpos

README = Path(__file__).resolve().parents[2] / "README.md"


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
