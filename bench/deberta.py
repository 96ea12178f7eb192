"""DeBERTa's disentangled attention: relpos's fused kernel against transformers' own code, in one run.

    .venv/bin/python bench/deberta.py            # B = 8, L = 512 and 2048 (several minutes; ~12 GB at 2048)
    .venv/bin/python bench/deberta.py --quick    # small sizes, one rep: checks that every row runs

The attention core of DeBERTa-v3-base (H = 12, d = 64, 256 position buckets reaching 512,
c2p and p2c, relative embeddings shared with the content projections), forward and backward,
from projected q, k, v and the projected relative embeddings to the context:

    transformers  DisentangledSelfAttention itself with its projections replaced (q and k: the
                  identity, v: the given values), so that its own forward computes the scores,
                  the c2p and p2c gathers, the mask, the softmax and the context from the
                  given tensors (eval mode)
    relpos        rt.attention with relpos.DeBERTa, the same tensors in place (layout "blhd")
    relpos plain  rt.attention without position terms, the same q, k, v: the price of c2p + p2c

Speed: median ms of --reps calls after a warm-up, the calls of the three alternating
("speed" = transformers' time / relpos's, > 1: relpos faster). Peak memory: each side's
forward + backward once in a fresh process, the growth of its resident set's high-water mark
(VmHWM, reset first) over the resident set with its inputs made. Checks that both sides agree first (float32, 1e-4).
Writes bench/results/deberta_<cpu>.md (or --out PREFIX).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import DebertaV2Config
from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention, build_relative_position

import relpos
import relpos.torch as rt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import cpu_model, in_fresh_process, interleaved_median_ms, peak_growth_mb, results_prefix  # noqa: E402

HEADS, HEAD_DIM, BUCKETS, MAX_RELATIVE = 12, 64, 256, 512


class Given(torch.nn.Module):
    """A projection that returns a given tensor: transformers' value projection reads the
    hidden states that its key projection reads, and the core takes its own values."""

    def __init__(self):
        super().__init__()
        self.value = None

    def forward(self, _):
        return self.value


def hf_core() -> DisentangledSelfAttention:
    """transformers' attention with identity q and k projections and given values: its
    forward is the core alone."""
    config = DebertaV2Config(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, relative_attention=True,
                             position_buckets=BUCKETS, max_relative_positions=MAX_RELATIVE,
                             pos_att_type=["p2c", "c2p"], share_att_key=True, attention_probs_dropout_prob=0.0,
                             hidden_dropout_prob=0.0)
    module = DisentangledSelfAttention(config).eval()
    module.query_proj, module.key_proj, module.value_proj = torch.nn.Identity(), torch.nn.Identity(), Given()
    return module


def inputs(B: int, L: int, seed: int = 0):
    """q, k, v as (B, L, H d) and the relative embeddings (2 span, H d), leaves with gradients."""
    g = torch.Generator().manual_seed(seed)
    width = HEADS * HEAD_DIM
    qkv = [torch.randn(B, L, width, generator=g).requires_grad_(True) for _ in range(3)]
    rel = (0.5 * torch.randn(2 * BUCKETS, width, generator=g)).requires_grad_(True)
    return qkv, rel


def transformers_step(module, B: int, L: int, grad: bool = True):
    (q, k, v), rel = inputs(B, L)
    mask = torch.ones(B, 1, L, L, dtype=torch.bool)
    relative_pos = build_relative_position(q, k, bucket_size=BUCKETS, max_position=MAX_RELATIVE)

    def run():
        for x in (q, k, v, rel):
            x.grad = None
        # query_states carries q and hidden_states k (identity projections); the values are given.
        module.value_proj.value = v
        out = module(k, mask, query_states=q, relative_pos=relative_pos, rel_embeddings=rel)[0]
        if grad:
            out.backward(torch.ones_like(out))
        return out
    return run, (q, k, v, rel)


def relpos_step(B: int, L: int, positions: bool = True, grad: bool = True):
    (q, k, v), rel = inputs(B, L)

    def run():
        for x in (q, k, v, rel):
            x.grad = None
        heads = [x.view(B, L, HEADS, HEAD_DIM) for x in (q, k, v)]
        scheme = None
        if positions:
            table = rel.view(2 * BUCKETS, HEADS, HEAD_DIM).transpose(0, 1)  # (H, 2 span, d), as HF splits heads
            scheme = relpos.DeBERTa(c2p=table, p2c=table, position_buckets=BUCKETS,
                                    max_relative_positions=MAX_RELATIVE)
        out = rt.attention(*heads, scheme, layout="blhd").reshape(B, L, HEADS * HEAD_DIM)
        if grad:
            out.backward(torch.ones_like(out))
        return out
    return run, (q, k, v, rel)


def check(L: int) -> float:
    """The largest difference of out and every gradient, transformers against relpos, B = 2."""
    hf_run, hf_x = transformers_step(hf_core(), 2, L)
    rp_run, rp_x = relpos_step(2, L)
    worst = (hf_run() - rp_run()).abs().max().item()
    for a, b in zip(hf_x, rp_x):
        worst = max(worst, (a.grad - b.grad).abs().max().item())
    return worst


def measure_peak(side: str, B: int, L: int) -> float:
    """In this process: the high-water mark of one forward + backward over the resident set
    before it (inputs made), in MB (timing.peak_growth_mb)."""
    return peak_growth_mb(transformers_step(hf_core(), B, L)[0] if side == "transformers" else relpos_step(B, L)[0])


def peak_mb(side: str, B: int, L: int) -> float:
    """measure_peak in a fresh process (each side's allocator starts empty)."""
    return float(in_fresh_process("deberta", f"measure_peak({side!r}, {B}, {L})"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lengths", default="512,2048")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="B = 2, L = 64 and 128, one rep")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.quick:
        args.batch, args.lengths, args.reps = 2, "64,128", 1
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    agreement = check(min(lengths))
    if not agreement < 1e-4:
        raise SystemExit(f"deberta bench: transformers and relpos differ by {agreement:g}")
    rows, hf = [], hf_core()
    for L in lengths:
        fns = [transformers_step(hf, args.batch, L)[0], relpos_step(args.batch, L)[0],
               relpos_step(args.batch, L, positions=False)[0]]
        hf_ms, relpos_ms, plain_ms = interleaved_median_ms(fns, args.reps)
        hf_mb, relpos_mb = peak_mb("transformers", args.batch, L), peak_mb("relpos", args.batch, L)
        rows.append({"L": L, "B": args.batch, "transformers_ms": hf_ms, "relpos_ms": relpos_ms, "plain_ms": plain_ms,
                     "speed": hf_ms / relpos_ms, "over_plain": relpos_ms / plain_ms, "transformers_peak_mb": hf_mb,
                     "relpos_peak_mb": relpos_mb, "memory_ratio": hf_mb / max(relpos_mb, 1e-9)})
        print(json.dumps(rows[-1]), flush=True)
    cpu = cpu_model()
    lines = [f"DeBERTa attention core, forward + backward, float32, {args.threads} threads, {cpu}; "
             f"H = {HEADS}, d = {HEAD_DIM}, {BUCKETS} buckets to {MAX_RELATIVE}, c2p + p2c; "
             f"transformers and relpos agree to {agreement:.1e}.", "",
             "| B | L | transformers ms | relpos ms | speed | relpos plain ms | c2p+p2c over plain "
             "| transformers peak MB | relpos peak MB | memory |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['B']} | {r['L']} | {r['transformers_ms']:.0f} | {r['relpos_ms']:.0f} | {r['speed']:.2f}x "
                     f"| {r['plain_ms']:.0f} | {r['over_plain']:.2f}x | {r['transformers_peak_mb']:.0f} "
                     f"| {r['relpos_peak_mb']:.0f} | {r['memory_ratio']:.1f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    prefix = results_prefix(args.out, "deberta")
    prefix.with_suffix(".md").write_text(text)
    prefix.with_suffix(".json").write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
