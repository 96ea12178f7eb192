"""Weights of upstream attention layers load into relpos.torch and give the same
outputs and gradients. Each upstream layer is written here the way its project
writes it (HF transformers T5Attention, the original Transformer-XL
RelPartialLearnableMultiHeadAttn with its pad-view rel-shift, OpenNMT-py
MultiHeadedAttention with relative positions), with random weights."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import relpos.torch as rt
from torch_oracle import hf_relative_position_bucket


class HFT5Attention(nn.Module):
    """transformers.models.t5.modeling_t5.T5Attention (self-attention path, no cache, no dropout)."""

    def __init__(self, d_model, d_kv, n_heads, is_decoder, num_buckets=32, max_distance=128, has_bias=True):
        super().__init__()
        self.is_decoder, self.n_heads, self.key_value_proj_dim = is_decoder, n_heads, d_kv
        self.relative_attention_num_buckets, self.relative_attention_max_distance = num_buckets, max_distance
        inner = n_heads * d_kv
        self.q, self.k, self.v = (nn.Linear(d_model, inner, bias=False) for _ in range(3))
        self.o = nn.Linear(inner, d_model, bias=False)
        if has_bias:
            self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)

    def compute_bias(self, query_length, key_length, emb):
        context_position = torch.arange(query_length, dtype=torch.long)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long)[None, :]
        relative_position = memory_position - context_position
        bucket = hf_relative_position_bucket(relative_position, bidirectional=not self.is_decoder,
                                             num_buckets=self.relative_attention_num_buckets,
                                             max_distance=self.relative_attention_max_distance)
        values = emb(bucket)  # (q, k, H)
        return values.permute([2, 0, 1]).unsqueeze(0)

    def forward(self, hidden, mask=None, emb=None):
        B, L, _ = hidden.shape
        shape = lambda x: x.view(B, -1, self.n_heads, self.key_value_proj_dim).transpose(1, 2)
        q, k, v = shape(self.q(hidden)), shape(self.k(hidden)), shape(self.v(hidden))
        scores = torch.matmul(q, k.transpose(3, 2))
        position_bias = self.compute_bias(L, L, emb or self.relative_attention_bias)
        if mask is not None:
            position_bias = position_bias + mask  # (B, 1, q, k) additive: 0 or finfo.min
        scores += position_bias
        # Upstream upcasts half precision with scores.float(); these tests run in float64.
        attn = nn.functional.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(B, L, -1)
        return self.o(out)


def hf_t5_cross_attention(up: HFT5Attention, hidden, enc, mask=None):
    """T5Attention on the cross-attention path (key_value_states = the encoder's
    states, has_relative_attention_bias=False): position_bias is zeros plus the mask."""
    B, Lq, _ = hidden.shape
    shape = lambda x: x.view(B, -1, up.n_heads, up.key_value_proj_dim).transpose(1, 2)
    q, k, v = shape(up.q(hidden)), shape(up.k(enc)), shape(up.v(enc))
    scores = torch.matmul(q, k.transpose(3, 2))
    position_bias = torch.zeros((1, up.n_heads, Lq, enc.shape[1]), dtype=scores.dtype)
    if mask is not None:
        position_bias = position_bias + mask
    scores += position_bias
    attn = nn.functional.softmax(scores, dim=-1)
    return up.o(torch.matmul(attn, v).transpose(1, 2).reshape(B, Lq, -1))


class TransformerXLAttention(nn.Module):
    """kimiyoung/transformer-xl pytorch/mem_transformer.py RelPartialLearnableMultiHeadAttn
    (post-norm path without dropout, residual and layer norm) and PositionalEmbedding."""

    def __init__(self, n_head, d_model, d_head):
        super().__init__()
        self.n_head, self.d_model, self.d_head = n_head, d_model, d_head
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.scale = 1 / (d_head**0.5)

    @staticmethod
    def pos_emb(pos_seq, demb):
        inv_freq = 1 / (10000 ** (torch.arange(0.0, demb, 2.0) / demb))
        sinusoid_inp = torch.ger(pos_seq, inv_freq)
        return torch.cat([sinusoid_inp.sin(), sinusoid_inp.cos()], dim=-1)[:, None, :]

    @staticmethod
    def _rel_shift(x):
        zero_pad = torch.zeros((x.size(0), 1, *x.size()[2:]), device=x.device, dtype=x.dtype)
        x_padded = torch.cat([zero_pad, x], dim=1)
        x_padded = x_padded.view(x.size(1) + 1, x.size(0), *x.size()[2:])
        return x_padded[1:].view_as(x)

    def forward(self, w, r_w_bias, r_r_bias, mems=None, clamp_len=0):
        qlen, bsz = w.size(0), w.size(1)  # w: (qlen, B, d_model), time first
        mlen = 0 if mems is None else mems.size(0)
        klen = qlen + mlen
        pos_seq = torch.arange(klen - 1, -1, -1.0)
        if clamp_len > 0:
            pos_seq.clamp_(max=clamp_len)
        r = self.pos_emb(pos_seq, self.d_model)
        cat = w if mems is None else torch.cat([mems, w], 0)
        w_heads = self.qkv_net(cat)
        r_head_k = self.r_net(r)
        w_head_q, w_head_k, w_head_v = torch.chunk(w_heads, 3, dim=-1)
        w_head_q = w_head_q[-qlen:]
        w_head_q = w_head_q.view(qlen, bsz, self.n_head, self.d_head)
        w_head_k = w_head_k.view(klen, bsz, self.n_head, self.d_head)
        w_head_v = w_head_v.view(klen, bsz, self.n_head, self.d_head)
        r_head_k = r_head_k.view(klen, self.n_head, self.d_head)
        AC = torch.einsum("ibnd,jbnd->ijbn", (w_head_q + r_w_bias, w_head_k))
        BD = self._rel_shift(torch.einsum("ibnd,jnd->ijbn", (w_head_q + r_r_bias, r_head_k)))
        attn_score = (AC + BD) * self.scale
        attn_mask = torch.triu(torch.ones(qlen, klen), diagonal=1 + mlen).bool()[:, :, None]
        # Upstream wraps this in .float() / .type_as for half precision; these tests run in float64.
        attn_score = attn_score.masked_fill(attn_mask[:, :, :, None], -float("inf"))
        attn_prob = nn.functional.softmax(attn_score, dim=1)
        attn_vec = torch.einsum("ijbn,jbnd->ibnd", (attn_prob, w_head_v))
        return self.o_net(attn_vec.contiguous().view(qlen, bsz, self.n_head * self.d_head))


class OpenNMTAttention(nn.Module):
    """OpenNMT-py onmt/modules/multi_headed_attn.py MultiHeadedAttention with
    max_relative_positions > 0 (self-attention, no cache, no dropout)."""

    def __init__(self, head_count, model_dim, max_relative_positions):
        super().__init__()
        self.dim_per_head = model_dim // head_count
        self.head_count, self.model_dim, self.max_relative_positions = head_count, model_dim, max_relative_positions
        self.linear_keys = nn.Linear(model_dim, model_dim)
        self.linear_values = nn.Linear(model_dim, model_dim)
        self.linear_query = nn.Linear(model_dim, model_dim)
        self.final_linear = nn.Linear(model_dim, model_dim)
        self.relative_positions_embeddings = nn.Embedding(max_relative_positions * 2 + 1, self.dim_per_head)

    @staticmethod
    def relative_positions_matrix(length, max_relative_positions):
        range_vec = torch.arange(length)
        range_mat = range_vec.unsqueeze(-1).expand(-1, length).transpose(0, 1)
        distance_mat = range_mat - range_mat.transpose(0, 1)
        distance_mat_clipped = torch.clamp(distance_mat, min=-max_relative_positions, max=max_relative_positions)
        return distance_mat_clipped + max_relative_positions

    @staticmethod
    def relative_matmul(x, z, transpose):
        batch_size, heads, length, _ = x.shape
        x_t = x.permute(2, 0, 1, 3).reshape(length, heads * batch_size, -1)
        x_tz_matmul = torch.matmul(x_t, z.transpose(1, 2) if transpose else z)
        return x_tz_matmul.reshape(length, batch_size, heads, -1).permute(1, 2, 0, 3)

    def forward(self, x, mask=None):
        B, L, _ = x.shape
        shape = lambda t: t.view(B, -1, self.head_count, self.dim_per_head).transpose(1, 2)
        key, value, query = shape(self.linear_keys(x)), shape(self.linear_values(x)), shape(self.linear_query(x))
        relations = self.relative_positions_embeddings(self.relative_positions_matrix(L, self.max_relative_positions))
        query = query / math.sqrt(self.dim_per_head)
        scores = torch.matmul(query, key.transpose(2, 3)) + self.relative_matmul(query, relations, True)
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1), -1e18)  # mask (B, 1, L) true = padded
        attn = torch.softmax(scores, dim=-1)
        context = torch.matmul(attn, value) + self.relative_matmul(attn, relations, False)
        return self.final_linear(context.transpose(1, 2).reshape(B, L, -1))


class OpenNMT3Attention(OpenNMTAttention):
    """OpenNMT-py 3.x MultiHeadedAttention: the linears' biases follow add_qkvbias
    (False by default), num_kv > 0 key/value heads expanded on the head dimension
    (key.view(b, -1, 1, l, d).repeat(1, 1, qh // h, 1, 1)); max_relative_positions
    0 (plain) or > 0 (relative_matmul as in 2.x)."""

    def __init__(self, head_count, model_dim, max_relative_positions, num_kv=0, add_qkvbias=False):
        nn.Module.__init__(self)
        self.dim_per_head = model_dim // head_count
        self.head_count, self.model_dim, self.max_relative_positions = head_count, model_dim, max_relative_positions
        self.num_kv = num_kv
        kv_dim = num_kv * self.dim_per_head if num_kv else model_dim
        self.linear_keys = nn.Linear(model_dim, kv_dim, bias=add_qkvbias)
        self.linear_values = nn.Linear(model_dim, kv_dim, bias=add_qkvbias)
        self.linear_query = nn.Linear(model_dim, model_dim, bias=add_qkvbias)
        self.final_linear = nn.Linear(model_dim, model_dim, bias=add_qkvbias)
        if max_relative_positions > 0:
            self.relative_positions_embeddings = nn.Embedding(max_relative_positions * 2 + 1, self.dim_per_head)

    def forward(self, x, mask=None):
        B, L, _ = x.shape
        dph = self.dim_per_head
        shape = lambda t: t.view(B, L, -1, dph).transpose(1, 2)
        key, value, query = shape(self.linear_keys(x)), shape(self.linear_values(x)), shape(self.linear_query(x))
        if self.num_kv > 0:
            qh, h = query.size(1), key.size(1)
            key = key.view(B, -1, 1, L, dph).repeat(1, 1, qh // h, 1, 1).view(B, qh, L, dph)
            value = value.view(B, -1, 1, L, dph).repeat(1, 1, qh // h, 1, 1).view(B, qh, L, dph)
        query = query / math.sqrt(dph)
        scores = torch.matmul(query, key.transpose(2, 3))
        if self.max_relative_positions > 0:
            relations = self.relative_positions_embeddings(
                self.relative_positions_matrix(L, self.max_relative_positions))
            scores = scores + self.relative_matmul(query, relations, True)
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1), -1e18)
        attn = torch.softmax(scores, dim=-1)
        context = torch.matmul(attn, value)
        if self.max_relative_positions > 0:
            context = context + self.relative_matmul(attn, relations, False)
        return self.final_linear(context.transpose(1, 2).reshape(B, L, -1))


def randomize(module: nn.Module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)


def assert_same_outputs_and_gradients(up: nn.Module, up_out, ours: nn.Module, our_out, inputs, pairs):
    """Outputs equal; gradients of the inputs and of each (upstream, ours) parameter pair equal
    (pairs map a function of upstream gradients to a relpos parameter)."""
    torch.testing.assert_close(our_out, up_out, rtol=1e-10, atol=1e-10)
    dy = torch.randn_like(up_out)
    (up_out * dy).sum().backward()
    (our_out * dy).sum().backward()
    for x_up, x_ours in inputs:
        torch.testing.assert_close(x_ours.grad, x_up.grad, rtol=1e-9, atol=1e-10)
    for name, up_grad, our_param in pairs:
        torch.testing.assert_close(our_param.grad, up_grad(), rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize("is_decoder", [False, True], ids=["encoder", "decoder"])
def test_hf_t5_weights(is_decoder):
    torch.manual_seed(1 + is_decoder)
    up = HFT5Attention(d_model=12, d_kv=5, n_heads=3, is_decoder=is_decoder, num_buckets=8, max_distance=20)
    randomize(up)
    ours = rt.from_hf_t5(up)
    B, L = 2, 23  # long enough for the logarithmic buckets and max_distance
    x_up = torch.randn(B, L, 12, requires_grad=True)
    x_ours = x_up.detach().clone().requires_grad_()
    if is_decoder:
        causal = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
        mask = torch.zeros(L, L).masked_fill(causal, torch.finfo(torch.float64).min)[None, None]
        up_out, our_out = up(x_up, mask), ours(x_ours, causal=True)
    else:
        pad = torch.zeros(B, L, dtype=torch.bool)
        pad[0, -4:] = True
        mask = torch.zeros(B, 1, 1, L).masked_fill(pad[:, None, None], torch.finfo(torch.float64).min)
        up_out, our_out = up(x_up, mask), ours(x_ours, key_padding=pad)
    pairs = [("table", lambda: up.relative_attention_bias.weight.grad.t(), ours.t5_table),
             ("q", lambda: up.q.weight.grad, ours.q_proj.weight), ("o", lambda: up.o.weight.grad, ours.out_proj.weight)]
    assert_same_outputs_and_gradients(up, up_out, ours, our_out, [(x_up, x_ours)], pairs)

    # A later layer of the stack shares the first layer's table.
    later = HFT5Attention(12, 5, 3, is_decoder, 8, 20, has_bias=False)
    randomize(later)
    ours_later = rt.from_hf_t5(later, up.relative_attention_bias)
    x = torch.randn(1, 9, 12)
    causal = dict(causal=True) if is_decoder else {}
    mask = (torch.zeros(9, 9).masked_fill(torch.triu(torch.ones(9, 9, dtype=torch.bool), 1), -1e300)[None, None]
            if is_decoder else None)
    torch.testing.assert_close(ours_later(x, **causal), later(x, mask, up.relative_attention_bias),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mlen,clamp_len", [(0, 0), (4, 0), (3, 5)], ids=["no-mem", "mem4", "mem3-clamp5"])
def test_transformer_xl_weights(mlen, clamp_len):
    torch.manual_seed(10 + mlen)
    H, d_model, d_head, qlen, B = 2, 8, 3, 7, 2
    up = TransformerXLAttention(H, d_model, d_head)
    randomize(up)
    r_w_bias = nn.Parameter(0.3 * torch.randn(H, d_head))
    r_r_bias = nn.Parameter(0.3 * torch.randn(H, d_head))
    ours = rt.from_transformer_xl(up, r_w_bias, r_r_bias, clamp_len=clamp_len)
    w_up = torch.randn(qlen, B, d_model, requires_grad=True)  # time first, as upstream
    mems = torch.randn(mlen, B, d_model) if mlen else None
    w_ours = w_up.detach().transpose(0, 1).clone().requires_grad_()
    up_out = up(w_up, r_w_bias, r_r_bias, mems=mems, clamp_len=clamp_len).transpose(0, 1)
    our_out = ours(w_ours, causal=True, mems=None if mems is None else mems.transpose(0, 1))
    torch.testing.assert_close(our_out, up_out, rtol=1e-10, atol=1e-10)
    dy = torch.randn_like(up_out)
    (up_out * dy).sum().backward()
    (our_out * dy).sum().backward()
    torch.testing.assert_close(w_ours.grad, w_up.grad.transpose(0, 1), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ours.xl_u.grad, r_w_bias.grad, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ours.xl_v.grad, r_r_bias.grad, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ours.xl_w_r.grad, up.r_net.weight.grad.view(H, d_head, d_model), rtol=1e-9, atol=1e-10)
    g_q, g_k, g_v = up.qkv_net.weight.grad.chunk(3, 0)
    torch.testing.assert_close(ours.k_proj.weight.grad, g_k, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ours.v_proj.weight.grad, g_v, rtol=1e-9, atol=1e-10)


def padded_self_attention(up, ours, width, B=2, L=9):
    """An OpenNMT-py layer and its relpos module on the same input, the last 3 keys
    of the second sequence padded: (x_up, x_ours, up_out, our_out)."""
    x_up = torch.randn(B, L, width, requires_grad=True)
    x_ours = x_up.detach().clone().requires_grad_()
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[1, -3:] = True
    return x_up, x_ours, up(x_up, pad[:, None, :]), ours(x_ours, key_padding=pad)


def test_opennmt_weights():
    torch.manual_seed(3)
    up = OpenNMTAttention(head_count=2, model_dim=8, max_relative_positions=3)
    randomize(up)
    ours = rt.from_opennmt(up)
    x_up, x_ours, up_out, our_out = padded_self_attention(up, ours, 8)
    pairs = [("table", lambda: up.relative_positions_embeddings.weight.grad, ours.shaw_wk),
             ("keys", lambda: up.linear_keys.weight.grad, ours.k_proj.weight),
             ("bias", lambda: up.final_linear.bias.grad, ours.out_proj.bias)]
    assert_same_outputs_and_gradients(up, up_out, ours, our_out, [(x_up, x_ours)], pairs)


def test_hf_t5_cross_attention_has_no_position_bias():
    torch.manual_seed(4)
    up = HFT5Attention(d_model=12, d_kv=5, n_heads=3, is_decoder=True, num_buckets=8, max_distance=20, has_bias=False)
    randomize(up)
    with pytest.raises(ValueError, match="cross_attention=True"):
        rt.from_hf_t5(up)
    ours = rt.from_hf_t5(up, cross_attention=True)
    assert ours.scheme == "none" and ours.scale == 1.0
    hidden_up, enc_up = torch.randn(2, 6, 12, requires_grad=True), torch.randn(2, 9, 12, requires_grad=True)
    hidden, enc = (x.detach().clone().requires_grad_() for x in (hidden_up, enc_up))
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, -2:] = True
    mask = torch.zeros(2, 1, 1, 9).masked_fill(pad[:, None, None], torch.finfo(torch.float64).min)
    up_out, our_out = hf_t5_cross_attention(up, hidden_up, enc_up, mask), ours(hidden, enc, key_padding=pad)
    pairs = [("k", lambda: up.k.weight.grad, ours.k_proj.weight), ("o", lambda: up.o.weight.grad, ours.out_proj.weight)]
    assert_same_outputs_and_gradients(up, up_out, ours, our_out, [(hidden_up, hidden), (enc_up, enc)], pairs)


@pytest.mark.parametrize("k,num_kv,add_qkvbias", [(3, 0, False), (3, 1, False), (2, 2, True), (0, 2, False)],
                         ids=["shaw-nobias", "shaw-mqa", "shaw-gqa-bias", "plain-gqa"])
def test_opennmt3_weights(k, num_kv, add_qkvbias):
    torch.manual_seed(5 + k + num_kv)
    up = OpenNMT3Attention(head_count=4, model_dim=16, max_relative_positions=k, num_kv=num_kv,
                           add_qkvbias=add_qkvbias)
    randomize(up)
    ours = rt.from_opennmt(up)
    assert ours.num_kv_heads == (num_kv or 4) and (ours.q_proj.bias is not None) == add_qkvbias
    x_up, x_ours, up_out, our_out = padded_self_attention(up, ours, 16)
    pairs = [("keys", lambda: up.linear_keys.weight.grad, ours.k_proj.weight),
             ("values", lambda: up.linear_values.weight.grad, ours.v_proj.weight)]
    if k > 0:
        pairs.append(("table", lambda: up.relative_positions_embeddings.weight.grad, ours.shaw_wk))
    assert_same_outputs_and_gradients(up, up_out, ours, our_out, [(x_up, x_ours)], pairs)


def test_opennmt_position_kinds_not_loaded_are_refused_by_name():
    up = OpenNMT3Attention(head_count=2, model_dim=8, max_relative_positions=0)
    for k, name in ((-1, "rotary embeddings"), (-2, "ALiBi")):
        up.max_relative_positions = k
        with pytest.raises(ValueError, match=f"max_relative_positions={k} \\({name}\\)"):
            rt.from_opennmt(up)
    up.max_relative_positions, up.relative_positions_buckets = 0, 32
    with pytest.raises(ValueError, match="relative_positions_buckets=32"):
        rt.from_opennmt(up)


def test_transformer_xl_features_not_loaded_are_refused_by_name():
    up = TransformerXLAttention(2, 8, 3)
    bias = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="same_length=True"):
        rt.from_transformer_xl(up, bias, bias, same_length=True)

    class RelLearnableMultiHeadAttn(nn.Module):  # attn_type=1: r_emb, r_w_bias, r_bias, no r_net
        n_head, d_head, d_model = 2, 3, 8

    with pytest.raises(ValueError, match="RelLearnableMultiHeadAttn has no r_net"):
        rt.from_transformer_xl(RelLearnableMultiHeadAttn(), bias, bias)
