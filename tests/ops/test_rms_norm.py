"""SimpleRMSNorm and its operator (ops_rms_norm): the hand-written backward against autograd through the definition."""

from __future__ import annotations

import torch

from modeling_tnn.naive import naive_rms_norm as reference
from modeling_tnn.rpe import SimpleRMSNorm


def test_norm_gradients_equal_the_definition():
    norm = SimpleRMSNorm()
    x = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(norm, (x,))
    grad = torch.randn(3, 5, 7, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(norm(x), x, grad)[0],
                               torch.autograd.grad(reference(x, norm.eps), x, grad)[0], atol=1e-12, rtol=1e-10)
    # The same up to rounding: the norm computes rms(x) as ||x|| / sqrt(d), the definition as sqrt(mean(x^2)).
    torch.testing.assert_close(norm(x), reference(x, norm.eps), atol=0, rtol=4e-16)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), reference(x, norm.eps), atol=0, rtol=4e-16)


def test_norm_saves_its_output_not_its_input():
    x = torch.randn(4, 6, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = SimpleRMSNorm()(x)
    assert any(t is y or t.data_ptr() == y.data_ptr() for t in saved)
    assert not any(t.data_ptr() == x.data_ptr() for t in saved)


def test_zero_rows_get_the_finite_limit():
    """At an all-zero row the norm is x / eps to first order: the gradient is grad / eps (not NaN)."""
    norm = SimpleRMSNorm(eps=1e-3)
    x = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 4, dtype=torch.float64)
    (got,) = torch.autograd.grad(norm(x), x, grad)
    torch.testing.assert_close(got, grad / 1e-3)


def test_norm_op_is_the_definition_with_exact_gradients():
    from modeling_tnn.ops_rms_norm import rms_norm

    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(rms_norm(x, 1e-8), reference(x, 1e-8), atol=0, rtol=4e-16)
    assert torch.autograd.gradcheck(lambda a: rms_norm(a, 1e-8), (x,))
