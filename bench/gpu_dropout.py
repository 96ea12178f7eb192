"""Attention dropout in bench/gpu.py (docs/design.md, "Attention dropout"; docs/gpu.md, "Dropout").

Correctness: the mask the compiled kernels draw is the layout's, bit for bit: with q = k = 0
every key has probability 1 / Lk and v = I, so out * Lk * (1 - p) is the kept mask itself,
compared with tests/python/torch_oracle.py's philox_keep (the layout restated in NumPy, which
the tests hold equal to relpos.dropout_mask), from 64-aligned keys (one Philox per four keys
in 64-key tiles) and from keys off the 64 grid (one per key), grouped-query heads, B x H > 1.
bench/gpu.py's correctness step also checks schemes with dropout against the float64 oracle
applying that mask (check_case's dropout_p).

Timing: forward+backward of relpos.gpu's plain, T5 and DeBERTa calls with dropout P against the
same calls without it (the ratio, its target at most TARGET, about FlashAttention-2's cost and
the CPU kernels' target), beside SDPA flash's own dropout.
"""
from __future__ import annotations

import torch

import gpu_forms as forms

P = 0.1
SUFFIX = f", dropout {P}"
TARGET = 1.15  # forward+backward with dropout over the call without, at most
TIMED = (("relpos plain", "none"), ("relpos T5 (learned table)", "t5"),
         ("relpos DeBERTa c2p+p2c (span 256)", "deberta"))  # bench/gpu.py's rows of these calls without dropout
SEED, OFFSET = -0x3C6EF372FE94F82B, 12345  # any 64-bit seed (as an int64) and 32-bit offset


def rng(device) -> torch.Tensor:
    """The checks' [seed, offset], as relpos._autograd.draw_dropout_rng makes one."""
    return torch.tensor([SEED, OFFSET], dtype=torch.int64, device=device)


def keep(O, B, H, Lq, Lk, p, q_offset, k_offset, device) -> torch.Tensor:
    """The layout's mask (B, H, Lq, Lk), True = kept, for the checks' seed and offset."""
    mask = O.philox_keep(SEED % 2**64, OFFSET, B, H, Lq, Lk, p, q_offset, k_offset)
    return torch.from_numpy(mask).to(device)


def mask_checks(gpu, O, device) -> list[tuple[str, bool]]:
    """(report line, whether the kernels' mask is the layout's) for keys from k_offset 0 (the
    GPU's 64-key tiles draw per four keys) and 13 (per key); 128 keys (64 under the interpreter,
    whose 16-key tiles draw per key, at its pace) with v = I in bfloat16 (its rounding of P z moves
    out * Lk * (1 - p) by under 1%, far from the 0.5 between kept and not)."""
    B, H, Hkv, p = 2, 4, 2, 0.3
    Lq, Lk = (256, 128) if device.type == "cuda" else (32, 64)
    results = []
    for k_offset in (0, 13):
        q, k = (torch.zeros(B, heads, n, 64, device=device, dtype=torch.bfloat16) for heads, n in ((H, Lq), (Hkv, Lk)))
        v = torch.eye(Lk, device=device, dtype=torch.bfloat16).expand(B, Hkv, Lk, Lk).contiguous()
        out = gpu.attention(q, k, v, q_offset=77, k_offset=k_offset, dropout_p=p, dropout_rng=rng(device))
        expected = keep(O, B, H, Lq, Lk, p, 77, k_offset, device)
        err = (out.double() * Lk * (1 - p) - expected.double()).abs().max().item()
        results.append((f"dropout mask, B={B}, H={H} ({Hkv} key heads), {Lq}x{Lk} from key {k_offset}, p={p}: "
                        f"max |out Lk (1 - p) - the layout's keep| = {err:.2e} (< 0.05: "
                        f"{'the layout, bit for bit' if err < 0.05 else 'NOT the layout'})", err < 0.05))
    return results


def rows(Row, shape, ours) -> list:
    """The timing rows with dropout: SDPA flash's, and relpos.gpu's TIMED calls (``ours(group,
    dropout_p)`` builds one), each named as its call without dropout plus SUFFIX."""
    c = shape.causal

    def flash(x):
        def fn():
            with forms.flash_context(x.device):
                return torch.nn.functional.scaled_dot_product_attention(x.q, x.k, x.v, is_causal=c, scale=x.scale,
                                                                        dropout_p=P)
        return fn, [x.q, x.k, x.v]

    return [Row("SDPA flash" + SUFFIX, "none", "dropout", flash, compare=False),
            *(Row(name + SUFFIX, group, "dropout", ours(group, P), compare=False) for name, group in TIMED)]


def cost(results: dict, label: str, name: str, Result) -> str:
    """A dropout row's note: its forward+backward time over its call's without dropout."""
    with_, without = results.get((label, name), Result()), results.get((label, name.removesuffix(SUFFIX)), Result())
    if not (with_.fb and without.fb):
        return with_.note
    return f"fwd+bwd {with_.fb / without.fb:.2f}x without dropout"
