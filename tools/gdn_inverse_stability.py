"""How far the chunk inverse (I + A)^-1 of the chunked gated delta rule lands from the true one
when computed as a product of matmuls (`ninfer/ops/cuda/gdn_intra.py`) instead of by
substitution (fla's solve, the reference's `solve_triangular`). CPU only, float64 truth.

    python3 tools/gdn_inverse_stability.py

A[i, j] = beta_i (k_i . k_j) 2^(g_i - g_j) for j < i over one 64-token chunk. For near-orthogonal
keys (random) A is small and the product is accurate; for correlated keys (a repeated token) A
approaches beta times the all-ones lower triangle, its powers grow like binomial coefficients,
and the product's rounding no longer cancels, while the true inverse stays small (its largest
entry is printed beside the errors). "tf32" rounds each matmul operand to 10 mantissa bits,
as the kernel's tensor-core products do.
"""

from __future__ import annotations

import argparse

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    head = ("keys", "beta", "g/step", "mean cos", "max|inv|", "tf32 err", "fp32 err")
    print("{:>22} {:>5} {:>7} {:>9} {:>9} {:>10} {:>10}".format(*head))
    cases = [
        (mix, beta, gs) for mix in (0.0, 0.3, 0.6, 1.0) for beta in (0.5, 0.9) for gs in (0.0, -0.1)
    ]
    for mix, beta, g_step in cases:
        keys = keys_with_cosine(mix, args.dk, gen)
        a = chunk_matrix(keys, beta, g_step)
        exact = torch.linalg.inv(torch.eye(CHUNK, dtype=torch.float64) + a)
        errs = [
            (product_inverse(a, r).double() - exact).abs().max().item() for r in ("tf32", "fp32")
        ]
        cos = (keys @ keys.T).mean().item()
        name = (
            "random" if mix == 0 else ("one repeated key" if mix == 1 else f"shared weight {mix}")
        )
        big = exact.abs().max().item()
        print(
            f"{name:>22} {beta:5.2f} {g_step:7.2f} {cos:9.3f} {big:9.3g} {errs[0]:10.3g}"
            f" {errs[1]:10.3g}"
        )


if __name__ == "__main__":
    main()
