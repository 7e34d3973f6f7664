"""The fused MoE block over FP8 experts and an FP8 shared expert (`ops.cuda.moe
.moe_block_decode`: the routing, gate_up + SwiGLU and down kernels) under Triton's CPU
interpreter, against the reference block over the dequantised weights. The interpreter has no
e4m3 or bf16, so the weights go in as fp32 holding the e4m3 values with their block scales
(the kernels convert each tile to fp32 first: the same products), and x in fp32; the e4m3
loads themselves run on a GPU in tests/ops/test_cuda_moe.py. TRITON_INTERPRET is read when a
kernel is defined: the check runs in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

CHECK = textwrap.dedent(
    """
    import torch
    from ninfer.ops.cuda import moe
    from ninfer.ops.fp8 import Fp8Weight, quantize_fp8
    from ninfer.ops.reference.dense import moe_block_ref

    class Held(Fp8Weight):  # e4m3 values held in fp32
        __slots__ = ()

        def __post_init__(self):
            pass

    def fp8(shape, gen, spread):
        w = torch.randn(*shape, generator=gen) * 0.05
        w = w * torch.logspace(0, spread, shape[-2]).view(-1, 1)  # rows of scale blocks differ
        q = quantize_fp8(w, (128, 128))
        return Held(q.qweight.float(), q.scale, q.block), q.dequantize(torch.float32)

    gen = torch.Generator().manual_seed(0)
    hidden, inter, experts, top_k = 128, 128, 16, 4
    gate_up, gate_up_d = fp8((experts, 2 * inter, hidden), gen, 1.0)
    down, down_d = fp8((experts, hidden, inter), gen, 1.0)
    s_gate_up, s_gate_up_d = fp8((2 * inter, hidden), gen, 2.0)
    s_down, s_down_d = fp8((hidden, inter), gen, 2.0)
    router = torch.randn(experts + 1, hidden, generator=gen) * 0.1
    weights = (gate_up, down, s_gate_up, s_down)
    for n in (1, 3):
        x = torch.randn(n, hidden, generator=gen)
        assert moe.block_fusable(x, router, *weights, top_k), n
        got = moe.moe_block_decode(x, router, *weights, top_k)
        want = moe_block_ref(x, router, gate_up_d, down_d, s_gate_up_d, s_down_d, top_k)
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-5, (n, err)
        # the shared expert's own scales count: its dequantised weights scaled by 2 differ
        other = moe_block_ref(x, router, gate_up_d, down_d, 2 * s_gate_up_d, s_down_d, top_k)
        assert ((got - other).norm() / want.norm()).item() > 1e-2
        other = moe_block_ref(x, router, gate_up_d, down_d, s_gate_up_d, 2 * s_down_d, top_k)
        assert ((got - other).norm() / want.norm()).item() > 1e-2
    x = torch.randn(2, hidden, generator=gen)
    assert not moe.block_fusable(x, router, gate_up, down, s_gate_up_d, s_down_d, top_k)
    try:
        moe.moe_block_decode(x, router, gate_up, down, s_gate_up_d, s_down_d, top_k)
    except ValueError as e:
        assert "shared expert is FP8" in str(e), e
    else:
        raise AssertionError("a bf16 shared expert beside FP8 experts was taken")
    print("ok")
    """
)


def test_fused_block_with_fp8_experts_and_shared_expert_matches_the_reference():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
