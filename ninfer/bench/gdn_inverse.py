"""How far the chunk inverse (I + A)^-1 of the chunked gated delta rule lands from the true one
when computed as a product of matmuls (a one-launch intra-chunk kernel the engine once had)
instead of by substitution (fla's solve, which the engine runs; the reference's
`solve_triangular`). CPU only, float64 truth; the
table is printed by `tools/gdn_inverse_stability.py`, the claims are checked by
`tests/ops/test_gdn_inverse_stability.py`.

A[i, j] = beta_i (k_i . k_j) 2^(g_i - g_j) for j < i over one 64-token chunk. For near-orthogonal
keys (random) A is small and the product is accurate; for correlated keys (a repeated token) A
approaches beta times the all-ones lower triangle, its powers grow like binomial coefficients,
and the product's rounding no longer cancels, while the true inverse stays small (its largest
entry is printed beside the errors). "tf32" rounds each matmul operand to 10 mantissa bits,
as the kernel's tensor-core products do.
"""

from __future__ import annotations

import torch

CHUNK = 64


def tf32(x: torch.Tensor) -> torch.Tensor:
    """x (fp32) rounded to tf32's 10 mantissa bits (round half up on the bit pattern)."""
    bits = x.float().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def product_inverse(a: torch.Tensor, rounding: str) -> torch.Tensor:
    """(I + A)^-1 = (I - A)(I + A^2)(I + A^4)...(I + A^32) in fp32, A strictly lower [64, 64]."""
    mm = (lambda x, y: tf32(x) @ tf32(y)) if rounding == "tf32" else (lambda x, y: x @ y)
    m = -a.float()
    t = torch.eye(CHUNK) + m
    for _ in range(5):
        m = mm(m, m)
        t = t + mm(t, m)
    return t


def chunk_matrix(keys: torch.Tensor, beta: float, g_step: float) -> torch.Tensor:
    """A of one chunk (float64) from unit keys [64, dk], a constant beta and log2 decay step."""
    g = g_step * torch.arange(CHUNK, dtype=torch.float64)
    a = beta * (keys @ keys.T) * torch.exp2(g[:, None] - g[None, :])
    return torch.tril(a, -1)


def keys_with_cosine(mix: float, dk: int, gen: torch.Generator) -> torch.Tensor:
    """64 unit keys: a shared direction weighted by `mix` plus independent noise (mix 0: random,
    mix 1: one repeated key)."""
    shared = torch.randn(1, dk, generator=gen, dtype=torch.float64)
    noise = torch.randn(CHUNK, dk, generator=gen, dtype=torch.float64)
    k = mix * shared / shared.norm() * dk**0.5 + (1 - mix) * noise
    return torch.nn.functional.normalize(k, dim=-1)
