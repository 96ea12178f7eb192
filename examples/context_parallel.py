"""Train a small byte-level language model with its sequence split over processes.

    .venv/bin/torchrun --nproc-per-node 2 examples/context_parallel.py            # 2 processes
    .venv/bin/python examples/context_parallel.py                                # 1 process, same losses

Every process holds the same model and its share of each sequence (shard_sequence's
zigzag pieces, so that the causal mask costs every rank the same); attention runs
as ring attention (RelativeMultiheadAttention(context_parallel=True)), everything
else is per token. The loss is the mean over all tokens of the batch: each rank sums
its tokens' losses, and the gradients of the replicated parameters are summed over
the processes after backward. The losses printed equal those of one process on the
whole sequences (to rounding; in float64, to 1e-10). Text comes from the program.
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn

import relpos.torch as rt
from relpos.context_parallel import shard_sequence


def text(n_bytes: int) -> torch.Tensor:
    """Deterministic English-like text: numbered sentences from a few words."""
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "far", "away"]
    out, i = [], 0
    while sum(len(s) for s in out) < n_bytes:
        out.append(f"{i}: " + " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(5 + i % 4)) + ". ")
        i += 1
    return torch.tensor(list("".join(out).encode()[:n_bytes]), dtype=torch.long)


class Block(nn.Module):
    def __init__(self, width: int, heads: int, scheme: str, context_parallel):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = rt.RelativeMultiheadAttention(width, heads, scheme, context_parallel=context_parallel)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, segments):
        x = x + self.attention(self.norm1(x), causal=True, segments=segments)
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self, width: int, heads: int, layers: int, scheme: str, context_parallel):
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.blocks = nn.ModuleList(Block(width, heads, scheme, context_parallel) for _ in range(layers))
        self.head = nn.Linear(width, 256)

    def forward(self, tokens, segments):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, segments)
        return self.head(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scheme", default="alibi", choices=rt.SCHEMES)
    parser.add_argument("--length", type=int, default=256, help="tokens per sequence (split over the processes)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--json", default="", help="write the losses here (rank 0)")
    args = parser.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.set_num_threads(1 if distributed else torch.get_num_threads())
    torch.manual_seed(0)  # the same initial model on every rank
    dtype = getattr(torch, args.dtype)
    model = Model(args.width, args.heads, args.layers, args.scheme, True if distributed else None).to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = text(args.batch * (args.length + 1) * args.steps)
    losses = []
    for step in range(args.steps):
        chunk = data[step * args.batch * (args.length + 1):(step + 1) * args.batch * (args.length + 1)]
        sequences = chunk.view(args.batch, args.length + 1)
        inputs, targets = sequences[:, :-1], sequences[:, 1:]
        if distributed:  # this rank's zigzag pieces of every sequence
            inputs, segments = shard_sequence(inputs, rank, world)
            targets, _ = shard_sequence(targets, rank, world)
        else:
            segments = None
        logits = model(inputs, segments)
        # this rank's share of the mean over all tokens of the batch
        loss = nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1), reduction="sum")
        loss = loss / (args.batch * args.length)
        optimizer.zero_grad()
        loss.backward()
        total = loss.detach().clone()
        if distributed:
            dist.all_reduce(total)
            for p in model.parameters():  # replicated parameters: sum every rank's share
                if p.grad is not None:
                    dist.all_reduce(p.grad)
        optimizer.step()
        losses.append(total.item())
        if rank == 0:
            print(f"step {step + 1:3d}  loss {total.item():.6f}", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"processes": world, "scheme": args.scheme, "losses": losses}, f)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
