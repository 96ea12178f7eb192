"""Positions on a grid against transformers, in one run: SAM's image encoder and one of its global
attention layers, and a Swin block.

    .venv/bin/python bench/sam.py              # SAM ViT-B at 1024 x 1024, Swin-T's first block (minutes; ~8 GB)
    .venv/bin/python bench/sam.py --quick      # small sizes, one rep: checks that every row runs

Rows (float32, forward, eval mode; "speed" = peer time / relpos time, > 1: relpos faster):

    encoder   SamVisionModel (ViT-B: width 768, 12 layers, 12 heads, windows of 14, global layers 2, 5,
              8, 11) on one image: patched by rt.patch_hf_sam against transformers' own (eager)
    global    one global layer's attention core on the 64 x 64 feature map, from projected q, k, v
              to the context: relpos.SAM against transformers' SamVisionAttention itself (its
              projections replaced by the given tensors) and against SDPA given the decomposed
              terms as a dense (B, H, L, L) bias, made outside the timed call
    swin      SwinLayer of Swin-T's first stage (width 96, 3 heads, windows of 7, shifted) on a
              56 x 56 map of 8 images: patched by rt.patch_hf_swin against transformers' own

Speed: each row in a fresh process, the median ms of --reps calls (10 x --reps for the Swin block)
after a warm-up, the sides alternating. Peak memory: each side once in a fresh process, the growth of its resident set's high-water mark (VmHWM, reset first)
over the resident set with its inputs made. Each row checks that its sides agree (1e-4) before
timing them. Writes bench/results/sam_<cpu>.md and .json (or --out PREFIX).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import SamVisionConfig, SamVisionModel, SwinConfig
from transformers.models.sam.modeling_sam import SamVisionAttention
from transformers.models.swin.modeling_swin import SwinLayer

import relpos
import relpos.torch as rt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import cpu_model, in_fresh_process, interleaved_median_ms, peak_growth_mb, results_prefix  # noqa: E402

SIZES = {  # image, patch, width, layers, heads, window, global layers; Swin: map, width, heads, window, images
    "full": dict(image=1024, patch=16, width=768, layers=12, heads=12, window=14, globals=(2, 5, 8, 11),
                 swin_map=56, swin_width=96, swin_heads=3, swin_window=7, swin_images=8),
    "quick": dict(image=128, patch=16, width=64, layers=2, heads=4, window=4, globals=(1,),
                  swin_map=14, swin_width=32, swin_heads=2, swin_window=7, swin_images=2),
}


def sam_models(s: dict):
    config = SamVisionConfig(hidden_size=s["width"], output_channels=256, num_hidden_layers=s["layers"],
                             num_attention_heads=s["heads"], image_size=s["image"], patch_size=s["patch"],
                             window_size=s["window"], global_attn_indexes=list(s["globals"]),
                             attn_implementation="eager")
    torch.manual_seed(0)
    upstream = SamVisionModel(config).eval()
    with torch.no_grad():  # SAM's vision config draws weights of std 1e-10 and tables of zeros: trained ones are not
        for name, p in upstream.named_parameters():
            if "rel_pos" in name:
                p.normal_(0, 0.1)
            elif p.dim() > 1:
                p.normal_(0, 0.02)
    return upstream, rt.patch_hf_sam(copy.deepcopy(upstream))


def encoder_steps(s: dict):
    upstream, ours = sam_models(s)
    pixels = torch.randn(1, 3, s["image"], s["image"])

    def run(model):
        def step():
            with torch.no_grad():
                return model(pixels).last_hidden_state
        return step
    return run(upstream), run(ours)


class Given(torch.nn.Module):
    """A projection that returns given q, k, v: transformers' attention reads them from its qkv linear."""

    def __init__(self, qkv: torch.Tensor):
        super().__init__()
        self.qkv = qkv

    def forward(self, _):
        return self.qkv


def global_steps(s: dict):
    """transformers' global attention core, relpos's, and SDPA with the dense decomposed bias."""
    side, heads, width = s["image"] // s["patch"], s["heads"], s["width"]
    d = width // heads
    upstream, _ = sam_models(s)
    attn = upstream.vision_encoder.layers[s["globals"][0]].attn
    attn.proj = torch.nn.Identity()
    L = side * side
    qkv = torch.randn(1, L, 3 * width)
    attn.qkv = Given(qkv)
    hidden = torch.zeros(1, side, side, width)
    q, k, v = qkv.reshape(1, L, 3, heads, d).unbind(2)  # (B, L, heads, d)
    scheme = relpos.SAM(attn.rel_pos_h.detach(), attn.rel_pos_w.detach(), q_height=side, q_width=side)
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    with torch.no_grad():
        bias = attn.get_decomposed_rel_pos(qh.reshape(heads, L, d), attn.rel_pos_h, attn.rel_pos_w, (side, side),
                                           (side, side)).reshape(1, heads, L, L)

    def transformers():
        with torch.no_grad():
            return attn(hidden)[0].reshape(1, L, width)

    def ours():
        with torch.no_grad():
            return rt.attention(q, k, v, scheme, scale=attn.scale, layout="blhd").reshape(1, L, width)

    def sdpa():
        with torch.no_grad():
            return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias).transpose(1, 2).reshape(1, L, width)
    return transformers, ours, sdpa


def swin_steps(s: dict):
    config = SwinConfig(embed_dim=s["swin_width"], num_heads=[s["swin_heads"]], depths=[2],
                        window_size=s["swin_window"], attn_implementation="eager")
    torch.manual_seed(0)
    upstream = SwinLayer(config, dim=s["swin_width"], input_resolution=(s["swin_map"],) * 2,
                         num_heads=s["swin_heads"], shift_size=s["swin_window"] // 2).eval()
    with torch.no_grad():
        upstream.attention.relative_position_bias.relative_position_bias_table.normal_(0, 0.02)
    ours = rt.patch_hf_swin(copy.deepcopy(upstream))
    x = torch.randn(s["swin_images"], s["swin_map"] ** 2, s["swin_width"])

    def run(layer):
        def step():
            with torch.no_grad():
                return layer(x, (s["swin_map"], s["swin_map"]))[0]
        return step
    return run(upstream), run(ours)


STEPS = {"encoder": encoder_steps, "global": global_steps, "swin": swin_steps}
# --reps times this per row: a Swin block's call is ~0.1 s, its time varied by +-15% from call to call
# on a shared 2-core machine, so its median takes more calls than the encoder's ~20 s ones.
REPS_FACTOR = {"encoder": 1, "global": 1, "swin": 10}


def measure_peak(row: str, side: int, size: str, threads: int) -> float:
    """In this process: the high-water mark of one call of side `side` of row `row` over the
    resident set before it (inputs made), in MB (timing.peak_growth_mb)."""
    torch.set_num_threads(threads)
    return peak_growth_mb(STEPS[row](SIZES[size])[side])


def measure_times(row: str, size: str, reps: int, threads: int) -> list:
    """In this process: [the sides' largest difference, [each side's median ms]] of row `row`."""
    torch.set_num_threads(threads)
    steps = STEPS[row](SIZES[size])
    agreement = (steps[0]() - steps[1]()).abs().max().item()
    return [agreement, interleaved_median_ms(list(steps), reps)]


def timed_in_fresh_process(row: str, size: str, reps: int, threads: int) -> tuple[float, list[float]]:
    """measure_times in a fresh process: each row starts from the same state of the allocator and the
    threads, whatever ran before it (the SAM rows' calls hold gigabytes)."""
    agreement, times = in_fresh_process("sam", f"measure_times({row!r}, {size!r}, {reps}, {threads})")
    return float(agreement), [float(t) for t in times]


def peak_mb(row: str, side: int, size: str, threads: int) -> float:
    """measure_peak in a fresh process (each side's allocator starts empty)."""
    return float(in_fresh_process("sam", f"measure_peak({row!r}, {side}, {size!r}, {threads})"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, one rep: check that every row runs")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    size = "quick" if args.quick else "full"
    reps = 1 if args.quick else args.reps
    torch.set_num_threads(args.threads)
    rows = []
    for row, peers in (("encoder", ["transformers"]), ("global", ["transformers", "SDPA, dense bias"]),
                       ("swin", ["transformers"])):
        agreement, times = timed_in_fresh_process(row, size, reps * REPS_FACTOR[row], args.threads)
        if not agreement < 1e-4:
            raise SystemExit(f"sam bench: {row}: transformers and relpos differ by {agreement:g}")
        relpos_mb = peak_mb(row, 1, size, args.threads)
        for n, peer in enumerate(peers):
            side = 0 if n == 0 else 2
            peer_mb = peak_mb(row, side, size, args.threads)
            rows.append({"row": row, "peer": peer, "peer_ms": times[side], "relpos_ms": times[1],
                         "speed": times[side] / times[1], "peer_peak_mb": peer_mb, "relpos_peak_mb": relpos_mb,
                         "memory_ratio": peer_mb / max(relpos_mb, 1e-9), "agreement": agreement})
            print(json.dumps(rows[-1]), flush=True)
    cpu, s = cpu_model(), SIZES[size]
    lines = [f"Positions on a grid, forward, float32, {args.threads} threads, {cpu}; SAM ViT at "
             f"{s['image']} x {s['image']} (width {s['width']}, {s['layers']} layers, {s['heads']} heads, windows of "
             f"{s['window']}), Swin block on {s['swin_map']} x {s['swin_map']} x {s['swin_images']} "
             f"(width {s['swin_width']}, windows of {s['swin_window']}, shifted). Command: `python bench/sam.py"
             f"{' --quick' if args.quick else ''}`.", "",
             "| row | peer | peer ms | relpos ms | speed | peer peak MB | relpos peak MB | memory | agree |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['row']} | {r['peer']} | {r['peer_ms']:.1f} | {r['relpos_ms']:.1f} | {r['speed']:.2f}x "
                     f"| {r['peer_peak_mb']:.0f} | {r['relpos_peak_mb']:.0f} | {r['memory_ratio']:.1f}x "
                     f"| {r['agreement']:.1e} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.quick and not args.out:
        return
    prefix = results_prefix(args.out, "sam")
    prefix.with_suffix(".md").write_text(text)
    prefix.with_suffix(".json").write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
