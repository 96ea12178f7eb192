"""PyTorch integration: autograd through the relpos kernels, a multi-head attention
module, context parallelism and Hugging Face T5 and DeBERTa patches.

    import torch, relpos.torch as rt
    out = rt.attention(q, k, v, relpos.Shaw(k=16, wk=wk, wv=wv), causal=True)
    layer = rt.RelativeMultiheadAttention(512, 8, scheme="shaw", shaw_k=16)

The modules, each importing only those before it (docs/torch.md, "Package layout"):
``ops`` (the registered operators ``torch.ops.relpos.*``), ``functional``
(``attention``), ``context_parallel`` (``ring_attention``, ``ulysses_attention``),
``modules`` (``RelativeMultiheadAttention`` and the loaders of upstream weights),
``hf_t5`` (``patch_hf_t5``), ``hf_deberta`` (``patch_hf_deberta``), ``hf_sam`` (``patch_hf_sam``),
``hf_swin`` (``patch_hf_swin``). Their public names are
re-exported here.
"""
from relpos.torch.functional import attention
from relpos.torch.modules import RelativeMultiheadAttention, from_hf_t5, from_opennmt, from_transformer_xl
from relpos.torch.modules import KERPLE_MIN, SCHEMES  # noqa: F401  (rt.SCHEMES: the module's scheme names)
from relpos.torch.hf_t5 import patch_hf_t5
from relpos.torch.hf_deberta import patch_hf_deberta
from relpos.torch.hf_sam import patch_hf_sam
from relpos.torch.hf_swin import patch_hf_swin

__all__ = ["attention", "RelativeMultiheadAttention", "from_hf_t5", "from_transformer_xl", "from_opennmt",
           "patch_hf_t5", "patch_hf_deberta", "patch_hf_sam", "patch_hf_swin"]
