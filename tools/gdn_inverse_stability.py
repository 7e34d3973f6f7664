"""The chunk inverse of the gated delta rule computed as a product of matmuls against the true
one (`ninfer.bench.gdn_inverse` says how): a table of errors by key correlation, beta and decay.

    python3 tools/gdn_inverse_stability.py
"""

from __future__ import annotations

import argparse

import torch

from ninfer.bench.gdn_inverse import CHUNK, chunk_matrix, keys_with_cosine, product_inverse


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
