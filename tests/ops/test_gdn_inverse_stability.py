"""The chunk-inverse analysis behind the GDN prefill's use of fla's solve (`ninfer.bench.
gdn_inverse`, CPU): a matmul-product inverse is accurate on random keys and off by orders of
magnitude on a repeated key, where an fp32 triangular solve (the reference's, fla's kind) is
not."""

from __future__ import annotations

import torch

from ninfer.bench import gdn_inverse as tool


def _errors(mix: float, beta: float) -> tuple[float, float]:
    """(product inverse error, fp32 substitution error) against float64, one chunk."""
    keys = tool.keys_with_cosine(mix, 128, torch.Generator().manual_seed(0))
    a = tool.chunk_matrix(keys, beta, 0.0)
    eye = torch.eye(tool.CHUNK, dtype=torch.float64)
    exact = torch.linalg.inv(eye + a)
    product = tool.product_inverse(a, "tf32").double()
    solved = torch.linalg.solve_triangular((eye + a).float(), eye.float(), upper=False)
    return (product - exact).abs().max().item(), (solved.double() - exact).abs().max().item()


def test_product_inverse_is_accurate_on_random_keys():
    product, solved = _errors(0.0, 0.9)
    assert product < 1e-3 and solved < 1e-5


def test_product_inverse_breaks_on_a_repeated_key_where_substitution_does_not():
    product, solved = _errors(1.0, 0.9)
    assert product > 1e6  # the true inverse's entries are at most 1
    assert solved < 1e-5
