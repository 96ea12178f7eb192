"""Context parallelism: attention over a sequence sharded along its length across
the processes of a ``torch.distributed`` group, with any relpos scheme. Two
strategies: ring attention (below) and all-to-all (``ulysses_attention``: the
heads sharded instead of the sequence for the attention itself).

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

Attention dropout: every rank draws a ``[seed, offset]`` from its own generator (so that
generators advance alike on every rank) and takes the group's rank 0's, broadcast; each
step's call draws its part of the whole sequence's mask (the mask is keyed by absolute
positions), so a ring run equals one process with rank 0's generator. The all-to-all
strategy keys its calls' masks by their heads, which are not the whole call's (its own
mask, the same distribution: ``ulysses_attention``).

Written against the backend-neutral API (``isend``/``irecv``/``all_reduce``): gloo
for CPU tensors, whose steps run relpos's C++ kernels, NCCL for CUDA tensors, whose
steps run relpos.gpu's Triton kernels (``_steps_for``); every buffer and exchange is
made on the inputs' device.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn

import relpos
from relpos import gpu
from relpos._autograd import dropout_of
from relpos.schemes import flag, integer, record_of
from relpos.torch.functional import attention
from relpos.torch.ops import decode, dropout_options, encode

__all__ = ["ring_attention", "ulysses_attention", "shard_sequence", "gather_sequence"]


def _merge_into(out, lse, out_s, lse_s) -> None:
    """Adds the partial attention (out_s, lse_s) over other keys into (out, lse),
    views updated in place, by their row logsumexp (-inf: no visible key, output
    zero). Two passes over the output rows: it runs once per step and pair."""
    new = torch.logaddexp(lse, lse_s)
    finite = torch.isfinite(new)
    a = torch.where(finite, torch.exp(lse - new), torch.zeros_like(new))
    b = torch.where(finite, torch.exp(lse_s - new), torch.zeros_like(new))
    out.mul_(a[..., None]).addcmul_(out_s, b[..., None])
    lse.copy_(new)


Segments = list  # [(absolute position of the first row, rows), ...] in row order


def _segments(given, offset: int, length: int, name: str) -> Segments:
    """The rank's rows as segments: ``given`` or one segment at ``offset``."""
    if given is None:
        return [(integer(offset, name), length)]
    segments = [(integer(o, name), integer(n, name)) for o, n in given]
    if sum(n for _, n in segments) != length or any(n < 1 or o < 0 for o, n in segments):
        raise ValueError(f"relpos: {name}: segments {given} must have positive lengths summing to {length} "
                         "and non-negative positions")
    return segments


def _rows(segments: Segments):
    """(first row, segment) for each segment."""
    first = 0
    for offset, length in segments:
        yield first, (offset, length)
        first += length


def _every_rank(segments: Segments, group, device) -> list:
    """Every rank's segments, in rank order: their counts, then the (position, rows)
    pairs padded to the longest list (two small tensor gathers on the inputs' ``device``,
    as NCCL needs, not pickled objects)."""
    size = dist.get_world_size(group)
    count = torch.tensor([len(segments)], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(count) for _ in range(size)]
    dist.all_gather(counts, count, group=group)
    mine = torch.zeros(int(max(c.item() for c in counts)), 2, dtype=torch.int64, device=device)
    mine[:len(segments)] = torch.tensor(segments, dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(size)]
    dist.all_gather(every, mine, group=group)
    return [[(int(o), int(n)) for o, n in e[:int(c.item())].tolist()] for e, c in zip(every, counts)]


class _Ring:
    """The group, this rank's neighbours, every rank's key segments and the pieces
    a key chunk travels in.

    A chunk travels in ``pieces`` near-equal runs of rows, one ring per piece:
    a rank holds one visiting piece and the next (not a whole visiting chunk and
    the next), so the ring adds 4 / pieces rows of keys, values and their gradients
    per local row, not 8, at the cost of ``pieces`` times more (smaller) calls."""

    # Seconds this process has spent waiting for transfers to finish (exposed
    # communication), over every ring; bench/context_parallel.py reads it.
    waited = 0.0

    def __init__(self, group, k_segments: Segments, device, every: Optional[list] = None,
                 pieces: Optional[int] = None):
        self.group = group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        neighbour = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
        self.next, self.prev = neighbour((self.rank + 1) % self.size), neighbour((self.rank - 1) % self.size)
        # every rank's key segments: gathered once per forward, reused by its backward
        self.segments = every if every is not None else _every_rank(k_segments, group, device)
        shortest = min(sum(n for _, n in s) for s in self.segments)
        # Automatic, the same on every rank: chunks shorter than _WHOLE_BELOW keys travel
        # whole (the calls of smaller pieces cost time: measured 1.8x the step time of one
        # process at L = 4096 on 2 processes with 4 pieces, 1.3-1.5x with whole chunks);
        # longer ones, where memory matters, in pieces of at least _PIECE_ROWS keys.
        automatic = 1 if shortest < _WHOLE_BELOW else min(_MAX_PIECES, shortest // _PIECE_ROWS)
        self.pieces = pieces if pieces is not None else automatic
        if not 1 <= self.pieces <= shortest:
            raise ValueError(f"relpos: kv_pieces: must be in [1, {shortest}] (the shortest key chunk), "
                             f"got {self.pieces}")

    def owner(self, step: int) -> int:
        """Whose key chunk this rank holds at a step: its own at step 0, then its predecessors'."""
        return (self.rank - step) % self.size

    def piece(self, owner: int, i: int) -> tuple[slice, Segments]:
        """Rows of piece i of owner's chunk, and their segments (absolute positions)."""
        length = sum(n for _, n in self.segments[owner])
        lo, hi = round(i * length / self.pieces), round((i + 1) * length / self.pieces)
        segments = []
        for first, (offset, n) in _rows(self.segments[owner]):
            a, b = max(lo, first), min(hi, first + n)
            if a < b:
                segments.append((offset + a - first, b - a))
        return slice(lo, hi), segments

    def shift(self, tensors, rows: int):
        """Starts sending `tensors` to the next rank and receiving `rows` rows of
        each from the previous one; returns the receive buffers and a function
        that waits for both."""
        buffers = [t.new_empty((*t.shape[:2], rows, *t.shape[3:])) if t.dim() == 4 else t.new_empty((t.shape[0], rows))
                   for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self.prev, self.group) for b in buffers]
        requests = dist.batch_isend_irecv(ops)

        def wait():
            start = time.perf_counter()
            for r in requests:
                r.wait()
            _Ring.waited += time.perf_counter() - start
        return buffers, wait

    def pairs(self, q_segments: Segments, k_segments: Segments, causal: bool):
        """(query rows, key rows, q_offset, k_offset) of every query segment of this
        rank and key segment of a visiting piece that a causal mask leaves visible."""
        for qs, (qo, ql) in _rows(q_segments):
            for ks, (ko, kl) in _rows(k_segments):
                if not causal or ko <= qo + ql - 1:
                    yield slice(qs, qs + ql), slice(ks, ks + kl), qo, ko

    def visit(self, i: int, held: list, backward: bool):
        """One ring for piece i: yields (segments, tensors) of the piece this rank
        holds at each step, starting from `held` (this rank's rows of piece i).
        Forward: the next piece is already on its way while the caller computes.
        Backward: a piece moves on once the caller has added its gradients into the
        accumulators travelling with it, and after the last step it moves once
        more, home; it is then `self.home`. In a group of one the piece never leaves
        (gloo cannot send to the rank itself): it is home throughout."""
        for step in range(self.size):
            owner, last = self.owner(step), step == self.size - 1
            rows = self.piece(self.owner(step + 1), i)[0]
            moves = self.size > 1 and (backward or not last)
            if moves and not backward:
                incoming, wait = self.shift(held, rows.stop - rows.start)
            yield self.piece(owner, i)[1], held
            if moves and backward:
                incoming, wait = self.shift(held, rows.stop - rows.start)
            if moves:
                wait()
                held = incoming
        self.home = held


_WHOLE_BELOW = 4096  # automatic: shorter key chunks travel whole
_PIECE_ROWS = 512  # automatic pieces hold at least this many keys
_MAX_PIECES = 16


def _padding_of(pad, like: torch.Tensor):
    """Key padding as uint8 ``(B, Lk)`` on the keys' device (zeros: none), the ring's travelling form."""
    if pad is None:
        return torch.zeros(like.shape[0], like.shape[2], dtype=torch.uint8, device=like.device)
    return pad.to(device=like.device, dtype=torch.uint8).contiguous()


def _shared_rng(dropout_p, dropout_rng, group, device):
    """``(p, rng)`` of a call with dropout for every rank of ``group`` alike: each rank's own (given,
    or drawn from its generator as one process would draw it), replaced by the group's rank 0's."""
    dropout_p, dropout_rng = dropout_of(dropout_p, dropout_rng, device)
    if dropout_rng is not None and dist.get_world_size(group) > 1:
        dropout_rng = dropout_rng.clone()
        dist.broadcast(dropout_rng, dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return dropout_p, dropout_rng


class _CpuSteps:
    """A ring step on relpos's C++ kernels: the forward of one (query rows, visiting keys)
    pair, and its backward added into the accumulators ``into`` (named as relpos.backward
    names gradients). ``dropout`` is the call's ``(p, rng)``."""

    @staticmethod
    def forward(q, k, v, record, options, dropout, **call):
        return relpos.forward(q, k, v, record, **call, **options, **dropout_options(*dropout))

    @staticmethod
    def backward(q, k, v, out, lse, dout, record, options, dropout, into, **call):
        relpos.backward(q, k, v, out, lse, dout, record, add_into=into, **call, **options,
                        **dropout_options(*dropout))


class _GpuSteps:
    """A ring step on relpos.gpu's Triton kernels (``threads`` and ``algorithm`` are CPU
    settings: the fused kernels run); the backward's gradients from relpos.gpu.gradients."""

    @staticmethod
    def forward(q, k, v, record, options, dropout, **call):
        return gpu.attention(q, k, v, record, scale=options["scale"], return_lse=True, dropout_p=dropout[0],
                             dropout_rng=dropout[1], **call)

    @staticmethod
    def backward(q, k, v, out, lse, dout, record, options, dropout, into, **call):
        grads = gpu.gradients(q, k, v, out, lse, dout, record, scale=options["scale"], dropout_p=dropout[0],
                              dropout_rng=dropout[1], **call)
        for name, accumulator in into.items():
            accumulator += grads[name]


def _steps_for(q: torch.Tensor):
    """The kernels of a ring's steps: relpos.gpu's for CUDA tensors, the C++ ones for CPU tensors."""
    return _GpuSteps if q.device.type == "cuda" else _CpuSteps


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_padding, dropout_rng, dropout_p, group, q_segments, k_segments, pieces,
                reduce_params, scheme_name, ints, floats, *params):
        record, options = decode(scheme_name, params, ints, floats)
        causal = options.pop("causal")
        del options["q_offset"], options["k_offset"]  # the segments hold the positions
        ring = _Ring(group, k_segments, q.device, pieces=pieces)
        steps = _steps_for(q)
        padding = _padding_of(key_padding, k)
        out = q.new_zeros((*q.shape[:3], v.shape[3]))
        lse = q.new_full(q.shape[:3], float("-inf"))
        for i in range(ring.pieces):
            rows = ring.piece(ring.rank, i)[0]
            own = [k.detach()[:, :, rows], v.detach()[:, :, rows], padding[:, rows]]
            for segments, (kp, vp, pad) in ring.visit(i, own, backward=False):
                for qrows, krows, q_offset, k_offset in ring.pairs(q_segments, segments, causal):
                    out_s, lse_s = steps.forward(q.detach()[:, :, qrows], kp[:, :, krows], vp[:, :, krows], record,
                                                 options, (dropout_p, dropout_rng), causal=causal,
                                                 key_padding=pad[:, krows], q_offset=q_offset, k_offset=k_offset)
                    _merge_into(out[:, :, qrows], lse[:, :, qrows], out_s, lse_s)
        optional = [x for x in (key_padding, dropout_rng) if x is not None]
        ctx.save_for_backward(q, k, v, out, lse, *optional, *params)
        ctx.meta = (group, q_segments, ring.segments, ring.pieces, reduce_params, scheme_name, ints, floats,
                    key_padding is not None, dropout_rng is not None, dropout_p)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        group, q_segments, every, pieces, reduce_params, scheme_name, ints, floats, has_padding, has_rng, p = ctx.meta
        q, k, v, out, lse, *rest = ctx.saved_tensors
        key_padding = rest.pop(0) if has_padding else None
        dropout = (p, rest.pop(0) if has_rng else None)
        params = rest
        record, options = decode(scheme_name, params, ints, floats)
        causal = options.pop("causal")
        del options["q_offset"], options["k_offset"]
        ring = _Ring(group, None, q.device, every, pieces)
        steps = _steps_for(q)
        dout = dout.contiguous()
        dq = torch.zeros_like(q)
        # Whole chunks come home as dk, dv themselves; pieces are copied into them.
        dk, dv = (None, None) if ring.pieces == 1 else (torch.zeros_like(k), torch.zeros_like(v))
        dparams = [torch.zeros_like(p) for p in params]
        padding = _padding_of(key_padding, k)
        names = list(record._params())
        for i in range(ring.pieces):
            rows = ring.piece(ring.rank, i)[0]
            # The travelling piece: keys, values, padding and their gradient accumulators.
            own = [k.detach()[:, :, rows], v.detach()[:, :, rows], padding[:, rows],
                   torch.zeros_like(k[:, :, rows]), torch.zeros_like(v[:, :, rows])]
            for segments, (kp, vp, pad, dkp, dvp) in ring.visit(i, own, backward=True):
                for qrows, krows, q_offset, k_offset in ring.pairs(q_segments, segments, causal):
                    # added in place into dq and the travelling dk, dv: no per-call gradient buffers
                    steps.backward(q.detach()[:, :, qrows], kp[:, :, krows], vp[:, :, krows], out[:, :, qrows],
                                   lse[:, :, qrows], dout[:, :, qrows], record, options, dropout,
                                   {"q": dq[:, :, qrows], "k": dkp[:, :, krows], "v": dvp[:, :, krows],
                                    **dict(zip(names, dparams))},
                                   causal=causal, key_padding=pad[:, krows], q_offset=q_offset, k_offset=k_offset)
            if ring.pieces == 1:
                dk, dv = ring.home[3], ring.home[4]
            else:
                dk[:, :, rows], dv[:, :, rows] = ring.home[3], ring.home[4]
        if reduce_params:
            for g in dparams:
                dist.all_reduce(g, group=group)
        return (dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None, *dparams)


def ring_attention(q, k, v, scheme=None, *, group: Optional["dist.ProcessGroup"] = None, causal: bool = False,
                   key_padding=None, q_offset: int = 0, k_offset: int = 0, q_segments=None, k_segments=None,
                   scale: Optional[float] = None, threads: Optional[int] = None, return_lse: bool = False,
                   reduce_param_grads: bool = True, kv_pieces: Optional[int] = None, dropout_p: float = 0.0,
                   dropout_rng: Optional[torch.Tensor] = None):
    """Attention with ``scheme`` over a sequence sharded across ``group`` (default:
    the whole world), differentiable. Each rank passes its own rows: q
    ``(B, H, Lq_r, d)`` at absolute positions ``q_offset + i``, k, v
    ``(B, Hkv, Lk_r, d)`` at ``k_offset + j``, ``key_padding`` ``(B, Lk_r)`` or
    None; ranks may hold different lengths. Rows that are not one run of positions
    (``shard_sequence``'s zigzag) are given as segments, ``[(position, rows), ...]``
    in row order, instead of the offsets. Returns this rank's out
    ``(B, H, Lq_r, dv)`` (and its row logsumexp with ``return_lse=True``), equal to
    its rows of one call on the whole sequence. Gradients: q's stay local, k's and
    v's return to their owners, the scheme's tensors get the sum over all ranks
    (the same on every rank), or with ``reduce_param_grads=False`` this rank's
    share, for a model that sums every replicated parameter's gradient over the
    group itself. Every rank must call it with the same scheme options. bfloat16
    and float16 tensors are computed in float32 (the ring's merges and gradient sums
    included) and the results rounded once; lse is float32.
    ``kv_pieces``: how many pieces a key/value chunk travels in (default: whole
    chunks below 4096 keys, longer ones in pieces of at least 512 keys, at most
    16): a rank holds one visiting piece and the next, so more pieces need less
    memory (the ring's own buffers shrink from 8 to 8 / pieces rows of H x d per
    local row) and make more, smaller calls.
    ``dropout_p``: attention dropout as ``relpos.torch.attention``'s, with the group's rank 0's
    ``dropout_rng`` (drawn from its generator unless given) on every rank, so that the result
    equals one process's call with that rng."""
    scheme = record_of(scheme)
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("relpos: ring_attention: torch.distributed is not initialised (init_process_group first)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"relpos: {name}: expected a 4-dimensional torch tensor")
    qs = _segments(q_segments, q_offset, q.shape[2], "q_segments" if q_segments is not None else "q_offset")
    ks = _segments(k_segments, k_offset, k.shape[2], "k_segments" if k_segments is not None else "k_offset")
    name, params, ints, floats = encode(scheme, causal, 0, 0, scale, "fused", threads)
    if kv_pieces is not None:
        kv_pieces = integer(kv_pieces, "kv_pieces")
    stored = q.dtype
    if stored in (torch.bfloat16, torch.float16):
        # The ring merges partial outputs by their logsumexp and sums gradients
        # over steps: in float32, as the kernels accumulate, rounded once at the end.
        for what, x in (("k", k), ("v", v), *((f"scheme tensor {i}", p) for i, p in enumerate(params))):
            if x.dtype != stored:
                raise ValueError(f"relpos: {what}: dtype must match q ({stored}), got {x.dtype}")
        q, k, v = q.float(), k.float(), v.float()
        params = [p.float() for p in params]
    reduce = flag(reduce_param_grads, "reduce_param_grads")
    dropout_p, dropout_rng = _shared_rng(dropout_p, dropout_rng, group, q.device)
    out, lse = _RingAttention.apply(q, k, v, key_padding, dropout_rng, dropout_p, group, qs, ks, kv_pieces, reduce,
                                    name, ints, floats, *params)
    out = out.to(stored)
    return (out, lse) if return_lse else out


def shard_sequence(x: torch.Tensor, rank: int, world: int, *, dim: int = 1, zigzag: bool = True,
                   position: int = 0):
    """This rank's rows of ``x`` along ``dim`` and their segments for
    ``ring_attention``. ``zigzag`` (for causal attention) cuts the sequence into
    ``2 * world`` near-equal pieces and gives rank r pieces r and 2 world - 1 - r, so
    that every rank holds as many early (cheap) as late (costly) queries;
    otherwise rank r holds the r-th of ``world`` contiguous pieces. ``position`` is
    the absolute position of the sequence's first row."""
    pieces = 2 * world if zigzag else world
    bounds = [round(i * x.shape[dim] / pieces) for i in range(pieces + 1)]
    mine = [rank, pieces - 1 - rank] if zigzag else [rank]
    if any(bounds[i + 1] <= bounds[i] for i in mine):
        raise ValueError(f"relpos: shard_sequence: {x.shape[dim]} rows are too few for {pieces} pieces")
    rows = torch.cat([x.narrow(dim, bounds[i], bounds[i + 1] - bounds[i]) for i in mine], dim)
    return rows, [(position + bounds[i], bounds[i + 1] - bounds[i]) for i in mine]


def gather_sequence(x: torch.Tensor, segments, group=None, *, dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's rows ``x`` and their ``segments``
    (as ``shard_sequence`` gave them), in position order, on every rank."""
    every_segments: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every_segments, list(segments), group=group)
    lengths = [sum(n for _, n in s) for s in every_segments]
    # gloo gathers equal sizes: every rank's rows padded to the longest
    shape = list(x.shape)
    shape[dim] = max(lengths) - x.shape[dim]
    padded = torch.cat([x, x.new_zeros(shape)], dim).contiguous()
    parts = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(parts, padded, group=group)
    pieces = []
    for part, segs in zip(parts, every_segments):
        first = 0
        for position, n in segs:
            pieces.append((position, part.narrow(dim, first, n)))
            first += n
    return torch.cat([p for _, p in sorted(pieces, key=lambda t: t[0])], dim)


class _SumGradOverGroup(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the group (a parameter
    every rank uses for different heads or rows)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _scheme_for_heads(scheme, h0: int, h1: int, group):
    """The scheme restricted to query heads [h0, h1): per-head tensors sliced (their
    gradients summed over the group), shared ones whole."""

    def part(t, per_head: bool):
        if t is None:
            return None
        t = _SumGradOverGroup.apply(t, group) if t.requires_grad else t
        return t[h0:h1] if per_head else t

    return scheme._for_heads(part)


def ulysses_attention(q, k, v, scheme=None, *, group: Optional["dist.ProcessGroup"] = None, causal: bool = False,
                      key_padding=None, q_offset: int = 0, segments=None, scale: Optional[float] = None,
                      threads: Optional[int] = None, dropout_p: float = 0.0,
                      dropout_rng: Optional[torch.Tensor] = None):
    """Self-attention over a sequence sharded across ``group`` by all-to-all
    exchanges: each rank sends every other rank its rows of that rank's heads,
    attends over the whole sequence for H / P query heads (and Hkv / P key heads),
    and sends the output rows back. Arguments as ``ring_attention`` (one set of
    segments for queries and keys; together they must cover one run of positions).
    H and Hkv must divide by the group size. Differentiable; the scheme's tensors
    get the sum of their gradients over the group.
    ``dropout_p``: attention dropout with the group's rank 0's ``dropout_rng`` as in
    ``ring_attention``; but each rank's call holds H / P heads, and the kernels key the mask by
    the call's head index, so rank r draws with the offset moved by r (a mask of its own for
    each of the H heads, not the one a single process draws)."""
    scheme = record_of(scheme)
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("relpos: ulysses_attention: torch.distributed is not initialised (init_process_group first)")
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    H, Hkv = q.shape[1], k.shape[1]
    if H % size or Hkv % size:
        raise ValueError(f"relpos: ulysses_attention: the query heads ({H}) and key heads ({Hkv}) must divide by the "
                         f"group size {size}; use ring_attention")
    mine = _segments(segments, q_offset, q.shape[2], "segments" if segments is not None else "q_offset")
    every = _every_rank(mine, group, q.device)
    lengths = [sum(n for _, n in s) for s in every]
    positions = torch.tensor([o + i for s in every for o, n in s for i in range(n)], device=q.device)
    order = torch.argsort(positions)
    start = int(positions.min())
    if not torch.equal(positions[order], torch.arange(start, start + len(positions), device=q.device)):
        raise ValueError("relpos: ulysses_attention: the ranks' segments must cover one run of positions")

    # gloo exchanges equal sizes: rows are padded to the longest rank's and trimmed after
    longest = max(lengths)

    def exchange(parts, heads):
        padded = [torch.nn.functional.pad(p, (0, 0, 0, longest - p.shape[2])).contiguous() for p in parts]
        empty = parts[0].new_empty((parts[0].shape[0], heads, longest, parts[0].shape[3]))
        return dnn.all_to_all([torch.empty_like(empty) for _ in range(size)], padded, group=group)

    def to_heads(x):  # (B, h, L_r, d) on each rank -> (B, h / P, L, d) in position order
        received = exchange(list(x.chunk(size, dim=1)), x.shape[1] // size)
        return torch.cat([r[:, :, :n] for r, n in zip(received, lengths)], 2).index_select(2, order)

    def to_rows(x):  # (B, H / P, L, d) in position order -> (B, H, L_r, d)
        received = exchange(list(x.index_select(2, torch.argsort(order)).split(lengths, dim=2)), x.shape[1])
        return torch.cat([r[:, :, :lengths[rank]] for r in received], 1)

    padding = None
    if key_padding is not None:
        padded = torch.zeros(key_padding.shape[0], longest, dtype=torch.uint8, device=q.device)
        padded[:, :key_padding.shape[1]] = key_padding.to(torch.uint8)
        gathered = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(gathered, padded, group=group)
        padding = torch.cat([g[:, :n] for g, n in zip(gathered, lengths)], 1).index_select(1, order).bool()
    h0, h1 = rank * H // size, (rank + 1) * H // size
    compute = q.dtype
    if scheme.name == "alibi" and scheme.slopes is None:
        # The paper's slopes of all H heads, sliced to this rank's: explicit slopes have q's
        # dtype, and rounded to a half type they would not be those the core computes (in
        # float32) for one call on all heads, so such a call computes in float32, rounded once.
        compute = torch.float32 if compute in (torch.bfloat16, torch.float16) else compute
        scheme = replace(scheme, slopes=torch.tensor(relpos.alibi_slopes(H), dtype=compute, device=q.device))
    dropout_p, dropout_rng = _shared_rng(dropout_p, dropout_rng, group, q.device)
    if dropout_rng is not None:
        # The calls of the ranks number their heads from 0 alike: distinct offsets keep their masks apart.
        dropout_rng = dropout_rng + torch.tensor([0, rank], dtype=torch.int64, device=q.device)
    out = attention(*(to_heads(x).to(compute) for x in (q, k, v)), _scheme_for_heads(scheme, h0, h1, group),
                    causal=causal, key_padding=padding, q_offset=start, k_offset=start, scale=scale, threads=threads,
                    dropout_p=dropout_p, dropout_rng=dropout_rng)
    return to_rows(out.to(q.dtype))
