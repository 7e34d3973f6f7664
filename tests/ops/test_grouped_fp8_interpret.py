"""The FP8 grouped GEMM of the MoE's prefill-sized passes (`ops.cuda.moe.moe_grouped_fp8` over
`ops.cuda.grouped_fp8`) under Triton's CPU interpreter, against the reference MoE over the
dequantised experts. The interpreter has no e4m3 or bf16, so the experts go in as fp32 holding
the e4m3 values with their scales (the kernel converts each tile to x's dtype: the same
products), and x in fp32. Cases: 128 x 128 blocks over two K steps with a ragged tail (K = 136),
per-channel scales, experts with no pairs, experts with several M blocks, a skewed router. The
e4m3 loads run on a GPU in tests/ops/test_cuda_fp8.py. TRITON_INTERPRET is read when a kernel is
defined: the check runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

from fp8_held import interpreter_env  # noqa: E402

CHECK = textwrap.dedent(
    """
    import torch
    from ninfer.ops.cuda import grouped_fp8, moe
    from fp8_held import held_fp8, rel
    from ninfer.ops.reference import moe_ref

    def fp8(shape, block):
        return held_fp8(gen, shape, 1.0, block)

    gen = torch.Generator().manual_seed(0)
    # (block, experts, hidden, inter, tokens, top_k, skew): skew pushes most pairs to expert 0
    cases = (((128, 128), 8, 256, 136, 40, 2, 3.0), (None, 8, 128, 64, 72, 4, 0.0),
             ((128, 128), 16, 128, 128, 9, 4, 0.0))
    for block, experts, hidden, inter, tokens, top_k, skew in cases:
        (gu, gu_d), (d, d_d) = (fp8((experts, 2 * inter, hidden), block),
                                fp8((experts, hidden, inter), block))
        router = torch.randn(experts, hidden, generator=gen) * 0.1
        x = torch.randn(tokens, hidden, generator=gen)
        router[0] += skew * x.mean(0) / x.mean(0).norm() ** 2  # expert 0's logit up by ~skew
        assert grouped_fp8.fits(x.dtype, gu) and grouped_fp8.fits(x.dtype, d)
        weights, ids = moe.route_ref(x, router, top_k)
        counts = torch.bincount(ids.reshape(-1), minlength=experts)
        pairs = tokens * top_k
        bm = grouped_fp8.block_m(pairs, experts)
        got = moe.moe_grouped_fp8(x, router, gu, d, top_k)
        want = moe_ref(x, router, gu_d, d_d, top_k)
        assert rel(got, want) < 1e-5, (block, rel(got, want))
        if pairs > moe.DECODE_PAIRS:  # the path moe_fp8 takes past the decode kernels
            assert torch.equal(moe.moe_fp8(x, router, gu, d, top_k), got)
        _, tok, sorted_counts = moe._sorted_pairs(weights, ids, experts)
        outs = []
        for m in grouped_fp8.BLOCK_MS:  # every BLOCK_M gives the rows (up to the sums' order)
            offs, block_end = grouped_fp8.block_table(sorted_counts, m)
            outs.append(grouped_fp8.grouped_fp8(x, tok, gu, offs, block_end, m, pairs))
        assert all(rel(o, outs[0]) < 1e-6 for o in outs[1:]), block
        experts_sorted = ids.reshape(-1).sort(stable=True).values
        exact = torch.bmm(gu_d[experts_sorted], x[tok, :, None]).squeeze(-1)
        assert rel(outs[0], exact) < 1e-5, block
        print(block, "pairs per expert", counts.tolist(), "BLOCK_M", bm, "err", rel(got, want))
    print("ok")
    """
)

# random shapes and routings, edges included: one expert, one token, every pair on one expert
RANDOM = textwrap.dedent(
    """
    import random
    import torch
    from ninfer.ops.cuda import grouped_fp8, moe
    from fp8_held import held_fp8, rel

    rng = random.Random(3)
    gen = torch.Generator().manual_seed(3)
    cases = [(1, 1, 1, 0.0), (5, 1, 2, 0.0), (3, 30, 2, 50.0)]
    cases += [(rng.randint(1, 24), rng.randint(1, 60), 0, 0.0) for _ in range(5)]
    for experts, tokens, top_k, skew in cases:
        top_k = top_k or rng.randint(1, min(experts, 4))
        hidden, n = rng.choice((128, 256, 200)), rng.choice((64, 96, 130))
        block = rng.choice(((128, 128), None))
        w, w_d = held_fp8(gen, (experts, n, hidden), 1.0, block)
        x = torch.randn(tokens, hidden, generator=gen)
        ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
        if skew:  # every token's first choice expert 0
            ids[:, 0] = 0
            ids[:, 1:] = torch.stack([torch.randperm(experts - 1, generator=gen)[:top_k - 1] + 1
                                      for _ in range(tokens)])
        weights = torch.rand(tokens, top_k, generator=gen)
        w_sorted, tok, counts = moe._sorted_pairs(weights, ids, experts)
        pairs = tokens * top_k
        bm = grouped_fp8.block_m(pairs, experts)
        offs, block_end = grouped_fp8.block_table(counts, bm)
        got = grouped_fp8.grouped_fp8(x, tok, w, offs, block_end, bm, pairs, w_sorted.reshape(-1))
        e_sorted = ids.reshape(-1).sort(stable=True).values
        want = torch.bmm(w_d[e_sorted], x[tok, :, None]).squeeze(-1) * w_sorted
        assert rel(got, want) < 1e-5, (experts, tokens, top_k, block, rel(got, want))
    print("ok")
    """
)


def test_grouped_fp8_gemm_on_random_routings():
    """Random expert counts (1..24), token counts, top-k, widths off the block grid (K 200,
    N 130) and both scale layouts, with the routing weights applied in the kernel: every sorted
    pair's row equals its expert's dequantised product."""
    run = subprocess.run(
        [sys.executable, "-c", RANDOM], env=interpreter_env(), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


def test_grouped_fp8_gemm_matches_the_reference_moe():
    env = interpreter_env()
    run = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
