"""Positions on a grid in bench/gpu.py (docs/gpu.md, "Positions on a grid"): the timing rows of a
SAM global layer, relpos.gpu's SAM against transformers' SamVisionAttention and against SDPA given
SAM's decomposed bias as a dense mask. bench/gpu.py's correctness step checks SAM and Swin like
every scheme (gpu_schemes.grid_of lays its calls on a grid).

The shape (SHAPE): one image at SAM's 1024 x 1024 pixels, a 64 x 64 grid of patches, ViT-B's 12
heads of 64 (SAM-B's global layers 2, 5, 8 and 11), bfloat16, non-causal, B = 1. Every row computes
the attention core from the same q, k, v (B, H, L, d) and tables, forward and forward+backward
(gradients of q, k, v and both tables):

  relpos SAM          relpos.gpu.attention with relpos.SAM
  transformers core   SamVisionAttention itself, its qkv projection replaced by one that returns
                      the given q, k, v and its output projection by the identity (eval mode)
  SDPA + dense bias   SAM's decomposed terms made as transformers makes them, (B, H, L, L), then
                      scaled_dot_product_attention with them as its float mask, in the timed call
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

SHAPE = dict(B=1, H=12, L=64 * 64, d=64)
SMOKE = dict(B=1, H=2, L=4 * 8, d=16)
NAMES = {"relpos": "relpos SAM (global layer)", "transformers": "transformers SamVisionAttention core",
         "dense": "SDPA + SAM's decomposed bias (dense)"}


def _index(size: int, device) -> torch.Tensor:
    """One axis's offset index of equal query and key grids (SAM's get_rel_pos)."""
    coords = torch.arange(size, device=device)
    return coords[:, None] - coords[None, :] + size - 1


def _given(q, k, v, h: int, w: int):
    """A projection returning q, k, v (B, H, L, d) laid out as SamVisionAttention's qkv output."""
    B, H, L, d = q.shape

    class Given(torch.nn.Module):
        def forward(self, _):
            return torch.stack((q, k, v)).permute(1, 3, 0, 2, 4).reshape(B, h, w, 3 * H * d)

    return Given()


def rows(Row, grid_of, ours) -> list:
    """SAM's rows of the grid shape; ``ours(group)`` builds relpos.gpu's."""

    def transformers(x):
        from transformers import SamVisionConfig
        from transformers.models.sam.modeling_sam import SamVisionAttention

        s, t = x.shape, x.params("sam")
        h, w = grid_of(s.L)
        config = SamVisionConfig(hidden_size=s.H * s.d, num_attention_heads=s.H, image_size=16 * h, patch_size=16)
        attn = SamVisionAttention(config, window_size=0).to(x.device, torch.bfloat16).eval()
        del attn.rel_pos_h, attn.rel_pos_w  # the row's own tables, whose gradients are taken
        attn.rel_pos_h, attn.rel_pos_w = t["rel_h"], t["rel_w"]
        attn.qkv, attn.proj = _given(x.q, x.k, x.v, h, w), torch.nn.Identity()
        attn.scale = x.scale
        hidden = torch.zeros(s.B, h, w, 1, device=x.device, dtype=torch.bfloat16)

        def fn():
            out = attn(hidden)[0]  # (B, h, w, H d)
            return out.reshape(s.B, s.L, s.H, s.d).transpose(1, 2)
        return fn, [x.q, x.k, x.v, t["rel_h"], t["rel_w"]]

    def dense(x):
        s, t = x.shape, x.params("sam")
        h, w = grid_of(s.L)
        x.check_memory(2 * s.B * s.H * s.L * s.L * 2 * 3)  # the bias, its gradient and the product's
        iy, ix = _index(h, x.device), _index(w, x.device)

        def fn():
            cells = x.q.reshape(s.B, s.H, h, w, s.d)
            by_y = torch.einsum("bnhwc,hkc->bnhwk", cells, t["rel_h"][iy])
            by_x = torch.einsum("bnhwc,wkc->bnhwk", cells, t["rel_w"][ix])
            bias = (by_y[..., :, None] + by_x[..., None, :]).reshape(s.B, s.H, s.L, s.L)
            return F.scaled_dot_product_attention(x.q, x.k, x.v, attn_mask=bias, scale=x.scale)
        return fn, [x.q, x.k, x.v, t["rel_h"], t["rel_w"]]

    return [Row(NAMES["relpos"], "sam", "relpos", ours("sam")),
            Row(NAMES["transformers"], "sam", "peer", transformers),
            Row(NAMES["dense"], "sam", "peer", dense)]


def targets(shape, ours, get, ratio) -> None:
    """SAM's targets: relpos at least as fast as either peer, forward and forward+backward."""
    for peer in ("transformers", "dense"):
        for field, what in (("fwd", "fwd"), ("fb", "fwd+bwd")):
            ratio(shape, f"{NAMES['relpos']} {what} vs {NAMES[peer]}", get(shape, NAMES[peer]), ours, field, 1.0)
