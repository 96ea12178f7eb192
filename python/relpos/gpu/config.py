"""Launch configuration of the GPU kernels: tile sizes, warps and pipeline stages per
head size, in one place for the kernels' launches and the ahead-of-time compile check.

In Triton's interpreter (CPU tensors) tiles are 16 x 16: every tile costs Python
time there, and the tests' sizes must span several tiles. On a GPU, 64 x 64 tiles;
the compile check (compile_check.py) tells when a configuration no longer fits a
card's shared memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton


@dataclass(frozen=True)
class Launch:
    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class Launches:
    """A call's configuration per attention kernel (named as compile_check names them). The
    kernels take any tiles (their masks cover partial tiles; dropout's mask is a function of
    the positions, not of the tiles), so each may have its own: the dk, dv kernel loops over
    query tiles for a key tile, the forward and dq kernels over key tiles for a query tile.
    Tables per distance need square tiles in each (a tile pair reads BM + BN distances, a
    ``tl.arange``: a power of two)."""

    forward: Launch
    backward_kv: Launch
    backward_q: Launch

    @staticmethod
    def every(cfg: Launch) -> "Launches":
        """``cfg`` for all three kernels."""
        return Launches(cfg, cfg, cfg)


INTERPRETER = Launch(16, 16, 4, 1)

# The kernels that go row by row (row_kernels.py: RoPE's rotation of q and k before the attention
# kernels and of their gradients after, the backward's row dots): block_m rows of one head per
# program, no key tiles, no loop to pipeline.
ROW_KERNELS = Launch(64, 0, 4, 1)


def padded(n: int) -> int:
    """A head or feature size as the kernels' tiles hold it: a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(n))


def launch_for(head_dim: int, on_gpu: bool, element_bytes: int = 2, tables: bool = False,
               features: bool = False, split_float32: bool = False) -> Launches:
    """The configurations of the attention kernels, one for all three until bench/gpu_tiles.py's
    per-kernel rows on a GPU choose otherwise (launch_one below)."""
    return Launches.every(launch_one(head_dim, on_gpu, element_bytes, tables, features, split_float32))


def launch_one(head_dim: int, on_gpu: bool, element_bytes: int = 2, tables: bool = False,
               features: bool = False, split_float32: bool = False) -> Launch:
    """The configuration for a call with head size ``head_dim`` (the larger of d and dv),
    inputs of ``element_bytes`` each and, with ``tables``, tables per distance (Shaw's,
    DeBERTa's: a per-tile band of BM + BN table rows adds to the tile's shared memory), with
    ``features`` Transformer-XL's float32 feature product. Head 128 takes twice the shared
    memory of head 64, float32 twice that of half types: 64 x 64 tiles in two stages needed
    up to 295 KB on sm_90 for float32 (232 KB available) and 246 KB for float16 with Shaw's
    tables, so those run smaller tiles in one stage (the compile check, compile_check.py,
    measures every one). Half types at head 128 without tables or features run 4 warps:
    bench/gpu_tiles.py on an H100 timed plain attention there at 1.08x / 0.79x SDPA flash
    forward / forward+backward against 0.65x / 0.46x with 8 warps. Its fastest, 64 x 32
    tiles in 3 stages (1.12x / 0.81x), needs 186,368 bytes of shared memory with
    Transformer-XL's features, over an A100's 166,912; at head 64 three stages gained 1%
    forward and 5% forward+backward on plain attention, within the run-to-run spread of the
    other schemes, so two stay. With the features (more registers per thread at 4 warps) the
    8 warps they were measured with stay until 4 are measured there.

    ``split_float32``: float32 products in TF32 three times (torch's TF32 switch off; twice the
    operand registers of one TF32 product). bench/gpu_tiles.py --dtype float32 on an H200
    (causal L = 4096, B = 4, H = 16; forward / forward+backward ms): head 64 plain attention
    3.20 / 17.9 with 64 x 64 tiles in one stage against 3.18 / 20.4 in two; DeBERTa's tables
    9.4 / 55.1 with 32 x 32 tiles against 11.5 / 78.2 with 64 x 64 in two stages; head 128 with
    the tables 31.4 / 155.3 with 32 x 32 tiles in 8 warps against 41.9 / 214.6 with 16 x 16 (4
    warps: 21.7 / 147.6, but Shaw's dk, dv kernel there sits at 32 registers with 21 KB of
    spills per thread on sm_90, against 1.3 KB in 8 warps: compile_check)."""
    if not on_gpu:
        return INTERPRETER
    if padded(head_dim) <= 64:
        if split_float32:
            return Launch(32, 32, 4, 1) if tables else Launch(64, 64, 4, 1)
        return Launch(64, 64, 4, 2)
    if tables:
        if split_float32:
            return Launch(32, 32, 8, 1)
        return Launch(16, 16, 4, 1) if element_bytes > 2 else Launch(32, 32, 4, 1)
    if element_bytes > 2:
        return Launch(32, 32, 4, 1)
    return Launch(64, 64, 8 if features else 4, 2)


# Query programs of the backward's dq kernel, all heads together, where tables per distance
# learn (Shaw's, DeBERTa's). Each program adds to its partial sums of a table's gradient, rows x
# d float32 (d padded), which the host adds in a fixed order; at one program per query tile they
# took tiles x rows x d floats per head (4.3 GB per table at B = 4, H = 16, L = 16384, d = 128,
# Shaw's k = 64). A program that owns every n-th tile keeps one partial for all of them: about
# TABLE_PROGRAMS x rows x d floats (68 MB at Shaw's 129 rows, d 128; 134 MB at DeBERTa's 512
# rows, d 64; one program per head where B x H passes TABLE_PROGRAMS), still several per SM.
TABLE_PROGRAMS = 1024


def query_programs(tiles: int, heads: int, tables: bool) -> int:
    """Programs per (batch, head) of the dq kernel for ``tiles`` query tiles and ``heads``
    batch x head pairs: one per tile, or fewer with tables per distance (TABLE_PROGRAMS)."""
    if not tables:
        return max(1, tiles)
    return max(1, min(tiles, triton.cdiv(TABLE_PROGRAMS, max(1, heads))))
