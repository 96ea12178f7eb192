"""The schemes bench/gpu.py checks and times: each one's learnable tensors (float32, CPU,
from a fixed seed), its record for relpos.gpu and the float64 oracle's options for the
same values. Needs torch and bench/gpu_forms.py only."""
from __future__ import annotations

import torch

import gpu_forms as forms

T5_MAX_DISTANCE, ROPE_BASE = forms.T5_MAX_DISTANCE, 10000.0
# DeBERTa-v3-base's options: 256 log buckets (span 256, tables of 512 rows) up to 512 positions
DEBERTA_OPTIONS = {"position_buckets": 256, "max_relative_positions": 512}


def grid_of(L: int) -> tuple[int, int]:
    """The grid SAM's and Swin's calls of L rows lay them on: the closest to square, height <= width
    (64 x 64 at 4096, 32 x 64 at 2048)."""
    height = max(h for h in range(1, int(L ** 0.5) + 1) if L % h == 0)
    return height, L // height


def scheme_values(name: str, H: int, d: int, shaw_k: int, L: int = 0) -> dict:
    """The learnable tensors of a scheme (float32, CPU, from a fixed seed; callers cast); SAM's and
    Swin's for a call of L rows (grid_of)."""
    gen = torch.Generator().manual_seed(1000 + sum(map(ord, name)) + shaw_k)

    def randn(*shape, s=1.0):
        return torch.randn(*shape, generator=gen) * s

    def uniform(lo, hi, n):
        return lo + (hi - lo) * torch.rand(n, generator=gen)

    if name == "alibi":
        return {"slopes": torch.tensor(forms.oracle().alibi_paper_slopes(H))}
    if name == "t5":
        return {"table": randn(H, forms.T5_BUCKETS, s=0.5)}
    if name in ("kerple", "kerple_power"):
        return {"r1": uniform(0.5, 2.0, H), "r2": uniform(0.1, 1.0, H)}
    if name == "xl":
        return {"u": randn(H, d, s=0.1), "v": randn(H, d, s=0.1), "w_r": randn(H, d, d, s=d ** -0.5)}
    if name == "shaw":
        return {"wk": randn(2 * shaw_k + 1, d, s=0.5), "wv": randn(2 * shaw_k + 1, d, s=0.5)}
    if name == "deberta":
        rows = 2 * DEBERTA_OPTIONS["position_buckets"]
        return {"c2p": randn(rows, d, s=0.5), "p2c": randn(rows, d, s=0.5)}
    if name == "sam":
        h, w = grid_of(L)
        return {"rel_h": randn(2 * h - 1, d, s=0.5), "rel_w": randn(2 * w - 1, d, s=0.5)}
    if name == "swin":
        h, w = grid_of(L)
        return {"table": randn(H, (2 * h - 1) * (2 * w - 1), s=0.5)}
    return {}


def scheme_record(S, name: str, t: dict, causal: bool, shaw_k: int = 0, L: int = 0):
    if name == "none":
        return S.NoPosition()
    if name == "alibi":
        return S.ALiBi(slopes=t["slopes"])
    if name == "t5":
        return S.T5(table=t["table"], bidirectional=not causal, max_distance=T5_MAX_DISTANCE)
    if name == "kerple":
        return S.KERPLE(r1=t["r1"], r2=t["r2"])
    if name == "kerple_power":
        return S.KERPLEPower(r1=t["r1"], r2=t["r2"])
    if name == "rope":
        return S.RoPE(base=ROPE_BASE, dims=None, style="half_split")
    if name == "xl":
        return S.TransformerXL(u=t["u"], v=t["v"], w_r=t["w_r"], clamp_len=0)
    if name == "shaw":
        return S.Shaw(k=shaw_k, wk=t["wk"], wv=t["wv"], beyond="clip")
    if name == "deberta":
        return S.DeBERTa(c2p=t["c2p"], p2c=t["p2c"], **DEBERTA_OPTIONS)
    if name == "sam":
        return S.SAM(t["rel_h"], t["rel_w"], *grid_of(L))
    if name == "swin":
        return S.Swin(t["table"], *grid_of(L))
    raise ValueError(name)


def oracle_options(name: str, causal: bool, shaw_k: int = 0, L: int = 0) -> dict:
    if name in ("sam", "swin"):
        h, w = grid_of(L)
        return dict(q_height=h, q_width=w) if name == "sam" else dict(window_height=h, window_width=w)
    return {"t5": {"bidirectional": not causal, "max_distance": T5_MAX_DISTANCE},
            "rope": {"base": ROPE_BASE, "dims": None, "style": "half_split"},
            "xl": {"clamp_len": 0}, "shaw": {"k": shaw_k, "beyond": "clip"}, "deberta": DEBERTA_OPTIONS}.get(name, {})
