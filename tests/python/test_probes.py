"""Bad or unusual input through Python and torch: each ends in a ValueError naming
the argument (and the size where memory is the problem), or in the documented
correct result; never a crash, std::bad_cast, NaN or a silently wrong value."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import relpos
import relpos.torch as rt

RNG = np.random.default_rng(0)


def qkv(B=1, H=2, L=6, d=4, dtype=np.float32):
    return [RNG.standard_normal((B, H, L, d)).astype(dtype) for _ in range(3)]


def test_byte_strides_that_split_items_are_refused():
    q, k, v = qkv()
    split = np.lib.stride_tricks.as_strided(q, strides=(192, 96, 16, 2), writeable=False)
    with pytest.raises(ValueError, match="relpos: q: byte strides"):
        relpos.forward(split, k, v)
    raw = np.zeros(256, dtype=np.uint8)
    odd_heads = np.ndarray(k.shape, np.float32, buffer=raw, strides=(194, 97, 16, 4))
    with pytest.raises(ValueError, match=r"relpos: k: byte strides \(194, 97, 16, 4\)"):
        relpos.forward(q, odd_heads, v)


def test_sparse_and_non_cpu_tensors_are_refused():
    q, k, v = (torch.from_numpy(x) for x in qkv())
    with pytest.raises(ValueError, match="relpos: q: torch.sparse_coo tensors are not supported"):
        relpos.forward(q.to_sparse(), k, v)
    with pytest.raises(ValueError, match="relpos: key_padding: tensor must be on the CPU"):
        relpos.forward(q, k, v, key_padding=torch.zeros(1, 6, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match="relpos: v: tensor must be on the CPU"):
        relpos.forward(q, k, v.to("meta"))


def test_lazily_negated_tensor_is_read_with_its_sign():
    """x.conj().imag of a complex tensor is a view with torch's negative bit: its values
    are -imag, but its memory holds +imag. relpos reads the values."""
    q, k, v = (torch.from_numpy(x).double() for x in qkv())
    negated = torch.complex(torch.zeros_like(q), q).conj().imag  # values -q, memory +q
    assert negated.is_neg()
    want, _ = relpos.forward(-q, k, v, relpos.ALiBi())
    got, _ = relpos.forward(negated, k, v, relpos.ALiBi())
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    out = rt.attention(negated, k, v, relpos.ALiBi())
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_complex_tensors_are_refused():
    q = torch.zeros(1, 1, 2, 4, dtype=torch.complex64)
    with pytest.raises(ValueError, match="relpos: q: dtype must be float32, float64, bfloat16 or float16"):
        relpos.forward(q, q, q)


@pytest.mark.parametrize("kwargs,argument", [
    (dict(embed_dim=16, num_heads=0), "num_heads"),
    (dict(embed_dim=0, num_heads=2), "embed_dim"),
    (dict(embed_dim=16, num_heads=2, head_dim=-1), "head_dim"),
    (dict(embed_dim=16, num_heads=2, kdim=0), "kdim"),
    (dict(embed_dim=16, num_heads=2, scheme="shaw", shaw_k=-1), "shaw_k"),
    (dict(embed_dim=16, num_heads=2, threads=-3), "threads"),
    (dict(embed_dim=16, num_heads=2.0), "num_heads"),
])
def test_module_arguments_are_checked(kwargs, argument):
    with pytest.raises(ValueError, match=f"relpos: {argument}:"):
        rt.RelativeMultiheadAttention(**kwargs)


def test_module_inputs_are_checked_naming_the_argument_and_sizes():
    m = rt.RelativeMultiheadAttention(16, 2, "xl")
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"relpos: query: expected \(B, L, 16\), got \(2, 5, 12\)"):
        m(torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match=r"relpos: key: expected \(B, L, 16\)"):
        m(x, torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"relpos: mems: expected \(B=2, M, 16\)"):
        m(x, mems=torch.randn(3, 4, 16))
    with pytest.raises(ValueError, match="batch and key lengths disagree"):
        m(x, torch.randn(2, 5, 16), torch.randn(2, 4, 16))


def test_available_algorithms_checks_the_call():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="relpos: k: expected shape"):
        relpos.available_algorithms(q, k[..., :1], v)
    assert "fused" in relpos.available_algorithms(q, k, v, relpos.ALiBi())


def test_rope_dims_zero_is_refused():
    q, k, v = qkv()
    for dims in (0, 3, -2):
        with pytest.raises(ValueError, match="relpos: rope.dims: must be even and >= 2"):
            relpos.forward(q, k, v, relpos.RoPE(dims=dims))
    out_all, _ = relpos.forward(q, k, v, relpos.RoPE(dims=None))
    out_d, _ = relpos.forward(q, k, v, relpos.RoPE(dims=4))
    np.testing.assert_array_equal(out_all, out_d)


def test_quadratic_algorithm_beyond_memory_is_refused_with_the_size():
    L = 10**6
    row = np.zeros((1, 1, 1, 4), np.float32)
    broadcast = np.broadcast_to(row, (1, 1, L, 4))
    with pytest.raises(ValueError, match=r"relpos: algorithm: 'reference' needs about .* GB of scratch memory"):
        relpos.forward(broadcast, broadcast, broadcast, algorithm="reference")


def test_float32_limits_of_scale_and_alibi_slopes():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"relpos: scale: must be finite and > 0 in the precision the call computes in \(float32\)"):
        relpos.forward(q, k, v, scale=1e300)
    slopes = np.array([1e30, 1e30], np.float32)
    with pytest.raises(ValueError, match="relpos: alibi.slopes: slope"):
        relpos.forward(q, k, v, relpos.ALiBi(slopes=slopes), q_offset=2**39)
    out, lse = relpos.forward(*(x.astype(np.float64) for x in (q, k, v)), relpos.ALiBi(slopes=slopes.astype(np.float64)),
                              q_offset=2**39)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    np.testing.assert_array_equal(out[0, :, :, :], np.broadcast_to(v[0, :, -1:, :].astype(np.float64), out.shape[1:]))


def test_forward_on_tensors_that_require_grad_warns():
    q = torch.randn(1, 1, 3, 4, requires_grad=True)
    with pytest.warns(UserWarning, match="relpos.torch.attention"):
        relpos.forward(q, q, q)


def test_torch_attention_follows_torch_threads(monkeypatch):
    seen = []
    real = relpos.forward

    def spy(*args, **kwargs):
        seen.append(kwargs["threads"])
        return real(*args, **kwargs)

    monkeypatch.setattr(relpos, "forward", spy)
    q = torch.randn(1, 2, 5, 4)
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            rt.attention(q, q, q)
        rt.attention(q, q, q, threads=3)
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 2, 3]


def test_openmp_wait_policy_is_passive_unless_the_user_chose():
    code = "import os, relpos; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert got.strip() == "passive"
    env["OMP_WAIT_POLICY"] = "active"
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert got.strip() == "active"


def test_version_and_info_agree_everywhere():
    import importlib.metadata

    assert relpos.__version__ == importlib.metadata.version("relpos")
    cli = pathlib.Path(sys.executable).parent / "relpos"
    out = subprocess.run([str(cli), "--version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"relpos {relpos.__version__}"
    info = relpos.info()
    assert info["simd_target"] in info["simd_supported"] and info["gemm"].startswith("oneDNN")
    # AVX512-BF16 as the kernel reports it, and how half-storage calls compute, in both frontends.
    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    assert info["cpu_avx512_bf16"] == ("avx512_bf16" in flags)
    assert "float32" in info["half_storage"]
    text = subprocess.run([str(cli), "info"], capture_output=True, text=True, check=True).stdout
    assert f"half storage: {info['half_storage']}" in text
    # bfloat16 GEMMs take bfloat16 products exactly where oneDNN may use AVX512-BF16.
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA")
    if limit is None:
        assert info["gemm_bf16"].startswith("bfloat16 products") == ("avx512_bf16" in flags)
    elif limit == "AVX2":
        assert info["gemm_bf16"].startswith("widened to float32")
    assert f"bfloat16 GEMM: {info['gemm_bf16']}" in text
    code = "import relpos; print(relpos.info()['simd_target'])"
    limited = subprocess.run([sys.executable, "-c", code], env={**os.environ, "RELPOS_SIMD": "sse4"},
                             capture_output=True, text=True, check=True).stdout.strip()
    assert limited in ("SSE4", "SSSE3")
