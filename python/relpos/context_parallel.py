"""Context parallelism: attention over a sequence sharded along its length across
the processes of a ``torch.distributed`` group, with any relpos scheme.

Ring attention: every rank keeps its query chunk and passes its key/value chunk
(with its key padding and absolute key offset) around the ring, one step per rank;
each step is one relpos call on (local queries, visiting keys) at their absolute
positions, so every relative scheme sees the distances it would see on the whole
sequence. The partial outputs are merged by their row logsumexp. The next chunk's
send and receive run while the current chunk is computed. Backward passes the
chunks around again, now with their dk and dv accumulators, which end at their
owners; it calls relpos's backward with the merged out and lse, which makes each
step's gradients exact. The scheme's parameter gradients are summed locally in
step order and then all-reduced. Nothing depends on timing: a run repeats its bits.

Written against the backend-neutral API (``isend``/``irecv``/``all_reduce``):
gloo on CPU tensors, which is what relpos computes on.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

import relpos
from relpos import torch_op

__all__ = ["ring_attention"]


def _merge(out, lse, out_s, lse_s):
    """Two partial attentions over disjoint keys merged by their row logsumexp
    (-inf: no visible key; its output is zero)."""
    if out is None:
        return out_s, lse_s
    m = torch.maximum(lse, lse_s)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    a, b = torch.exp(lse - m), torch.exp(lse_s - m)
    total = a + b
    lse_new = torch.where(total > 0, m + torch.log(total), torch.full_like(m, float("-inf")))
    safe = torch.where(total > 0, total, torch.ones_like(total))
    out_new = (out * (a / safe)[..., None] + out_s * (b / safe)[..., None])
    return out_new, lse_new


class _Ring:
    """The group, this rank's neighbours and every rank's key chunk length and offset."""

    def __init__(self, group, k, k_offset: int):
        self.group = group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size) if group else (self.rank + 1) % self.size
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size) if group else (self.rank - 1) % self.size
        mine = torch.tensor([k.shape[2], k_offset], dtype=torch.int64)
        every = [torch.zeros_like(mine) for _ in range(self.size)]
        dist.all_gather(every, mine, group=group)
        self.lengths = [int(x[0]) for x in every]
        self.offsets = [int(x[1]) for x in every]

    def owner(self, step: int) -> int:
        """Whose key chunk this rank holds at a step: its own at step 0, then its predecessors'."""
        return (self.rank - step) % self.size

    def shift(self, tensors, step: int):
        """Starts sending `tensors` (the chunk of owner(step)) to the next rank and
        receiving the chunk of owner(step + 1) from the previous one; returns the
        receive buffers and a function that waits for both."""
        incoming = self.lengths[self.owner(step + 1)]
        buffers = [torch.empty((*t.shape[:2], incoming, *t.shape[3:]), dtype=t.dtype) if t.dim() == 4
                   else torch.empty((t.shape[0], incoming), dtype=t.dtype) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self.prev, self.group) for b in buffers]
        requests = dist.batch_isend_irecv(ops)

        def wait():
            for r in requests:
                r.wait()
        return buffers, wait


def _visible(causal: bool, q_offset: int, Lq: int, k_offset: int) -> bool:
    """False when a causal mask hides every key of the chunk from every query."""
    return not causal or k_offset <= q_offset + Lq - 1


def _padding_of(pad, batch: int, length: int):
    return torch.zeros(batch, length, dtype=torch.uint8) if pad is None else pad.to(torch.uint8).contiguous()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_padding, group, scheme_name, ints, floats, *params):
        record, options = torch_op._decode(scheme_name, params, ints, floats)
        causal, q_offset, k_offset = options.pop("causal"), options.pop("q_offset"), options.pop("k_offset")
        ring = _Ring(group, k, k_offset)
        chunk = [k.detach(), v.detach(), _padding_of(key_padding, k.shape[0], k.shape[2])]
        out = lse = None
        for step in range(ring.size):
            owner = ring.owner(step)
            if step < ring.size - 1:
                incoming, wait = ring.shift(chunk, step)
            if _visible(causal, q_offset, q.shape[2], ring.offsets[owner]):
                out_s, lse_s = relpos.forward(q.detach(), chunk[0], chunk[1], record, causal=causal,
                                              key_padding=chunk[2], q_offset=q_offset,
                                              k_offset=ring.offsets[owner], **options)
                out, lse = _merge(out, lse, out_s, lse_s)
            if step < ring.size - 1:
                wait()
                chunk = incoming
        if out is None:  # no key visible to any query of this rank
            out = q.new_zeros((*q.shape[:3], v.shape[3]))
            lse = q.new_full(q.shape[:3], float("-inf"))
        ctx.save_for_backward(q, k, v, out, lse, *(() if key_padding is None else (key_padding,)), *params)
        ctx.meta = (group, scheme_name, ints, floats, key_padding is not None, len(params))
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        group, scheme_name, ints, floats, has_padding, n_params = ctx.meta
        q, k, v, out, lse, *rest = ctx.saved_tensors
        key_padding = rest.pop(0) if has_padding else None
        params = rest
        record, options = torch_op._decode(scheme_name, params, ints, floats)
        causal, q_offset, k_offset = options.pop("causal"), options.pop("q_offset"), options.pop("k_offset")
        ring = _Ring(group, k, k_offset)
        dout = dout.contiguous()
        dq = torch.zeros_like(q)
        dparams = [torch.zeros_like(p) for p in params]
        # The travelling chunk: keys, values, padding and their gradient accumulators.
        chunk = [k.detach(), v.detach(), _padding_of(key_padding, k.shape[0], k.shape[2]),
                 torch.zeros_like(k), torch.zeros_like(v)]
        names = list(record._params())
        for step in range(ring.size):
            owner = ring.owner(step)
            if _visible(causal, q_offset, q.shape[2], ring.offsets[owner]):
                grads = relpos.backward(q.detach(), chunk[0], chunk[1], out, lse, dout, record, causal=causal,
                                        key_padding=chunk[2], q_offset=q_offset, k_offset=ring.offsets[owner],
                                        **options)
                dq += grads["q"]
                chunk[3] += grads["k"]
                chunk[4] += grads["v"]
                for i, n in enumerate(names):
                    dparams[i] += grads[n]
            # Every chunk moves on, the last step included: that send takes dk, dv home.
            incoming, wait = ring.shift(chunk, step)
            wait()
            chunk = incoming
        for g in dparams:
            dist.all_reduce(g, group=group)
        dk, dv = chunk[3], chunk[4]
        return (dq, dk, dv, None, None, None, None, None, *dparams)


def ring_attention(q, k, v, scheme=None, *, group: Optional["dist.ProcessGroup"] = None, causal: bool = False,
                   key_padding=None, q_offset: int = 0, k_offset: int = 0, scale: Optional[float] = None,
                   threads: Optional[int] = None, return_lse: bool = False):
    """Attention with ``scheme`` over a sequence sharded across ``group`` (default:
    the whole world), differentiable. Each rank passes its own chunks: q
    ``(B, H, Lq_r, d)`` at absolute positions ``q_offset + i``, k, v
    ``(B, Hkv, Lk_r, d)`` at ``k_offset + j``, ``key_padding`` ``(B, Lk_r)`` or
    None; chunks may differ in length. Returns this rank's out ``(B, H, Lq_r, dv)``
    (and its row logsumexp with ``return_lse=True``), equal to its rows of one
    call on the whole sequence. Gradients: q's stay local, k's and v's return to
    their owners, the scheme's tensors get the sum over all ranks (the same on
    every rank). Every rank must call it with the same scheme options."""
    scheme = relpos.NoPosition() if scheme is None else scheme
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("relpos: ring_attention: torch.distributed is not initialised (init_process_group first)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"relpos: {name}: expected a 4-dimensional torch tensor")
    name, params, ints, floats = torch_op._encode(scheme, causal, q_offset, k_offset, scale, "fused", threads)
    out, lse = _RingAttention.apply(q, k, v, key_padding, group, name, ints, floats, *params)
    return (out, lse) if return_lse else out
