"""RelativeMultiheadAttention trains under DistributedDataParallel: two CPU processes
(gloo) on halves of a batch end with the parameters of one process trained on the
whole batch."""
from __future__ import annotations

import math
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import relpos.torch as rt

STEPS, BATCH, L, E, H = 3, 4, 10, 16, 4


def make_model_and_data():
    torch.set_default_dtype(torch.float64)  # spawned processes do not run conftest
    torch.manual_seed(0)
    model = rt.RelativeMultiheadAttention(E, H, "shaw", shaw_k=3, shaw_per_head=True, threads=1).double()
    x = torch.randn(STEPS, BATCH, L, E, dtype=torch.float64)
    target = torch.randn(STEPS, BATCH, L, E, dtype=torch.float64)
    pad = torch.rand(STEPS, BATCH, L) < 0.2
    return model, x, target, pad


def train(model, x, target, pad):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(x.shape[0]):
        opt.zero_grad()
        y = model(x[step], causal=True, key_padding=pad[step])
        loss = ((y - target[step]) ** 2).mean()
        loss.backward()
        opt.step()


def worker(rank: int, world: int, port: int, path: str):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model, x, target, pad = make_model_and_data()
        shard = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        # DDP averages gradients over ranks: the mean loss of each half averages to the whole batch's.
        train(DistributedDataParallel(model), x[:, shard], target[:, shard], pad[:, shard])
        torch.save(model.state_dict(), f"{path}.{rank}")
        # Both ranks done before either tears the group down: without it, one
        # rank in about a dozen runs aborted in teardown ("terminate called
        # without an active exception") on a 2-core machine.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_equal_one_process_on_the_whole_batch(tmp_path):
    path = str(tmp_path / "params")
    mp.spawn(worker, args=(2, free_port(), path), nprocs=2, join=True)

    model, x, target, pad = make_model_and_data()
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    train(model, x, target, pad)
    for rank in range(2):
        got = torch.load(f"{path}.{rank}")
        for name, p in model.named_parameters():
            # A key bias adds q.b to a whole row of logits, which softmax ignores: no gradient.
            if name != "k_proj.bias":
                assert (p - initial[name]).abs().max() > 1e-4, f"{name} did not train"
            torch.testing.assert_close(got[name], p.detach(), rtol=1e-10, atol=1e-12, msg=lambda m: f"rank {rank}: {name}: {m}")


def test_ddp_example_script_trains_in_one_process():
    """python/examples/ddp_train.py (the README's torchrun example) runs without torchrun too."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "python" / "examples" / "ddp_train.py"
    p = subprocess.run([sys.executable, str(script), "--steps", "3", "--length", "16", "--batch", "2"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    losses = [float(line.split()[-1]) for line in p.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), p.stdout
