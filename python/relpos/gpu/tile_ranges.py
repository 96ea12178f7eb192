"""Which tiles a program of the attention kernels (kernels.py) visits, and in what order: the
causal cut, the key tiles that need no mask, and the query tiles' order under a causal
mask. Key j is visible to query row i when ``j - i + delta <= 0`` (``delta = k_offset - q_offset``).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def query_tile(step, tiles, CAUSAL: tl.constexpr):
    """The query tile a program takes at ``step`` of ``tiles``: under a causal mask the last
    (the most keys) first, so that the launch's last programs are its lightest, not a
    head's heaviest tiles waiting on a full card."""
    if CAUSAL:
        tile = tiles - 1 - step
    else:
        tile = step
    return tile


@triton.jit
def causal_key_end(m_start, Lk, delta, BM: tl.constexpr, CAUSAL: tl.constexpr):
    """One past the last key a query tile starting at ``m_start`` can see."""
    if CAUSAL:
        # key j is visible to row i when j - i + delta <= 0; the tile's last row is m_start + BM - 1
        end = tl.minimum(tl.maximum(m_start + BM - delta.to(tl.int64), 0), Lk).to(tl.int32)
    else:
        end = Lk
    return end


@triton.jit
def unmasked_key_end(m_start, Lk, delta, end, BN: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                      HAS_SEG: tl.constexpr):
    """Where a query tile's key tiles that need no mask end (from key 0, up to ``end``): those
    inside the call and, under a causal mask, wholly in the past of the tile's first row
    (key j is visible to row i when j - i + delta <= 0); none with padding or segments."""
    if HAS_PAD or HAS_SEG:
        full = 0
    else:
        full = Lk // BN * BN
        if CAUSAL:
            full = tl.minimum(full, (tl.maximum(m_start + 1 - delta.to(tl.int64), 0) // BN * BN).to(tl.int32))
    return tl.minimum(full, end)
