"""A whole DeBERTa-v2/v3 training step, patched by relpos against transformers unpatched, in one run.

    .venv/bin/python bench/deberta_step.py           # tiny, small and base sizes (a few minutes)
    .venv/bin/python bench/deberta_step.py --quick   # the tiny size, one rep: checks that it runs

DebertaV2ForSequenceClassification from a random DeBERTa-v3 style configuration (256 log
buckets reaching 512, c2p and p2c, relative embeddings shared with the content projections
and layer-normed; no download), float32, the same weights on both sides (the patched model is
loaded from the unpatched one's state), without dropout and with DeBERTa-v3's configured dropout
(0.1 on the hidden states and on the attention probabilities: transformers draws its mask, relpos
its own). A step: forward, cross-entropy loss, backward, AdamW step. Median ms of --reps steps per
side after a warm-up step, the two sides alternating. Before any timing the two sides' losses
must agree (relative 1e-4): the first step's without dropout; with dropout, the loss of the
model in eval mode (the masks differ, not the function). Writes
bench/results/deberta_step_<cpu>.md (or --out FILE).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

import relpos.torch as rt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import cpu_model, interleaved_median_ms, results_prefix  # noqa: E402

# name: (hidden, layers, heads, B, L); base is DeBERTa-v3-base's encoder (86M parameters besides its embeddings)
SIZES = {"tiny": (128, 2, 4, 8, 128), "small": (384, 6, 6, 8, 256), "base": (768, 12, 12, 4, 512)}


def config(hidden: int, layers: int, heads: int, dropout: float) -> DebertaV2Config:
    return DebertaV2Config(vocab_size=1000, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                           intermediate_size=4 * hidden, max_position_embeddings=512, relative_attention=True,
                           position_buckets=256, max_relative_positions=512, pos_att_type=["p2c", "c2p"],
                           share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
                           hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, num_labels=3,
                           type_vocab_size=0)


def training_step(model, batch):
    """A closure running one step of ``model`` on ``batch``, returning the loss; the first
    call's loss is kept in ``step.first``."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        if step.first is None:
            step.first = loss.item()
        return loss
    step.first = None
    return step


def eval_loss(model, batch) -> float:
    """The model's loss on batch in eval mode (no dropout), its mode restored."""
    model.eval()
    with torch.no_grad():
        loss = model(**batch).loss.item()
    model.train()
    return loss


def measure(name: str, reps: int, dropout: float) -> dict:
    hidden, layers, heads, B, L = SIZES[name]
    cfg = config(hidden, layers, heads, dropout)
    torch.manual_seed(0)
    plain = DebertaV2ForSequenceClassification(cfg).train()
    patched = DebertaV2ForSequenceClassification(cfg).train()
    patched.load_state_dict(plain.state_dict())
    rt.patch_hf_deberta(patched)
    g = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(0, cfg.vocab_size, (B, L), generator=g),
             "labels": torch.randint(0, cfg.num_labels, (B,), generator=g)}
    losses = [eval_loss(plain, batch), eval_loss(patched, batch)] if dropout else None
    steps = [training_step(plain, batch), training_step(patched, batch)]
    for s in steps:  # the first (untimed) step: the losses must agree before anything is timed
        s()
    if not dropout:
        losses = [steps[0].first, steps[1].first]
    gap = abs(losses[0] - losses[1]) / abs(losses[0])
    if not gap < 1e-4:
        raise SystemExit(f"deberta_step: {name}: patched loss {losses[1]} != unpatched {losses[0]}")
    plain_ms, patched_ms = interleaved_median_ms(steps, reps)
    return {"size": name, "dropout": dropout, "hidden": hidden, "layers": layers, "heads": heads, "B": B, "L": L,
            "loss_gap": gap, "transformers_ms": plain_ms, "relpos_ms": patched_ms, "speed": plain_ms / patched_ms}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default=",".join(SIZES), help="comma list of " + ", ".join(SIZES))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dropouts", default="0,0.1", help="comma list of dropout probabilities (each size's rows)")
    ap.add_argument("--quick", action="store_true", help="the tiny size, one rep")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.reps = "tiny", 1
    unknown = [s for s in args.sizes.split(",") if s not in SIZES]
    if unknown:
        ap.error(f"--sizes: unknown {', '.join(unknown)} (known: {', '.join(SIZES)})")
    torch.set_num_threads(args.threads)
    cpu = cpu_model()
    lines = [f"DebertaV2ForSequenceClassification training step (forward, loss, backward, AdamW), float32, "
             f"{args.threads} threads, {cpu}; 256 buckets to 512, c2p + p2c; median of {args.reps} alternating steps.",
             "", "| size | hidden | layers | heads | B | L | dropout | transformers ms | patched by relpos ms | speed "
             "| losses, relative gap |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in args.sizes.split(","):
        for dropout in (float(x) for x in args.dropouts.split(",")):
            r = measure(name, args.reps, dropout)
            print(r, flush=True)
            lines.append(f"| {r['size']} | {r['hidden']} | {r['layers']} | {r['heads']} | {r['B']} | {r['L']} "
                         f"| {r['dropout']:g} | {r['transformers_ms']:.0f} | {r['relpos_ms']:.0f} | {r['speed']:.2f}x "
                         f"| {r['loss_gap']:.1e} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out) if args.out else results_prefix("", "deberta_step").with_suffix(".md")
    out.write_text(text)


if __name__ == "__main__":
    main()
