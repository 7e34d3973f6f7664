"""The fused MoE block over FP8 experts and an FP8 shared expert (`ops.cuda.moe
.moe_block_decode`: the routing, gate_up + SwiGLU and down kernels) under Triton's CPU
interpreter, against the reference block over the dequantised weights. The interpreter has no
e4m3 or bf16, so the weights go in as fp32 holding the e4m3 values with their block scales
(the kernels convert each tile to fp32 first: the same products), and x in fp32. Both scale
layouts and each way a kernel's K step meets the scale blocks (`moe._scale_blocks`): a step
inside one block (or per-channel scales: one scale per row), a step spanning whole 128-column
blocks (a scale per row and block), and blocks that do not divide the step (96 columns: a
scale gathered per element). The e4m3
loads themselves run on a GPU in tests/ops/test_cuda_fp8.py. TRITON_INTERPRET is read when a
kernel is defined: the check runs in a fresh interpreter."""

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
    from ninfer.ops.cuda import moe
    from fp8_held import held_fp8, rel
    from ninfer.ops.reference.dense import moe_block_ref

    def fp8(shape, spread, block):
        return held_fp8(gen, shape, spread, block)

    gen = torch.Generator().manual_seed(0)
    experts, top_k = 16, 4
    # the interpreter runs one config per kernel (BLOCK_K 256 for gate_up, 512 for down): over
    # K = 256 in 128 x 128 blocks a step spans two or four whole scale blocks, over K = 128 or
    # with per-channel scales (block None) it lies in one, 96-column blocks divide no step
    cases = (((128, 128), 256, 256, (3,)), ((128, 128), 128, 128, (2,)), (None, 128, 128, (2,)),
             ((128, 96), 192, 192, (2,)))
    for block, hidden, inter, tokens in cases:
        (gu, gu_d), (d, d_d) = (fp8((experts, 2 * inter, hidden), 1.0, block),
                                fp8((experts, hidden, inter), 1.0, block))
        (sgu, sgu_d), (sd, sd_d) = (fp8((2 * inter, hidden), 2.0, block),
                                    fp8((hidden, inter), 2.0, block))
        router = torch.randn(experts + 1, hidden, generator=gen) * 0.1
        for n in tokens:
            x = torch.randn(n, hidden, generator=gen)
            assert moe.block_fusable(x, router, gu, d, sgu, sd, top_k), n
            got = moe.moe_block_decode(x, router, gu, d, sgu, sd, top_k)
            want = moe_block_ref(x, router, gu_d, d_d, sgu_d, sd_d, top_k)
            assert rel(got, want) < 1e-5, (block, n, rel(got, want))
            # the shared expert's own scales count: doubling its dequantised weights differs
            assert rel(got, moe_block_ref(x, router, gu_d, d_d, 2 * sgu_d, sd_d, top_k)) > 1e-2
            assert rel(got, moe_block_ref(x, router, gu_d, d_d, sgu_d, 2 * sd_d, top_k)) > 1e-2
        x = torch.randn(2, hidden, generator=gen)
        assert not moe.block_fusable(x, router, gu, d, sgu_d, sd_d, top_k)
        try:
            moe.moe_block_decode(x, router, gu, d, sgu_d, sd_d, top_k)
        except ValueError as e:
            assert "shared expert is FP8" in str(e), e
        else:
            raise AssertionError("a bf16 shared expert beside FP8 experts was taken")
    print("ok")
    """
)


def test_fused_block_with_fp8_experts_and_shared_expert_matches_the_reference():
    env = interpreter_env()
    run = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
