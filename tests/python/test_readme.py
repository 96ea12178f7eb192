"""The README's Python blocks and command lines run as written and their outputs are right.

Every ```python block of the README runs here (test_readme_every_python_block_runs).
A block whose first line is the marker `# needs: cuda` is skipped where torch has no
CUDA device: it is the only kind of block skipped, and only for that reason. The
command-line block runs line by line (test_readme_command_lines_run_in_order), the
training lines with size options appended (the C++ blocks: tests/package/check.sh).
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import relpos

README = Path(__file__).resolve().parents[2] / "README.md"
CUDA_MARKER = "# needs: cuda"
# The installed command, or the one RELPOS_CLI names (the AVX2 stage of scripts/test.sh).
RELPOS = os.environ.get("RELPOS_CLI", str(Path(sys.executable).parent / "relpos"))
# Appended to the README's command lines that train or evaluate: the command takes an
# option's last value, so every option as written is parsed and used but the sizes (a
# model and a text of seconds; DATA is a generated file).
SMALL = {"demo": ["--data", "DATA", "--length", "8", "--layers", "1", "--width", "16", "--heads", "2", "--ffn", "32",
                  "--steps", "5", "--batch", "2", "--multiples", "1,2"],
         "train": ["--data", "DATA", "--steps", "3", "--layers", "1", "--width", "16", "--heads", "2", "--ffn", "32",
                   "--batch", "2"],
         "eval": ["--multiples", "1,2"]}


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


def _command_lines() -> list[list[str]]:
    """The README's command-line block (the ```bash block under "### Command line"), one word list per line."""
    text = README.read_text()
    block = re.search(r"^### Command line\n\n```bash\n(.*?)^```$", text, re.S | re.M)
    assert block, "README lost its command-line block"
    return [shlex.split(line, comments=True) for line in block.group(1).splitlines() if line.strip()]


def test_readme_command_lines_run_in_order(tmp_path):
    """Each line of the README's command-line block runs in one folder, in order (train writes
    the checkpoint that eval and sample read), as written but for the sizes SMALL appends."""
    data = tmp_path / "data.txt"
    data.write_text("".join(f"line {i}: the quick brown fox {i * i % 97}\n" for i in range(400)))
    lines = _command_lines()
    assert [words[:2] for words in lines] == [["relpos", c] for c in ("demo", "train", "eval", "sample", "check", "info")]
    outputs = {}
    for words in lines:
        extra = [str(data) if a == "DATA" else a for a in SMALL.get(words[1], [])]
        r = subprocess.run([RELPOS, *words[1:], *extra], cwd=tmp_path, capture_output=True, text=True,
                           errors="replace", timeout=300)
        assert r.returncode == 0, f"{' '.join(words)}: exit {r.returncode}\n{r.stderr[-2000:]}"
        outputs[words[1]] = r.stdout
    assert (tmp_path / "results" / "demo" / "demo.json").is_file()
    assert (tmp_path / "results" / "train" / "alibi.ckpt").is_file()
    assert "all agree" in outputs["check"]
    assert "SIMD:" in outputs["info"] and outputs["sample"]
