"""relpos attention as registered PyTorch operators (``torch.ops.relpos.*``).

``relpos::attention_forward`` and ``relpos::attention_backward`` are
``torch.library`` custom ops with fake (meta) implementations, an autograd
formula and a vmap rule, so ``torch.compile(fullgraph=True)``,
``torch.export``, ``torch.jit.trace`` and ``torch.vmap`` see one opaque op
instead of a Python call they cannot trace.

An op's arguments can only be tensors, numbers, bools, strings and lists of
them, so a scheme travels as its name, its learnable tensors in a fixed order
per scheme (``None`` where absent) and its options packed into an int list and
a float list; ``encode`` and ``decode`` are the two ends of that packing
(``relpos.torch.functional`` and ``relpos.torch.context_parallel`` call them). Attention
dropout travels as two trailing arguments with defaults, ``dropout_rng`` (the int64
``[seed, offset]`` tensor of ``relpos._autograd.draw_dropout_rng``, or None) and
``dropout_p``: a call without dropout is the op's call as it always was, and the backward
draws the forward's mask again from the rng its autograd formula saved.

``forward`` is how relpos.torch calls the forward operator: where nothing traces the call
(``relpos._autograd.traced``) and CPU autocast is off, it runs the operators' bodies through
one ``torch.autograd.Function`` instead, the same computation without the registered ops'
Python dispatch (on a 2-core Zen 5, 7-17 us of a small decode step's 75 and about 150 us of a
small forward+backward's 400: docs/torch.md).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

import relpos
from relpos._autograd import check_dropout_rng, dropout_seed_offset, no_double_backward, setup_nothing, traced
from relpos._calls import ALGORITHMS, check_dtypes, check_threads
from relpos.schemes import SCHEMES, choice, flag, integer, number

__all__ = ["attention_forward", "attention_backward", "forward", "encode", "decode", "dropout_options"]


def encode(scheme, causal, q_offset, k_offset, scale, algorithm, threads):
    """(name, params, ints, floats) for a scheme record and call options.

    ints  = [causal, q_offset, k_offset, threads (-1 for None: torch.get_num_threads(),
             read when the op runs, so compiled graphs follow it too; 0: OpenMP's maximum), algorithm index,
             presence bit per parameter, *scheme options]
    floats = [scale (NaN: default), *scheme options]"""
    scheme._args()  # validates the scheme's options, with errors naming them
    for role, p in scheme._params().items():
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"relpos: {role}: expected a torch tensor, got {type(p).__name__}")
    name = scheme.name
    params = [getattr(scheme, field) for field in scheme._tensors]
    present = sum(1 << i for i, p in enumerate(params) if p is not None)
    threads = None if threads is None else check_threads(threads)
    ints = [int(flag(causal, "causal")), integer(q_offset, "q_offset"), integer(k_offset, "k_offset"),
            -1 if threads is None else threads, ALGORITHMS.index(choice(algorithm, "algorithm", ALGORITHMS)),
            present]
    floats = [math.nan if scale is None else number(scale, "scale")]
    extra_ints, extra_floats = scheme._op_options()
    return name, [p for p in params if p is not None], ints + extra_ints, floats + extra_floats


def decode(name: str, params: Sequence[torch.Tensor], ints: Sequence[int], floats: Sequence[float]):
    """The scheme record and the keyword options of relpos.forward / backward."""
    causal, q_offset, k_offset, threads, algorithm, present = ints[:6]
    cls = SCHEMES[name]
    it = iter(params)
    tensors = [next(it) if present >> i & 1 else None for i in range(len(cls._tensors))]
    scheme = cls._from_op(tensors, ints[6:], floats[1:])
    options = dict(causal=bool(causal), q_offset=q_offset, k_offset=k_offset,
                   scale=None if math.isnan(floats[0]) else floats[0],
                   algorithm=ALGORITHMS[algorithm],
                   threads=torch.get_num_threads() if threads < 0 else threads or None)
    return scheme, options


def dropout_options(dropout_p: float, dropout_rng: Optional[torch.Tensor]) -> dict:
    """relpos.forward / backward's dropout options for an op's ``dropout_p`` and rng, its seed
    and offset read on the host (the C++ kernels' calls, on CPU tensors); none without dropout."""
    if not dropout_p:
        return {}
    if dropout_rng is None:
        raise ValueError("relpos: dropout_rng: a call with dropout_p > 0 needs its [seed, offset] tensor")
    seed, offset = dropout_seed_offset(dropout_rng)
    return dict(dropout_p=dropout_p, dropout_seed=seed, dropout_offset=offset)


def _check_tensors(tensors: dict, record, dropout_rng: Optional[torch.Tensor] = None) -> None:
    """Every tensor argument's device and dtype, by name (the scheme ``record``'s as
    ``t5_table``, ...), in the ops and in their fake implementations alike: a meta tensor
    among CPU ones sends the whole call to the fake implementation, which would otherwise
    return uninitialised CPU memory. All must be on q's device: the CPU, or meta where
    torch.compile and torch.export trace with meta tensors."""
    named = {**tensors, **record._params()}
    device = named["q"].device
    if device.type not in ("cpu", "meta"):
        raise ValueError(f"relpos: q: on device {device}, expected cpu (relpos computes on the CPU)")
    for name, x in named.items():
        if x is not None and x.device != device:
            raise ValueError(f"relpos: {name}: on device {x.device}, expected {device} like q")
    check_dtypes({name: x for name, x in named.items() if x is not None})
    check_dropout_rng(dropout_rng, device)


def _segments(q_segments: Optional[torch.Tensor], k_segments: Optional[torch.Tensor]):
    """relpos.forward / backward's ``segments`` of the op's two optional int32 tensors."""
    return None if q_segments is None else (q_segments, k_segments)


def _forward_body(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding: Optional[torch.Tensor],
                  params: list[torch.Tensor], scheme: str, ints: list[int], floats: list[float],
                  dropout_rng: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                  q_segments: Optional[torch.Tensor] = None, k_segments: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """out (B, H, Lq, dv) and the row logsumexp (B, H, Lq), the softmax's (before dropout)."""
    record, options = decode(scheme, params, ints, floats)
    _check_tensors(dict(q=q, k=k, v=v, key_padding=key_padding, q_segments=q_segments, k_segments=k_segments),
                   record, dropout_rng)
    return relpos.forward(q, k, v, record, key_padding=key_padding, segments=_segments(q_segments, k_segments),
                          **options, **dropout_options(dropout_p, dropout_rng))


attention_forward = torch.library.custom_op("relpos::attention_forward", _forward_body, mutates_args=())


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, key_padding, params, scheme, ints, floats, dropout_rng=None, dropout_p=0.0,
                            q_segments=None, k_segments=None):
    _check_tensors(dict(q=q, k=k, v=v, key_padding=key_padding, q_segments=q_segments, k_segments=k_segments),
                   decode(scheme, params, ints, floats)[0], dropout_rng)
    B, H, Lq, _ = q.shape
    half = q.dtype in (torch.bfloat16, torch.float16)  # stored in a half type: lse is float32
    return q.new_empty(B, H, Lq, v.shape[-1]), q.new_empty(B, H, Lq, dtype=torch.float32 if half else q.dtype)


def _backward_body(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   dout: torch.Tensor, key_padding: Optional[torch.Tensor], params: list[torch.Tensor],
                   scheme: str, ints: list[int], floats: list[float], dropout_rng: Optional[torch.Tensor] = None,
                   dropout_p: float = 0.0, q_segments: Optional[torch.Tensor] = None,
                   k_segments: Optional[torch.Tensor] = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """dq, dk, dv and the gradient of each tensor of ``params`` (same order); with dropout, the
    forward's ``dropout_rng`` draws its mask again."""
    record, options = decode(scheme, params, ints, floats)
    _check_tensors(dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout, key_padding=key_padding, q_segments=q_segments,
                        k_segments=k_segments), record, dropout_rng)
    grads = relpos.backward(q, k, v, out, lse, dout, record, key_padding=key_padding,
                            segments=_segments(q_segments, k_segments), **options,
                            **dropout_options(dropout_p, dropout_rng))
    names = list(record._params())
    # A tensor given twice (one Shaw table tied for keys and values) is one
    # entry of _params per role; params holds it once per role too.
    return grads["q"], grads["k"], grads["v"], [grads[n] for n in names]


attention_backward = torch.library.custom_op("relpos::attention_backward", _backward_body, mutates_args=())


@attention_backward.register_fake
def _attention_backward_fake(q, k, v, out, lse, dout, key_padding, params, scheme, ints, floats, dropout_rng=None,
                             dropout_p=0.0, q_segments=None, k_segments=None):
    _check_tensors(dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout, key_padding=key_padding, q_segments=q_segments,
                        k_segments=k_segments), decode(scheme, params, ints, floats)[0], dropout_rng)
    # relpos.backward returns new contiguous tensors whatever the inputs' strides.
    fresh = [x.new_empty(x.shape) for x in (q, k, v, *params)]
    return fresh[0], fresh[1], fresh[2], fresh[3:]


def _setup_context(ctx, inputs, output):
    q, k, v, key_padding, params, scheme, ints, floats, dropout_rng, dropout_p, q_segments, k_segments = inputs
    out, lse = output  # (the inputs' defaults filled in)
    # The rng is saved with the tensors: the backward draws the forward's mask again from it.
    optional = [x for x in (key_padding, dropout_rng, q_segments, k_segments) if x is not None]
    ctx.save_for_backward(q, k, v, out, lse, *optional, *params)
    ctx.has_padding, ctx.has_rng, ctx.has_segments = key_padding is not None, dropout_rng is not None, \
        q_segments is not None
    ctx.scheme, ctx.ints, ctx.floats, ctx.dropout_p = scheme, ints, floats, dropout_p
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, *rest = ctx.saved_tensors
    key_padding = rest.pop(0) if ctx.has_padding else None
    dropout_rng = rest.pop(0) if ctx.has_rng else None
    q_segments, k_segments = (rest.pop(0), rest.pop(0)) if ctx.has_segments else (None, None)
    inputs = (q, k, v, out, lse, dout, key_padding, rest, ctx.scheme, ctx.ints, ctx.floats, dropout_rng,
              ctx.dropout_p, q_segments, k_segments)
    # The registered op where a graph of the gradients is being built (its autograd refuses a
    # second backward by name) or the call is not plainly eager, else its body.
    op = _backward_body if not torch.is_grad_enabled() and _eager((q, k, v, dout, *rest)) else attention_backward
    dq, dk, dv, dparams = op(*inputs)
    # One entry per argument the op was called with: its dispatcher leaves out trailing arguments
    # equal to their defaults (no dropout), which setup_context sees filled in.
    return (dq, dk, dv, None, list(dparams), *(None,) * (len(ctx.needs_input_grad) - 5))


attention_forward.register_autograd(_backward, setup_context=_setup_context)


# Under torch.autocast on the CPU the op runs with bfloat16 storage (CPU
# autocast's default dtype; float32 accumulation inside): q, k, v and the
# scheme's tables are cast to bfloat16, as autocast casts a linear layer's.
torch.library.register_autocast("relpos::attention_forward", "cpu", torch.bfloat16)


attention_backward.register_autograd(no_double_backward, setup_context=setup_nothing)


def _eager(tensors) -> bool:
    """Whether a call may run the ops' bodies: nothing traces it, CPU autocast is off (the op's
    autocast registration casts the inputs) and q is on the CPU (meta tensors take the op's
    fake implementation)."""
    return not traced(tensors) and not torch.is_autocast_enabled("cpu") and tensors[0].device.type == "cpu"


def forward(q, k, v, key_padding, params, scheme, ints, floats, dropout_rng=None, dropout_p=0.0, q_segments=None,
            k_segments=None):
    """relpos::attention_forward on its arguments, differentiable through
    relpos::attention_backward: its body where the call is plainly eager (_eager), through
    _Attention when a gradient is wanted, else the registered op. Segments travel as trailing
    arguments, left out where there are none (the op's schema then stays as it was)."""
    tensors = (q, k, v, key_padding, *params, dropout_rng, q_segments, k_segments)
    segments = () if q_segments is None else (q_segments, k_segments)
    if not _eager(tensors):
        return attention_forward(q, k, v, key_padding, params, scheme, ints, floats, dropout_rng, dropout_p,
                                 *segments)
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in tensors):
        return _Attention.apply(scheme, ints, floats, dropout_p, q, k, v, key_padding, dropout_rng, q_segments,
                                k_segments, *params)
    return _forward_body(q, k, v, key_padding, params, scheme, ints, floats, dropout_rng, dropout_p, q_segments,
                         k_segments)


class _Attention(torch.autograd.Function):
    """The forward op's body and its registered autograd formula, for eager calls (forward)."""

    @staticmethod
    def forward(ctx, scheme, ints, floats, dropout_p, q, k, v, key_padding, dropout_rng, q_segments, k_segments,
                *params):
        inputs = (q, k, v, key_padding, list(params), scheme, ints, floats, dropout_rng, dropout_p, q_segments,
                  k_segments)
        output = _forward_body(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, dout, dlse):
        dq, dk, dv, _, dparams, *_ = _backward(ctx, dout, dlse)
        return (None, None, None, None, dq, dk, dv, None, None, None, None, *dparams)


# ---- vmap: a mapped dimension of q, k, v (and key_padding) folds into the batch, one call for
# all mapped entries. With dropout it cannot: the mask is keyed by the batch row, so folded
# entries would draw different masks where vmap(randomness="same") promises one (an unmapped
# rng), and entries with their own rngs (randomness="different") need one call each; those
# calls run entry by entry (vmap's default, randomness="error", refuses the draw itself).

def _fold(x: Optional[torch.Tensor], dim: Optional[int], n: int) -> Optional[torch.Tensor]:
    """(.., n at dim, ..) -> (n * B, ...); an unmapped x is repeated n times."""
    if x is None:
        return None
    x = x.movedim(dim, 0) if dim is not None else x.expand(n, *x.shape)
    return x.reshape(n * x.shape[1], *x.shape[2:])


def _unfold(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])


def _entry(x: Optional[torch.Tensor], dim: Optional[int], i: int) -> Optional[torch.Tensor]:
    """Mapped entry i of x; an unmapped x (or None) as it is."""
    return x if x is None or dim is None else x.select(dim, i)


def _per_entry(op, n: int, tensors, dims) -> list[torch.Tensor]:
    """op on each mapped entry of ``tensors``, its results stacked."""
    results = [op(*(_entry(x, d, i) for x, d in zip(tensors, dims))) for i in range(n)]
    return [torch.stack(r) for r in zip(*results)]


def _check_unmapped_params(param_dims) -> None:
    if param_dims is not None and any(d is not None for d in param_dims):
        raise ValueError("relpos: vmap over the scheme's parameters is not supported; "
                         "map over q, k, v (and key_padding) only")


@torch.library.register_vmap("relpos::attention_forward")
def _attention_forward_vmap(info, in_dims, q, k, v, key_padding, params, scheme, ints, floats, dropout_rng=None,
                            dropout_p=0.0, q_segments=None, k_segments=None):
    q_dim, k_dim, v_dim, pad_dim, param_dims = in_dims[:5]
    segment_dims = (in_dims + (None, None))[10:12]  # in_dims holds the arguments given
    _check_unmapped_params(param_dims)
    n = info.batch_size
    if dropout_rng is not None:
        tensors = (q, k, v, key_padding, dropout_rng, q_segments, k_segments)
        dims = (q_dim, k_dim, v_dim, pad_dim, in_dims[8], *segment_dims)

        def entry(q, k, v, key_padding, dropout_rng, q_segments, k_segments):
            return attention_forward(q, k, v, key_padding, params, scheme, ints, floats, dropout_rng, dropout_p,
                                     q_segments, k_segments)

        return tuple(_per_entry(entry, n, tensors, dims)), (0, 0)
    segments = [_fold(x, d, n) for x, d in zip((q_segments, k_segments), segment_dims)]
    out, lse = attention_forward(_fold(q, q_dim, n), _fold(k, k_dim, n), _fold(v, v_dim, n),
                                 _fold(key_padding, pad_dim, n), params, scheme, ints, floats, None, 0.0, *segments)
    return (_unfold(out, n), _unfold(lse, n)), (0, 0)


@torch.library.register_vmap("relpos::attention_backward")
def _attention_backward_vmap(info, in_dims, q, k, v, out, lse, dout, key_padding, params, scheme, ints, floats,
                             dropout_rng=None, dropout_p=0.0, q_segments=None, k_segments=None):
    *tensor_dims, pad_dim, param_dims = in_dims[:8]
    segment_dims = (in_dims + (None, None))[13:15]
    _check_unmapped_params(param_dims)
    if params:
        # The folded call sums the parameter gradients over the mapped entries;
        # a mapped backward may want them per entry, which one call cannot give.
        raise ValueError("relpos: vmap of the backward with learnable positional parameters is not supported")
    n = info.batch_size
    if dropout_rng is not None:
        tensors = (q, k, v, out, lse, dout, key_padding, dropout_rng, q_segments, k_segments)

        def entry(q, k, v, out, lse, dout, key_padding, dropout_rng, q_segments, k_segments):
            return attention_backward(q, k, v, out, lse, dout, key_padding, params, scheme, ints, floats,
                                      dropout_rng, dropout_p, q_segments, k_segments)[:3]

        dims = (*tensor_dims, pad_dim, in_dims[11], *segment_dims)
        return (*_per_entry(entry, n, tensors, dims), []), (0, 0, 0, None)
    folded = [_fold(x, d, n) for x, d in zip((q, k, v, out, lse, dout), tensor_dims)]
    segments = [_fold(x, d, n) for x, d in zip((q_segments, k_segments), segment_dims)]
    dq, dk, dv, _ = attention_backward(*folded, _fold(key_padding, pad_dim, n), params, scheme, ints, floats, None,
                                       0.0, *segments)
    return (_unfold(dq, n), _unfold(dk, n), _unfold(dv, n), []), (0, 0, 0, None)
