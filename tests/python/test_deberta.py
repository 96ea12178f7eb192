"""DeBERTa's disentangled attention against transformers itself (DeBERTa-v2/v3's
DisentangledSelfAttention, tiny random configurations, float64, no downloads): the module's
own projections feed relpos's attention, and its output and every parameter's gradient must
equal the module's, for every algorithm that serves DeBERTa."""
from __future__ import annotations

import pytest
import torch
from transformers import DebertaV2Config
from transformers.models.deberta_v2.modeling_deberta_v2 import (
    DisentangledSelfAttention,
    build_relative_position,
    make_log_bucket_position,
)

import relpos
import relpos.torch as rt
import torch_oracle

HEADS, HEAD_DIM = 4, 8
ALGORITHMS = ("reference", "fused")


def module(buckets: int, max_relative: int, att_type: tuple[str, ...], share: bool, seed: int = 0):
    torch.manual_seed(seed)
    config = DebertaV2Config(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, relative_attention=True,
                             position_buckets=buckets, max_relative_positions=max_relative,
                             pos_att_type=list(att_type), share_att_key=share, attention_probs_dropout_prob=0.0,
                             hidden_dropout_prob=0.0)
    return DisentangledSelfAttention(config).double().eval()


def span(m: DisentangledSelfAttention) -> int:
    return m.pos_ebd_size


def relpos_attention(m: DisentangledSelfAttention, x, rel, key_padding, algorithm: str, queries=slice(None)):
    """m's attention computed by relpos: m's own projections, its position tables from the
    relative embeddings as m builds them (per head, (H, 2 span, d)); only the query rows
    ``queries`` of x (a slice: their first position becomes q_offset)."""
    B, L, _ = x.shape
    q, k, v = (proj(x).view(B, L, HEADS, HEAD_DIM) for proj in (m.query_proj, m.key_proj, m.value_proj))
    q = q[:, queries]
    rows = rel[: 2 * span(m)]

    def table(shared_proj, own_proj_name, term):
        if term not in m.pos_att_type:
            return None
        proj = shared_proj if m.share_att_key else getattr(m, own_proj_name)
        return proj(rows).view(2 * span(m), HEADS, HEAD_DIM).transpose(0, 1)

    scheme = relpos.DeBERTa(c2p=table(m.key_proj, "pos_key_proj", "c2p"),
                            p2c=table(m.query_proj, "pos_query_proj", "p2c"),
                            position_buckets=m.position_buckets, max_relative_positions=m.max_relative_positions)
    out = rt.attention(q, k, v, scheme, key_padding=key_padding, layout="blhd", algorithm=algorithm,
                       q_offset=queries.indices(L)[0])
    return out.reshape(B, q.shape[1], HEADS * HEAD_DIM)


def transformers_attention(m: DisentangledSelfAttention, x, rel, padded):
    """m's own forward; padded (B, L) True = padding, as DeBERTa's encoder masks it."""
    keep = ~padded
    mask = keep[:, None, :, None] & keep[:, None, None, :]
    relative_pos = build_relative_position(x, x, bucket_size=m.position_buckets, max_position=m.max_relative_positions)
    return m(x, mask, relative_pos=relative_pos, rel_embeddings=rel)[0]


def outputs_and_gradients(m, run, x, rel, rows_kept):
    """The output's kept query rows and the gradients of x, rel and every parameter of m."""
    for p in list(m.parameters()) + [x, rel]:
        p.grad = None
    out = run()
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    (out * weights * rows_kept[..., None]).sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    return out * rows_kept[..., None], x.grad.clone(), rel.grad.clone(), grads


CONFIGS = [  # buckets, max_relative_positions, pos_att_type, share_att_key
    (256, 512, ("c2p", "p2c"), True),  # DeBERTa-v3's
    (8, 40, ("c2p", "p2c"), False),  # log buckets from distance 5, edge rows past 39
    (8, 40, ("c2p",), True),
    (8, 40, ("p2c",), False),
    (8, 64, ("p2c",), True),
    (-1, 40, ("c2p", "p2c"), True),  # no buckets: distances clamped at 40
    (-1, 64, ("c2p",), False),
]


# Every configuration at every length with the fused kernel; the reference (slow: (L, L, d)
# tensors) at L = 300 for the log-bucket configurations only.
CASES = [(c, L, a) for c in CONFIGS for L in (1, 7, 70, 300) for a in ALGORITHMS
         if not (L == 300 and a == "reference" and c[0] != 8)]


@pytest.mark.parametrize("config,L,algorithm", CASES,
                         ids=[f"b{c[0]}_m{c[1]}_{'+'.join(c[2])}_share{int(c[3])}_L{L}_{a}" for c, L, a in CASES])
def test_equals_transformers_outputs_and_gradients(config, L, algorithm):
    m = module(*config)
    g = torch.Generator().manual_seed(L)
    x = torch.randn(2, L, HEADS * HEAD_DIM, dtype=torch.float64, generator=g).requires_grad_(True)
    rel = torch.randn(2 * span(m), HEADS * HEAD_DIM, dtype=torch.float64, generator=g).requires_grad_(True)
    padded = torch.zeros(2, L, dtype=torch.bool)
    padded[1, (L + 1) // 2:] = L > 1  # the second sequence padded from its middle on
    kept = (~padded).to(torch.float64)
    expected = outputs_and_gradients(m, lambda: transformers_attention(m, x, rel, padded), x, rel, kept)
    got = outputs_and_gradients(m, lambda: relpos_attention(m, x, rel, padded, algorithm), x, rel, kept)
    for name, a, b in (("out", got[0], expected[0]), ("d hidden", got[1], expected[1]),
                       ("d rel_embeddings", got[2], expected[2])):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=lambda s, n=name: f"{n}: {s}")
    assert got[3].keys() == expected[3].keys()
    for name in expected[3]:
        torch.testing.assert_close(got[3][name], expected[3][name], atol=1e-10, rtol=1e-10,
                                   msg=lambda s, n=name: f"d {n}: {s}")


@pytest.mark.parametrize("buckets,max_relative", [(256, 512), (8, 40), (2, 3), (64, 100), (32, 10000)])
def test_buckets_equal_make_log_bucket_position(buckets, max_relative):
    """relpos's bucket of every relative position in [-5000, 5000] is transformers' (its
    float32 arithmetic under torch's default dtype), and so is the test oracle's."""
    rel = torch.arange(-5000, 5001)
    expected = make_log_bucket_position(rel, buckets, max_relative).to(torch.long).tolist()
    got = [relpos.deberta_bucket(int(x), buckets, max_relative) for x in rel]
    assert got == expected
    assert torch_oracle.deberta_log_bucket(rel, buckets, max_relative).tolist() == expected


@pytest.mark.parametrize("buckets,max_relative", [(1, 40), (8, 5), (8, 4), (0, 0), (2**40 + 2, 2**40)])
def test_bucket_binding_refuses_bad_options_by_name(buckets, max_relative):
    name = "position_buckets" if buckets in (1, 2**40 + 2) else "max_relative_positions"
    with pytest.raises(ValueError, match=name):
        relpos.deberta_bucket(3, buckets, max_relative)


def test_transformers_p2c_fails_for_cross_lengths_its_c2p_does_not():
    """What transformers does for Lq != Lk (query_states of another length): its c2p term
    works, and relpos equals it (queries and keys both from position 0, as its
    build_relative_position places them); its p2c term raises (build_rpos builds (Lk, Lk)
    positions, bucket and reach arguments swapped), so relpos's p2c for cross lengths is
    checked against transformers' self-attention rows below and the oracle."""
    q = torch.randn(1, 5, HEADS * HEAD_DIM, dtype=torch.float64)
    kv = torch.randn(1, 9, HEADS * HEAD_DIM, dtype=torch.float64)
    rel = torch.randn(16, HEADS * HEAD_DIM, dtype=torch.float64)
    mask = torch.ones(1, 1, 5, 9, dtype=torch.bool)
    relative_pos = build_relative_position(q, kv, bucket_size=8, max_position=40)
    for att_type in (("p2c",), ("c2p", "p2c")):
        with pytest.raises(RuntimeError, match="size of tensor"):
            module(8, 40, att_type, True)(kv, mask, query_states=q, relative_pos=relative_pos, rel_embeddings=rel)
    m = module(8, 40, ("c2p",), True)
    with torch.no_grad():
        expected = m(kv, mask, query_states=q, relative_pos=relative_pos, rel_embeddings=rel)[0]
        qh, kh, vh = (t.view(1, -1, HEADS, HEAD_DIM) for t in (m.query_proj(q), m.key_proj(kv), m.value_proj(kv)))
        table = m.key_proj(rel).view(16, HEADS, HEAD_DIM).transpose(0, 1)
        scheme = relpos.DeBERTa(c2p=table, position_buckets=8, max_relative_positions=40)
        for algorithm in ALGORITHMS:
            got = rt.attention(qh, kh, vh, scheme, layout="blhd", algorithm=algorithm).reshape(1, 5, -1)
            torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10, msg=algorithm)


@pytest.mark.parametrize("att_type", [("p2c",), ("c2p", "p2c")])
def test_cross_lengths_are_rows_of_transformers_self_attention(att_type):
    """relpos reads both terms at query_pos - key_pos for any lengths: the queries of the
    last 5 positions against all 9 keys (q_offset 4) are the last 5 rows of transformers'
    self-attention over the 9 positions, p2c included."""
    m = module(8, 40, att_type, False)
    x = torch.randn(1, 9, HEADS * HEAD_DIM, dtype=torch.float64)
    rel = torch.randn(16, HEADS * HEAD_DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = transformers_attention(m, x, rel, torch.zeros(1, 9, dtype=torch.bool))[:, 4:]
        for algorithm in ALGORITHMS:
            got = relpos_attention(m, x, rel, None, algorithm, queries=slice(4, None))
            torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10, msg=algorithm)


def test_cross_lengths_and_offsets_match_the_oracle():
    """Both terms, per-head and shared tables, queries and keys at unrelated offsets (distances
    on both sides of the exact range, into the edge rows), every algorithm, against the
    float64 torch oracle (tests/python/torch_oracle.py, written from the formula)."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, HEADS, 5, HEAD_DIM, dtype=torch.float64, generator=g)
    k, v = (torch.randn(2, HEADS, 23, HEAD_DIM, dtype=torch.float64, generator=g) for _ in range(2))
    c2p = torch.randn(HEADS, 16, HEAD_DIM, dtype=torch.float64, generator=g)
    p2c = torch.randn(16, HEAD_DIM, dtype=torch.float64, generator=g)
    scheme = relpos.DeBERTa(c2p=c2p, p2c=p2c, position_buckets=8, max_relative_positions=12)
    for q_offset, k_offset in ((0, 0), (30, 3), (2, 9)):
        expected, _ = torch_oracle.attention(q, k, v, "deberta", dict(position_buckets=8, max_relative_positions=12),
                                             {"deberta_c2p": c2p, "deberta_p2c": p2c}, q_offset=q_offset,
                                             k_offset=k_offset)
        for algorithm in ALGORITHMS:
            got = rt.attention(q, k, v, scheme, q_offset=q_offset, k_offset=k_offset, algorithm=algorithm)
            torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12, msg=f"{q_offset} {k_offset} {algorithm}")


@pytest.mark.parametrize("changes,named", [
    ({"position_buckets": 1}, "deberta.position_buckets"),
    ({"max_relative_positions": 0}, "deberta.max_relative_positions"),
    ({"position_buckets": 8, "max_relative_positions": 5}, "deberta.max_relative_positions"),
    ({"c2p": None, "p2c": None}, "deberta"),
])
def test_bad_options_are_named(changes, named):
    table = torch.zeros(HEADS, 16, HEAD_DIM, dtype=torch.float64)
    args = {"c2p": table, "p2c": table, "position_buckets": 8, "max_relative_positions": 40, **changes}
    q = torch.zeros(1, HEADS, 3, HEAD_DIM, dtype=torch.float64)
    with pytest.raises(ValueError, match=named):
        rt.attention(q, q, q, relpos.DeBERTa(**args))


def test_module_scheme_deberta_trains_its_tables():
    layer = rt.RelativeMultiheadAttention(HEADS * HEAD_DIM, HEADS, "deberta", deberta_position_buckets=8,
                                          deberta_max_relative_positions=40, deberta_per_head=True)
    assert layer.deberta_c2p.shape == (HEADS, 16, HEAD_DIM) and layer.deberta_p2c.shape == (HEADS, 16, HEAD_DIM)
    x = torch.randn(2, 30, HEADS * HEAD_DIM)
    layer(x).square().sum().backward()
    assert layer.deberta_c2p.grad.abs().sum() > 0 and layer.deberta_p2c.grad.abs().sum() > 0
    only = rt.RelativeMultiheadAttention(HEADS * HEAD_DIM, HEADS, "deberta", deberta_pos_att_type="p2c")
    assert only.deberta_c2p is None and only.deberta_p2c.shape == (512, HEAD_DIM)
    with pytest.raises(ValueError, match="deberta_pos_att_type"):
        rt.RelativeMultiheadAttention(HEADS * HEAD_DIM, HEADS, "deberta", deberta_pos_att_type="c2c")


@pytest.mark.parametrize("args,named", [
    (dict(deberta_position_buckets=1), "deberta_position_buckets"),
    (dict(deberta_position_buckets=2**40 + 2), "deberta_position_buckets"),
    (dict(deberta_position_buckets=8, deberta_max_relative_positions=5), "deberta_max_relative_positions"),
    (dict(deberta_position_buckets=-1, deberta_max_relative_positions=0), "deberta_max_relative_positions"),
    (dict(deberta_max_relative_positions=1.5), "deberta_max_relative_positions"),
    (dict(deberta_pos_att_type="c2p p2c"), "deberta_pos_att_type"),
])
def test_module_refuses_bad_options_when_built_by_name(args, named):
    """A module with options the core would refuse fails when built, naming its argument."""
    with pytest.raises(ValueError, match=rf"^relpos: {named}: "):
        rt.RelativeMultiheadAttention(HEADS * HEAD_DIM, HEADS, "deberta", **args)


# ---- patch_hf_deberta: whole models, patched against unpatched ----

def tiny_config(**changes):
    base = dict(vocab_size=50, hidden_size=HEADS * HEAD_DIM, num_hidden_layers=2, num_attention_heads=HEADS,
                intermediate_size=37, max_position_embeddings=64, relative_attention=True, position_buckets=8,
                max_relative_positions=40, pos_att_type=["p2c", "c2p"], share_att_key=True,
                norm_rel_ebd="layer_norm", position_biased_input=False, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, num_labels=3, type_vocab_size=0)
    return DebertaV2Config(**{**base, **changes})


def model_pair(cls, config):
    torch.manual_seed(3)
    plain = cls(config).double()
    patched = cls(config).double()
    patched.load_state_dict(plain.state_dict())
    return plain, relpos.torch.patch_hf_deberta(patched)


def inputs_with_padding(L=40):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 50, (2, L), generator=g)
    mask = torch.ones(2, L, dtype=torch.long)
    mask[1, L // 2:] = 0
    return ids, mask


@pytest.mark.parametrize("head,labels", [("DebertaV2ForSequenceClassification", "sequence"),
                                         ("DebertaV2ForTokenClassification", "token"),
                                         ("DebertaV2ForMaskedLM", "token_vocab")])
@pytest.mark.parametrize("changes", [{}, {"share_att_key": False, "norm_rel_ebd": "none"},
                                     {"position_buckets": -1, "pos_att_type": ["c2p"]},
                                     {"relative_attention": False}],
                         ids=["v3_like", "separate_projections", "no_buckets_c2p",
                              "no_relative_attention_scaled_as_with_it"])
def test_patched_models_equal_transformers(head, labels, changes):
    import transformers

    cls = getattr(transformers, head)
    plain, patched = model_pair(cls, tiny_config(**changes))
    ids, mask = inputs_with_padding()
    target = {"sequence": torch.tensor([0, 2]), "token": torch.randint(0, 3, ids.shape),
              "token_vocab": torch.randint(0, 50, ids.shape)}[labels]
    results = []
    for m in (plain, patched):
        m.train()  # dropout is 0: train mode runs the same arithmetic and takes gradients
        m.zero_grad()
        out = m(input_ids=ids, attention_mask=mask, labels=target)
        out.loss.backward()
        results.append((out.logits.detach(), out.loss.detach(),
                        {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    (logits, loss, grads), (logits2, loss2, grads2) = results
    torch.testing.assert_close(logits2, logits, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(loss2, loss, atol=1e-12, rtol=1e-12)
    assert grads2.keys() == grads.keys()
    assert any("rel_embeddings" in n for n in grads) == changes.get("relative_attention", True)
    for n in grads:
        torch.testing.assert_close(grads2[n], grads[n], atol=1e-10, rtol=1e-10, msg=lambda s, n=n: f"{n}: {s}")


def test_patch_refuses_what_it_cannot_serve():
    from transformers import DebertaConfig, DebertaModel, DebertaV2Model

    ids, mask = inputs_with_padding(8)
    model = relpos.torch.patch_hf_deberta(DebertaV2Model(tiny_config()).eval())
    with pytest.raises(ValueError, match="output_attentions"):
        model(input_ids=ids, attention_mask=mask, output_attentions=True)
    v1 = DebertaModel(DebertaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                    intermediate_size=37, relative_attention=True))
    with pytest.raises(ValueError, match="DeBERTa v1"):
        relpos.torch.patch_hf_deberta(v1)
    with pytest.raises(ValueError, match="no DeBERTa-v2/v3 attention"):
        relpos.torch.patch_hf_deberta(torch.nn.Linear(2, 2))
