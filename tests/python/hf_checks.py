"""What the tests of the Hugging Face patches share: gradients compared parameter by parameter,
and transformers' attention softmax kept in float64 for float64 models."""
from __future__ import annotations

import pytest
import torch


def assert_same_gradients(upstream, ours, rtol=1e-9, atol=1e-11):
    """Every parameter of ``ours`` has a gradient where ``upstream``'s has one, equal to it."""
    theirs = dict(upstream.named_parameters())
    for name, p in ours.named_parameters():
        q = theirs[name]
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=name)


@pytest.fixture
def float64_softmax(monkeypatch):
    """transformers takes the attention softmax in float32 even in a float64 model (its
    eager attention's dtype=torch.float32), which leaves it float32's rounding (1e-8 of the
    outputs); under this fixture a float64 input keeps float64, so that a comparison shows
    relpos's agreement, not float32's."""
    softmax = torch.nn.functional.softmax

    def exact(x, dim=None, *args, dtype=None, **kwargs):
        return softmax(x, dim, *args, dtype=None if x.dtype == torch.float64 else dtype, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "softmax", exact)
