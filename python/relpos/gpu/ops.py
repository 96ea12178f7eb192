"""The GPU kernels as registered PyTorch operators: ``torch.ops.relpos.gpu_attention_forward``
and ``torch.ops.relpos.gpu_attention_backward``, the first differentiable through the second.

They are ``torch.library.triton_op``s, so ``torch.compile(fullgraph=True)`` and
``torch.export`` trace into them and see the Triton kernels themselves (their launches
go through ``wrap_triton``, launch.py). Under Triton's interpreter (TRITON_INTERPRET=1,
how the tests run the kernels on CPU tensors) they are ``torch.library.custom_op``s of the
same body instead: torch's ``wrap_triton`` hands interpreted kernels back unwrapped, so a
trace sees the op as one opaque call, whose fake implementation is the body with the
launches left out (launch.Call.runs_kernels).

An op takes tensors, numbers and lists of them only: the kernels' terms (terms.py) travel
as tensors (``None`` where absent), segments as one ``(B, Lq + Lk)`` tensor of ids, dropout's
``[seed, offset]`` as a tensor too (saved for the backward, which draws the forward's mask again
from it), and the rest as ten integers, the scale and dropout's probability.

Eager calls that no trace sees run the ops' bodies themselves, through one
``torch.autograd.Function``: the registered ops' Python dispatch (argument defaults filled
from the schema, outputs checked for aliasing) took 0.4-0.7 ms of host time per forward
under cProfile on an H200's host (bench/gpu_host.py), more than the forward kernel at
B = 4, H = 16, L = 2048, d = 64, so that such calls ran at the host's pace, not the GPU's.
"""
from typing import Optional

import torch
from torch import Tensor
from torch._library.triton import set_wrap_triton_enabled

from relpos._autograd import no_double_backward, setup_nothing, traced

from . import kernels, launch
from .grid import GRID_AXES, GRID_TABLE
from .terms import Terms

__all__ = ["forward", "backward", "call_options", "input_gradients"]

# The op's integer arguments, in order.
_OPTIONS = ("bias", "causal", "delta", "shaw_k", "zero_beyond", "xl_clamp", "q_offset", "grid_kind", "grid_a",
            "grid_b")


def call_options(terms: Terms, causal: bool, delta: int, q_offset: int) -> list[int]:
    """The ints argument of the ops for a call's terms, its mask and its positions."""
    return [terms.bias, int(causal), delta, terms.shaw_k, int(terms.zero_beyond), terms.xl_clamp, q_offset,
            terms.grid_kind, terms.grid_a, terms.grid_b]


def _call(q, k, v, pad, table, bucket, p1, p2, qx, kx, wk, wv, wq, row_of, rot_q, rot_k, partner, qb, grid, segments,
          dropout_rng, ints, scale, dropout_p) -> launch.Call:
    o = dict(zip(_OPTIONS, ints))
    terms = Terms(q, k, o["bias"], p1, p2, table, bucket, qx, kx, wk, wv, wq, row_of, o["shaw_k"],
                  bool(o["zero_beyond"]), o["xl_clamp"], rot_q, rot_k, partner, qb, grid, o["grid_kind"], o["grid_a"],
                  o["grid_b"])
    return launch.Call(terms, v, pad, bool(o["causal"]), o["delta"], scale, o["q_offset"], dropout_p, dropout_rng,
                       segments)


def _register(name: str, body):
    if launch.interpreting():
        op = torch.library.custom_op(name, body, mutates_args=())
        op.register_fake(body)
        return op
    return torch.library.triton_op(name, body, mutates_args=())


def _forward(q: Tensor, k: Tensor, v: Tensor, pad: Optional[Tensor], table: Optional[Tensor],
             bucket: Optional[Tensor], p1: Optional[Tensor], p2: Optional[Tensor], qx: Optional[Tensor],
             kx: Optional[Tensor], wk: Optional[Tensor], wv: Optional[Tensor], wq: Optional[Tensor],
             row_of: Optional[Tensor], rot_q: Optional[Tensor], rot_k: Optional[Tensor], partner: Optional[Tensor],
             qb: Optional[Tensor], grid: Optional[Tensor], segments: Optional[Tensor], dropout_rng: Optional[Tensor],
             ints: list[int], scale: float, dropout_p: float) -> tuple[Tensor, Tensor]:
    """out ``(B, H, Lq, dv)`` and the rows' logsumexp ``(B, H, Lq)`` in float32 (the softmax's,
    before dropout)."""
    return launch.forward(_call(q, k, v, pad, table, bucket, p1, p2, qx, kx, wk, wv, wq, row_of, rot_q, rot_k,
                                partner, qb, grid, segments, dropout_rng, ints, scale, dropout_p))


def _backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, pad: Optional[Tensor],
              table: Optional[Tensor], bucket: Optional[Tensor], p1: Optional[Tensor], p2: Optional[Tensor],
              qx: Optional[Tensor], kx: Optional[Tensor], wk: Optional[Tensor], wv: Optional[Tensor],
              wq: Optional[Tensor], row_of: Optional[Tensor], rot_q: Optional[Tensor], rot_k: Optional[Tensor],
              partner: Optional[Tensor], qb: Optional[Tensor], grid: Optional[Tensor], segments: Optional[Tensor],
              dropout_rng: Optional[Tensor], ints: list[int], scale: float,
              dropout_p: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv, dqx, the per-head sums of the bias parameters' and the tables' (wk, wv,
    wq) gradients and SAM's grid scores' (launch.backward); an absent one is an empty tensor (an op
    returns tensors)."""
    call = _call(q, k, v, pad, table, bucket, p1, p2, qx, kx, wk, wv, wq, row_of, rot_q, rot_k, partner, qb, grid,
                 segments, dropout_rng, ints, scale, dropout_p)
    grads = launch.backward(call, out, lse, dout)
    return tuple(g if g is not None else q.new_empty(0, dtype=torch.float32) for g in grads)


_forward_op = _register("relpos::gpu_attention_forward", _forward)
_backward_op = _register("relpos::gpu_attention_backward", _backward)


def forward(*inputs) -> tuple[Tensor, Tensor]:
    """relpos::gpu_attention_forward on its arguments (attention.py's _op_inputs), differentiable
    through relpos::gpu_attention_backward: the registered op where a trace sees the call, else
    its body directly (through _Attention when a gradient is wanted)."""
    if traced(inputs):
        return _forward_op(*inputs)
    if torch.is_grad_enabled() and any(isinstance(x, Tensor) and x.requires_grad for x in inputs):
        return _Attention.apply(*inputs)
    return _eager(_forward, inputs)


def backward(*inputs) -> tuple:
    """relpos::gpu_attention_backward on its arguments: the registered op where a trace sees
    the call or a graph of the gradients is being built (its autograd refuses a second
    backward by name), else its body directly."""
    if torch.is_grad_enabled() or traced(inputs):
        return _backward_op(*inputs)
    return _eager(_backward, inputs)


def _eager(body, inputs):
    """An op's body run eagerly, its launches straight to the Triton kernels (as the registered
    op runs it): with wrap_triton left on, each launch would go through torch's tracing
    wrapper, whose side table keeps every launch's arguments."""
    with set_wrap_triton_enabled(False):
        return body(*inputs)


def _setup_context(ctx, inputs, output):
    *tensors, ints, scale, dropout_p = inputs  # dropout's [seed, offset] among the tensors saved
    ctx.save_for_backward(*tensors, *output)
    ctx.ints, ctx.scale, ctx.dropout_p = ints, scale, dropout_p
    ctx.mark_non_differentiable(output[1])


def _table_grad(per_head: Tensor, table: Optional[Tensor]) -> Optional[Tensor]:
    """A table's gradient (Shaw's, DeBERTa's) from its per-head sums (width padded): summed over
    the heads for a table they share."""
    if table is None:
        return None
    g = per_head[:, : table.shape[-2], : table.shape[-1]]
    return (g if table.dim() == 3 else g.sum(0)).to(table.dtype)


def input_gradients(inputs, grads) -> list:
    """The gradient of each argument of relpos::gpu_attention_forward (``inputs``, None where
    it has none) from relpos::gpu_attention_backward's results ``grads``."""
    (q, k, v, pad, table, bucket, p1, p2, qx, kx, wk, wv, wq, row_of, rot_q, rot_k, partner, qb, grid, segments,
     dropout_rng, ints, scale, dropout_p) = inputs
    dq, dk, dv, dqx, bias_sums, wk_sums, wv_sums, wq_sums, grid_sums = grads
    bias, grid_kind = ints[0], ints[_OPTIONS.index("grid_kind")]
    dgrid = {GRID_AXES: grid_sums, GRID_TABLE: bias_sums[:, : grid.shape[-1]] if grid_kind == GRID_TABLE else None}
    dtable = dp1 = dp2 = None
    if bias == kernels.BIAS_ROW:
        dtable = bias_sums[:, : table.shape[-1]].to(table.dtype)
    elif bias != kernels.BIAS_NONE:
        dp1 = bias_sums[:, 0].to(p1.dtype)
        dp2 = bias_sums[:, 1].to(p2.dtype) if p2 is not None else None
    return [dq, dk, dv, None, dtable, None, dp1, dp2, dqx if qx is not None else None, None,
            _table_grad(wk_sums, wk), _table_grad(wv_sums, wv), _table_grad(wq_sums, wq), None, None, None, None,
            dq.float().sum((0, 2)).to(qb.dtype) if qb is not None else None, dgrid.get(grid_kind), None, None, None,
            None, None]


def _gradients(ctx, dout, _dlse):
    *tensors, out, lse = ctx.saved_tensors
    inputs = (*tensors, ctx.ints, ctx.scale, ctx.dropout_p)
    return tuple(input_gradients(inputs, backward(*inputs[:3], out, lse, dout, *inputs[3:])))


class _Attention(torch.autograd.Function):
    """The forward op's body and its registered autograd, for eager calls (forward above)."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _eager(_forward, inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, dout, dlse):
        return _gradients(ctx, dout, dlse)


_forward_op.register_autograd(_gradients, setup_context=_setup_context)
_backward_op.register_autograd(no_double_backward, setup_context=setup_nothing)
