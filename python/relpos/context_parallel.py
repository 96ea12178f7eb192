"""``relpos.context_parallel``, the path README.md documents, kept working: the code
lives in ``relpos.torch.context_parallel``. ``_Ring`` is re-exported for
bench/context_parallel.py, which reads its ``waited`` seconds."""
from relpos.torch.context_parallel import _Ring, gather_sequence, ring_attention, shard_sequence, ulysses_attention

__all__ = ["ring_attention", "ulysses_attention", "shard_sequence", "gather_sequence"]
