"""bench/train_speed.py's PyTorch models compute the attention relpos's trainer
computes: its Transformer-XL (u, v, W_R R, rel_shift, memory) and KERPLE
(both kernels, clamped parameters) layers against relpos.torch.attention in
float64, so that the speed table compares the same function."""
from __future__ import annotations

import argparse
import importlib.util
import math
import pathlib

import pytest
import torch

import relpos
import relpos.torch as rt

ROOT = pathlib.Path(__file__).resolve().parents[2]


def train_speed_module():
    spec = importlib.util.spec_from_file_location("train_speed", ROOT / "bench" / "train_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def block(ts, position, width=32, heads=4):
    a = argparse.Namespace(width=width, heads=heads, ffn=64, layers=1, shaw_k=4, position=position)
    return ts.Block(a).double()


def sinusoid(width, length):
    """Distances 2 length - 1 .. 0, as the benchmark's model makes them."""
    inv = 1.0 / 10000 ** (torch.arange(0, width, 2, dtype=torch.float64) / width)
    angle = torch.arange(2 * length - 1, -1, -1.0, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([angle.sin(), angle.cos()], -1)


@pytest.mark.parametrize("memory", [0, 8])
def test_transformer_xl_peer_matches_relpos(memory):
    ts = train_speed_module()
    torch.manual_seed(memory)
    B, H, L, d, width = 2, 4, 8, 8, 32
    layer = block(ts, "xl", width, H)
    q, k, v = (torch.randn(B, H, L, d, dtype=torch.float64) for _ in range(3))
    mk, mv = (torch.randn(B, H, memory, d, dtype=torch.float64) for _ in range(2))
    u, vb = (torch.randn(H, d, dtype=torch.float64) for _ in range(2))
    with torch.no_grad():
        peer = layer.xl_attention(q, k, v, (u, vb, sinusoid(width, L), (mk, mv) if memory else None))
        ours = rt.attention(q, torch.cat([mk, k], 2), torch.cat([mv, v], 2),
                            relpos.TransformerXL(u, vb, layer.xl_w_r.detach()), causal=True, q_offset=memory)
    torch.testing.assert_close(peer, ours, rtol=0, atol=1e-12)
    assert torch.equal(layer.new_memory[0], torch.cat([mk, k], 2)[:, :, -L:])  # the next step's memory


@pytest.mark.parametrize("position", ["kerple", "kerple_power"])
def test_kerple_peer_matches_relpos(position):
    ts = train_speed_module()
    torch.manual_seed(1)
    B, H, L, d = 2, 4, 12, 8
    layer = block(ts, position, 32, H)
    with torch.no_grad():
        layer.kerple_r1.copy_(torch.tensor([0.005, 0.4, 1.0, 2.5]))  # one below the 0.01 floor
        layer.kerple_r2.copy_(torch.tensor([0.3, 0.005, 1.5, 2.7]))  # one below the floor, one above power's 2
    q, k, v = (torch.randn(B, H, L, d, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(L)
    relative = pos[None, :] - pos[:, None]
    with torch.no_grad():
        peer = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=layer.kerple_bias(relative.abs().double(), relative > 0))
        r1 = layer.kerple_r1.clamp(min=ts.KERPLE_FLOOR)
        if position == "kerple":
            scheme = relpos.KERPLE(r1, layer.kerple_r2.clamp(min=ts.KERPLE_FLOOR))
        else:
            scheme = relpos.KERPLEPower(r1, layer.kerple_r2.clamp(min=ts.KERPLE_FLOOR, max=2.0))
        ours = rt.attention(q, k, v, scheme, causal=True, scale=1 / math.sqrt(d))
    torch.testing.assert_close(peer, ours, rtol=0, atol=1e-12)
