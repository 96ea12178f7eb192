"""Training speed of relpos's C++ trainer against PyTorch eager on the same model.

Both sides train the same byte-level transformer (pre-LayerNorm blocks, tied
output head, erf GELU, causal attention), the same position scheme, the same
shapes, AdamW settings, warmup + cosine schedule and gradient clipping, on the
same corpus, with the same number of threads, one after the other in this run.
The PyTorch model is written here the way PyTorch users write it: SDPA with
is_causal for none / sinusoidal / learned / RoPE, SDPA with a materialised
float bias for ALiBi, T5 and both KERPLEs (learnable r1, r2 clamped at 0.01,
as the KERPLE paper's code does), materialised relative embeddings for Shaw (as
OpenNMT-py does), and Transformer-XL as its original code computes it: u and v
biases, positional keys W_R R from a sinusoid of every distance, the
zero-pad "rel_shift", and a memory of the previous segment's keys and values
(detached) over contiguous segments per batch row, as relpos's trainer keeps it. Reported: training tokens per second of each and their
ratio (relpos over PyTorch, > 1: relpos faster). With --dtypes bf16 both train
in bfloat16 mixed precision: relpos with --dtype bf16, PyTorch under
torch.autocast("cpu", torch.bfloat16), the way PyTorch users ask for it; with
--dtypes float32,bf16 a last column also gives each row over PyTorch's float32
speed on the same scheme in this run.

    .venv/bin/python bench/train_speed.py                      # every scheme, defaults
    .venv/bin/python bench/train_speed.py --positions alibi --steps 300 --threads 1
    .venv/bin/python bench/train_speed.py --dtypes float32,bf16   # both, side by side
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMES = ["none", "sinusoidal", "learned", "alibi", "t5", "rope", "shaw", "kerple", "kerple_power", "xl"]
KERPLE_FLOOR = 0.01  # the lower clamp of KERPLE's r1 and r2, in relpos's model and the paper's code
FORTUNES = pathlib.Path("/usr/share/games/fortunes")


def corpus_bytes(path: str | None) -> bytes:
    """The trainer's corpus: --data, or the English fortune files in sorted order."""
    if path:
        return pathlib.Path(path).read_bytes()
    files = sorted(p for p in FORTUNES.iterdir() if p.is_file() and p.suffix not in (".dat", ".u8"))
    return b"".join(p.read_bytes() for p in files)


def alibi_slopes(heads: int) -> torch.Tensor:
    """The ALiBi paper's slopes, including non-power-of-2 head counts."""
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    if math.log2(heads).is_integer():
        return torch.tensor(power_of_2(heads))
    closest = 2 ** math.floor(math.log2(heads))
    return torch.tensor(power_of_2(closest) + power_of_2(2 * closest)[0::2][: heads - closest])


def t5_causal_bucket(relative: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """HF T5's _relative_position_bucket with bidirectional=False."""
    n = -torch.clamp(relative, max=0)
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.clamp(large, max=num_buckets - 1)
    return torch.where(n < max_exact, n, large)


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Transformer-XL's zero-pad shift: (..., L, K) scores against distances K-1 .. 0
    become scores against keys, query i at key position K - L + i (the upper
    triangle, future keys, holds leftovers that the mask hides)."""
    *batch, L, K = x.shape
    padded = F.pad(x, (1, 0)).view(*batch, K + 1, L)
    return padded[..., 1:, :].reshape(*batch, L, K)


class Block(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        w, self.heads, self.position = a.width, a.heads, a.position
        self.ln1, self.ln2 = torch.nn.LayerNorm(w), torch.nn.LayerNorm(w)
        self.qkv, self.out = torch.nn.Linear(w, 3 * w), torch.nn.Linear(w, w)
        self.up, self.down = torch.nn.Linear(w, a.ffn), torch.nn.Linear(a.ffn, w)
        if a.position == "shaw":
            dh = w // a.heads
            self.wk = torch.nn.Parameter(0.02 * torch.randn(2 * a.shaw_k + 1, dh))
            self.wv = torch.nn.Parameter(0.02 * torch.randn(2 * a.shaw_k + 1, dh))
        if a.position in ("kerple", "kerple_power"):  # per layer, initialised to 1 as relpos's model does
            self.kerple_r1 = torch.nn.Parameter(torch.ones(a.heads))
            self.kerple_r2 = torch.nn.Parameter(torch.ones(a.heads))
        if a.position == "xl":  # W_R per layer: (heads, head_dim, width)
            self.xl_w_r = torch.nn.Parameter(0.02 * torch.randn(a.heads, w // a.heads, w))

    def kerple_bias(self, distance, future):
        """KERPLE's bias from |key - query|, future keys -inf."""
        r1 = self.kerple_r1.clamp(min=KERPLE_FLOOR)[:, None, None]
        if self.position == "kerple":
            bias = -r1 * torch.log1p(self.kerple_r2.clamp(min=KERPLE_FLOOR)[:, None, None] * distance)
        else:
            bias = -r1 * distance.pow(self.kerple_r2.clamp(min=KERPLE_FLOOR, max=2.0)[:, None, None])
        return bias.masked_fill(future, float("-inf"))

    def xl_attention(self, q, k, v, xl):
        """Transformer-XL's attention in its original form; xl = (u, v, sinusoid of distances klen-1..0, memory)."""
        u, v_bias, sinusoid, memory = xl
        L, dh = q.shape[2], q.shape[3]
        if memory is not None:
            k, v = torch.cat([memory[0], k], 2), torch.cat([memory[1], v], 2)
        self.new_memory = (k[:, :, -L:].detach(), v[:, :, -L:].detach())
        klen = k.shape[2]
        r_k = torch.einsum("pw,hdw->hpd", sinusoid[-klen:], self.xl_w_r)  # positional keys, distance klen-1-p
        ac = (q + u[:, None]) @ k.transpose(-1, -2)
        bd = rel_shift((q + v_bias[:, None]) @ r_k.transpose(-1, -2))
        future = torch.ones(L, klen, dtype=torch.bool).triu(klen - L + 1)
        p = ((ac + bd) / math.sqrt(dh)).masked_fill(future, float("-inf")).softmax(-1)
        return p @ v

    def attention(self, x, bias, rope, shaw_index, xl):
        B, L, w = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        if rope is not None:
            cos, sin = rope
            half = q.shape[-1] // 2
            rotate = lambda t: t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin
            q, k = rotate(q), rotate(k)
        if self.position == "shaw":  # OpenNMT-py style: materialised (L, L, dh) relative embeddings
            ak, av = self.wk[shaw_index], self.wv[shaw_index]
            logits = (q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, ak)) / math.sqrt(q.shape[-1])
            logits = logits.masked_fill(shaw_index.new_ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
            p = logits.softmax(-1)
            y = p @ v + torch.einsum("bhij,ijd->bhid", p, av)
        elif self.position == "xl":
            y = self.xl_attention(q, k, v, xl)
        elif self.position in ("kerple", "kerple_power"):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.kerple_bias(*bias))
        elif bias is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, L, w))

    def forward(self, x, bias, rope, shaw_index, xl):
        x = x + self.attention(self.ln1(x), bias, rope, shaw_index, xl)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TorchModel(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.embedding = torch.nn.Embedding(256, a.width)
        torch.nn.init.normal_(self.embedding.weight, std=0.02)
        self.blocks = torch.nn.ModuleList(Block(a) for _ in range(a.layers))
        self.final_ln = torch.nn.LayerNorm(a.width)
        if a.position == "learned":
            self.positions = torch.nn.Parameter(0.02 * torch.randn(a.length, a.width))
        if a.position == "t5":
            self.t5_table = torch.nn.Parameter(0.02 * torch.randn(a.heads, a.t5_buckets))
        if a.position == "xl":  # u and v shared by the layers, as in relpos's model and the original code
            dh = a.width // a.heads
            self.xl_u = torch.nn.Parameter(0.02 * torch.randn(a.heads, dh))
            self.xl_v = torch.nn.Parameter(0.02 * torch.randn(a.heads, dh))
            self.memory = [None] * a.layers

    def forward(self, tokens):
        a, L = self.a, tokens.shape[1]
        x = self.embedding(tokens)
        pos = torch.arange(L)
        bias = rope = shaw_index = xl = None
        relative = pos[None, :] - pos[:, None]  # key minus query
        future = relative > 0
        if a.position == "sinusoidal":
            inv = 1.0 / 10000 ** (torch.arange(0, a.width, 2) / a.width)
            angle = pos[:, None] * inv[None, :]
            x = x + torch.cat([angle.sin(), angle.cos()], -1)
        elif a.position == "learned":
            x = x + self.positions[:L]
        elif a.position == "alibi":
            bias = (-alibi_slopes(a.heads)[:, None, None] * relative.abs()).masked_fill(future, float("-inf"))
        elif a.position == "t5":
            bucket = t5_causal_bucket(relative, a.t5_buckets, a.t5_max_distance)
            bias = self.t5_table[:, bucket].masked_fill(future, float("-inf"))
        elif a.position == "rope":
            dh = a.width // a.heads
            inv = 1.0 / 10000 ** (torch.arange(0, dh, 2) / dh)
            angle = torch.cat([pos[:, None] * inv] * 2, -1)
            rope = (angle.cos(), angle.sin())
        elif a.position == "shaw":
            shaw_index = relative.clamp(-a.shaw_k, a.shaw_k) + a.shaw_k
        elif a.position in ("kerple", "kerple_power"):
            bias = (relative.abs().float(), future)
        elif a.position == "xl":  # the sinusoid of distances 2L-1 .. 0 (memory of L keys), sliced per call
            inv = 1.0 / 10000 ** (torch.arange(0, a.width, 2) / a.width)
            angle = torch.arange(2 * L - 1, -1, -1.0)[:, None] * inv[None, :]
            sinusoid = torch.cat([angle.sin(), angle.cos()], -1)
        for i, block in enumerate(self.blocks):
            if a.position == "xl":
                xl = (self.xl_u, self.xl_v, sinusoid, self.memory[i])
            x = block(x, bias, rope, shaw_index, xl)
            if a.position == "xl":
                self.memory[i] = block.new_memory
        return self.final_ln(x) @ self.embedding.weight.T  # tied head


def torch_tokens_per_second(a, data: torch.Tensor) -> float:
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    model = TorchModel(a)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "positions" not in n
             and "table" not in n and not n.endswith(("wk", "wv")) and "xl_" not in n]
    rest = [p for p in model.parameters() if all(p is not d for d in decay)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.99), eps=1e-8)
    def lr_factor(step):
        if step < a.warmup:
            return (step + 1) / a.warmup
        t = (step - a.warmup) / max(1, a.steps - a.warmup)
        return a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    gen = torch.Generator().manual_seed(a.seed)
    # Transformer-XL reads each batch row's text in consecutive segments (its memory
    # holds the previous one), like relpos's trainer; the others sample at random.
    stride = (len(data) - a.length - 1) // a.batch
    first = torch.arange(a.batch) * stride
    start = None
    for step in range(a.steps + 1):  # step 0 warms up and is not timed
        if step == 1:
            start = time.perf_counter()
        if a.position == "xl":
            offsets = (first + step * a.length) % (len(data) - a.length - 1)
        else:
            offsets = torch.randint(0, len(data) - a.length - 1, (a.batch,), generator=gen)
        rows = torch.stack([data[o:o + a.length + 1] for o in offsets.tolist()]).long()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = model(rows[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 256), rows[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        sched.step()
    return a.steps * a.batch * a.length / (time.perf_counter() - start)


def relpos_tokens_per_second(a, relpos_cli: str, workdir: str, run: int = 0) -> float:
    name = f"{a.position}_{a.dtype}_{run}"
    out = os.path.join(workdir, f"{name}.json")
    cmd = [relpos_cli, "train", "--positions", a.position, "--length", str(a.length), "--layers", str(a.layers),
           "--width", str(a.width), "--heads", str(a.heads), "--ffn", str(a.ffn), "--shaw-k", str(a.shaw_k),
           "--t5-buckets", str(a.t5_buckets), "--t5-max-distance", str(a.t5_max_distance),
           "--steps", str(a.steps), "--batch", str(a.batch), "--lr", str(a.lr), "--warmup", str(a.warmup),
           "--min-lr-ratio", str(a.min_lr_ratio), "--weight-decay", str(a.weight_decay), "--clip", str(a.clip),
           "--seed", str(a.seed), "--threads", str(a.threads), "--eval-bytes", "4096", "--dtype", a.dtype,
           "--checkpoint", os.path.join(workdir, f"{name}.ckpt"), "--json", out]
    if a.data:
        cmd += ["--data", a.data]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads(pathlib.Path(out).read_text())
    return result["steps"] * result["batch"] * result["length"] / result["seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--positions", default=",".join(SCHEMES), help="comma-separated schemes: " + ", ".join(SCHEMES))
    ap.add_argument("--data", default=None, help="training text (default: the fortunes corpus)")
    for name, default in [("length", 64), ("layers", 2), ("width", 128), ("heads", 4), ("ffn", 512),
                          ("shaw-k", 16), ("t5-buckets", 32), ("t5-max-distance", 128), ("steps", 200),
                          ("batch", 16), ("warmup", 20), ("threads", 2), ("seed", 1)]:
        ap.add_argument("--" + name, type=int, default=default)
    for name, default in [("lr", 3e-3), ("min-lr-ratio", 0.1), ("weight-decay", 0.1), ("clip", 1.0)]:
        ap.add_argument("--" + name, type=float, default=default)
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each side per row, alternating relpos and PyTorch; the table gives their medians")
    ap.add_argument("--dtypes", default="float32", help="comma-separated: float32, bf16 (mixed precision)")
    ap.add_argument("--relpos", default=shutil.which("relpos") or str(ROOT / ".venv/bin/relpos"),
                    help="the relpos command (default: the one on PATH or in .venv)")
    ap.add_argument("--json", default=str(ROOT / "results/train_speed.json"), help="where to write the results")
    a = ap.parse_args()
    positions = a.positions.split(",")
    unknown = [p for p in positions if p not in SCHEMES]
    if unknown:
        ap.error(f"--positions: unknown scheme(s) {unknown}; choose from {SCHEMES}")
    dtypes = a.dtypes.split(",")
    if any(d not in ("float32", "bf16") for d in dtypes):
        ap.error(f"--dtypes: expected float32 and/or bf16, got {a.dtypes}")
    if a.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {a.repeats}")
    if a.width % a.heads:
        ap.error(f"--width {a.width} must be a multiple of --heads {a.heads}")
    if not os.access(a.relpos, os.X_OK):
        ap.error(f"--relpos: {a.relpos} is not an executable; run scripts/setup.sh first")
    data = torch.frombuffer(bytearray(corpus_bytes(a.data)), dtype=torch.uint8)
    if len(data) < 2 * (a.length + 1):
        ap.error(f"the corpus has {len(data)} bytes, fewer than two sequences of --length {a.length}")

    print(f"training tokens/s, layers={a.layers} width={a.width} heads={a.heads} ffn={a.ffn} length={a.length} "
          f"batch={a.batch} steps={a.steps} threads={a.threads}, torch {torch.__version__}"
          + (f"; medians of {a.repeats} alternating runs per side, ratio range: the runs' pairs" if a.repeats > 1 else ""))
    spread = a.repeats > 1
    print(f"{'scheme':<12}{'dtype':>8}{'relpos tok/s':>14}{'torch tok/s':>14}{'relpos/torch':>14}"
          f"{'vs torch f32':>14}" + (f"{'ratio range':>16}" if spread else ""))
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        # A short untimed run of each side first: without it the table's first
        # row measured up to 20% slow, whichever scheme it was.
        warm = argparse.Namespace(**{**vars(a), "position": positions[0], "dtype": dtypes[0], "steps": 30,
                                     "warmup": 10})
        warm_dir = pathlib.Path(workdir) / "warm-up"
        warm_dir.mkdir()
        relpos_tokens_per_second(warm, a.relpos, str(warm_dir))
        torch_tokens_per_second(warm, data)
        for position in positions:
            torch_float32 = None  # PyTorch's float32 speed on this scheme, this run: what bf16 rows also face
            for dtype in dtypes:
                a.position, a.dtype = position, dtype
                ours_runs, theirs_runs = [], []
                for run in range(a.repeats):
                    ours_runs.append(relpos_tokens_per_second(a, a.relpos, workdir, run))
                    theirs_runs.append(torch_tokens_per_second(a, data))
                ours, theirs = statistics.median(ours_runs), statistics.median(theirs_runs)
                pair_ratios = [o / t for o, t in zip(ours_runs, theirs_runs)]
                if dtype == "float32":
                    torch_float32 = theirs
                row = {"position": position, "dtype": dtype, "relpos_tokens_per_s": ours,
                       "torch_tokens_per_s": theirs, "ratio": ours / theirs,
                       "relpos_runs": ours_runs, "torch_runs": theirs_runs}
                if torch_float32:
                    row["ratio_vs_torch_float32"] = ours / torch_float32
                rows.append(row)
                versus = f"{ours / torch_float32:>13.2f}x" if torch_float32 else f"{'-':>14}"
                ranged = f"{min(pair_ratios):>9.2f}-{max(pair_ratios):.2f}x" if spread else ""
                print(f"{position:<12}{dtype:>8}{ours:>14.0f}{theirs:>14.0f}{ours / theirs:>13.2f}x{versus}{ranged}",
                      flush=True)
    settings = {k: v for k, v in vars(a).items() if k not in ("position", "dtype", "json", "relpos")}
    path = pathlib.Path(a.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"settings": settings, "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    tmp.replace(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
