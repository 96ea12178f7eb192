"""Train a small relative-position attention stack with DistributedDataParallel on CPU.

    torchrun --nproc_per_node 2 python/examples/ddp_train.py --scheme xl --steps 20

Each process takes its share of a synthetic copy task (predict the token `shift`
positions back, which only relative positions make easy), gradients are averaged
by DDP over the gloo backend, and rank 0 prints the loss. Runs as a single
process too (`python python/examples/ddp_train.py`).
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import relpos.torch as rt


class TinyModel(nn.Module):
    """Embedding -> `layers` x (pre-norm relative attention + MLP) -> logits."""

    def __init__(self, vocab: int, dim: int, heads: int, layers: int, scheme: str, threads: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(2 * layers))
        self.attn = nn.ModuleList(
            rt.RelativeMultiheadAttention(dim, heads, scheme, shaw_k=8, threads=threads) for _ in range(layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for i, (attn, mlp) in enumerate(zip(self.attn, self.mlp)):
            x = x + attn(self.norms[2 * i](x), causal=True)
            x = x + mlp(self.norms[2 * i + 1](x))
        return self.head(x)


def batch(step: int, rank: int, per_rank: int, length: int, vocab: int, shift: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, vocab, (per_rank, length), generator=g)
    target = torch.roll(tokens, shift, 1)
    target[:, :shift] = -100  # no target before the first copied token
    return tokens, target


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scheme", default="shaw", choices=rt.SCHEMES)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8, help="per process")
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--shift", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="relpos threads per process")
    args = ap.parse_args()

    distributed = "WORLD_SIZE" in os.environ  # set by torchrun
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    vocab = 32
    model = TinyModel(vocab, 64, 4, 2, args.scheme, args.threads)
    if distributed:
        model = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        tokens, target = batch(step, rank, args.batch, args.length, vocab, args.shift)
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), target.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
