"""Attention dropout in the GPU kernels: a tile's multipliers ``z = keep / (1 - p)``, drawn
from the counter layout of docs/design.md ("Attention dropout") where the kernels need them
(the forward, and again both backward kernels), so that they are the C++ kernels' bits and
no mask is stored.

Philox 4x32-10 is Triton's ``tl.philox`` (Random123's, the 64-bit seed split as (low, high)
into the key (k0, k1), as the layout's). Counter ``(c0, qp, b H + h, offset)`` with ``c0 =
(kp >> 6) 16 + kp mod 16`` serves the four keys ``kp`` 16 apart that its four words keep, so
a tile whose keys start 64-aligned, ``BN`` a multiple of 64 (``PER_4_KEYS``), draws one
Philox per four keys: its ``BN / 4`` counters are consecutive, and their words laid side by
side give the keys in order. Other tiles (``PER_KEY``: a key offset off the 64 grid, tiles
narrower than 64 keys) draw one Philox per key and keep its word ``(kp >> 4) mod 4``.
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

# The DROPOUT switch of the kernels: how a call draws its mask.
NONE, PER_KEY, PER_4_KEYS = range(3)


def mode(p: float, k_offset: int, block_n: int) -> int:
    """The DROPOUT switch of a call with dropout probability ``p`` whose keys start at position
    ``k_offset``, in tiles of ``block_n`` keys: every tile starts 64-aligned exactly when the
    first does and the tiles are whole 64-key blocks (positions wrap at 2^32, a multiple of 64)."""
    if not p:
        return NONE
    return PER_4_KEYS if k_offset % 64 == 0 and block_n % 64 == 0 else PER_KEY


def int32_bits(x: int) -> int:
    """``x mod 2^32`` as the int32 of the same bits: the kernels' position and threshold
    arguments are then always ``i32`` (a value past 2^31 would make Triton compile an ``i64``
    variant) and read back as uint32."""
    return (x + 2**31) % 2**32 - 2**31


def threshold(p: float) -> int:
    """The smallest Philox word that keeps an entry, ``floor(p 2^32)`` (as the C++ kernels'
    keep_threshold, in double), as int32 bits."""
    return int32_bits(math.floor(p * 4294967296.0))


def scale(p: float) -> float:
    """What a kept entry is multiplied by, ``1 / (1 - p)`` in double (the kernels' float32
    argument rounds it once, as the C++ float kernels do)."""
    return 1.0 / (1.0 - p)


@triton.jit
def seed_offset(RNG, DROPOUT: tl.constexpr):
    """The call's seed (int64, the 64 bits Philox's key splits) and counter word ``offset``
    (its low 32 bits) from the ``[seed, offset]`` int64 tensor RNG, read on the device (no
    host synchronisation, nothing host-side in a CUDA graph); zeros without dropout (unread)."""
    seed = 0
    offset = 0
    if DROPOUT != 0:
        seed = tl.load(RNG)
        offset = tl.load(RNG + 1).to(tl.uint32)
    return seed, offset


@triton.jit
def multipliers(seed, offset, bh, offs_m, n_start, query_pos, key_pos, keep_from, keep_scale, BM: tl.constexpr,
                BN: tl.constexpr, DROPOUT: tl.constexpr):
    """``(BM, BN)`` float32: the multiplier of each pair of query rows ``offs_m`` and keys
    ``n_start + [0, BN)`` of batch x query head ``bh``; ``query_pos`` and ``key_pos`` are row
    0's and key 0's positions and ``keep_from`` the threshold, each as int32 bits (positions
    wrap at 2^32, as the layout's); ``keep_scale`` is ``1 / (1 - p)``. Unsigned throughout:
    the words and the threshold compare as uint32. DROPOUT's values are literals here (jit
    code reads no module constants): 2 PER_4_KEYS, 1 PER_KEY, 0 NONE."""
    if DROPOUT == 0:  # nothing drawn: dropped() leaves the tile as it is
        z = keep_scale
    else:
        qp = query_pos.to(tl.uint32, bitcast=True) + offs_m.to(tl.uint32)
        kp0 = key_pos.to(tl.uint32, bitcast=True) + n_start  # uint32 (n_start an int32 or, interpreted, an int)
        least = keep_from.to(tl.uint32, bitcast=True)  # the smallest word kept
        if DROPOUT == 2:
            # counter 16 b + l of the tile is c0 = (kp0 >> 2) + 16 b + l (block kp0 / 64 + b, lane l),
            # the blocks wrapping at 2^26 with the positions
            c = ((kp0 >> 2) + tl.arange(0, BN // 4).to(tl.uint32)) & 0x3FFFFFFF
            w0, w1, w2, w3 = _philox(seed, offset, bh, qp, c, BM, BN // 4)
            z0, z1 = tl.where(w0 >= least, keep_scale, 0.0), tl.where(w1 >= least, keep_scale, 0.0)
            z2, z3 = tl.where(w2 >= least, keep_scale, 0.0), tl.where(w3 >= least, keep_scale, 0.0)
            # key 64 b + 16 w + l is word w of counter 16 b + l: each word's (BM, blocks, 16) lanes,
            # joined as [..., l, w mod 2, w // 2], then ordered (b, w // 2, w mod 2, l)
            words = tl.join(tl.join(_blocks(z0, BM, BN), _blocks(z1, BM, BN)),
                            tl.join(_blocks(z2, BM, BN), _blocks(z3, BM, BN)))
            z = tl.reshape(tl.permute(words, (0, 1, 4, 3, 2)), (BM, BN))
        else:  # one counter per key, its word (kp >> 4) mod 4
            kp = kp0 + tl.arange(0, BN).to(tl.uint32)
            w0, w1, w2, w3 = _philox(seed, offset, bh, qp, (kp >> 6) << 4 | (kp & 15), BM, BN)
            word = ((kp >> 4) & 3)[None, :]
            bits = tl.where(word == 0, w0, tl.where(word == 1, w1, tl.where(word == 2, w2, w3)))
            z = tl.where(bits >= least, keep_scale, 0.0)
    return z


@triton.jit
def _philox(seed, offset, bh, qp, c0, BM: tl.constexpr, W: tl.constexpr):
    """Philox's four ``(BM, W)`` uint32 words of counters ``(c0[j], qp[i], bh, offset)``."""
    zero = tl.zeros([BM, W], tl.uint32)
    return tl.philox(seed, c0[None, :] + zero, qp[:, None] + zero, zero + bh.to(tl.uint32), zero + offset)


@triton.jit
def _blocks(z, BM: tl.constexpr, BN: tl.constexpr):
    """A (BM, BN / 4) tile of one word per counter as (BM, BN / 64, 16): its 64-key blocks' lanes."""
    return tl.reshape(z, (BM, BN // 64, 16))


@triton.jit
def dropped(x, z, DROPOUT: tl.constexpr):
    """``x z`` with dropout, else ``x`` itself (the call without dropout runs exactly its code)."""
    if DROPOUT != 0:
        x = x * z
    return x
