"""`ops.cuda.fp8`'s decode GEMV under Triton's CPU interpreter, every config (split-K included)
against the dequantised product: 1, 3 and 8 rows (M == 1 on the CUDA cores too), 128 x 128
blocks and per-channel scales, N and K off the tile grid, K ranges split unevenly. The
interpreter handles neither e4m3 nor bf16, so x and the weight go in as fp32, the weight
holding the e4m3 values (the kernel converts each tile to x's dtype first: the same products;
a BITS config, whose integer widening is for bf16 x, runs its twin's code here, so only the
twins run: the widening's asm is checked by tests/ops/test_e4m3_asm.py);
the e4m3 and bf16 loads themselves run on a GPU in tests/ops/test_cuda_fp8.py
(`test_every_skinny_config`). An A8 config's x scales sit in a NaN-filled buffer, so a read
past them shows. TRITON_INTERPRET is read when a kernel is defined: the check runs in a fresh
interpreter."""

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
    import ninfer.ops.cuda.fp8 as fp8
    from ninfer.ops.cuda.fp8 import CONFIGS, _fits, _launch
    from ninfer.ops.fp8 import quantize_fp8

    plain_args = fp8._args

    # an A8 config's x scales as the first columns of a NaN-filled buffer: a kernel that
    # reads a scale column past K gets NaN, not whatever memory lies there
    def nan_past_the_scales(x, qweight, scale, block, y, split, a8, quantised=None):
        args = list(plain_args(x, qweight, scale, block, y, split, a8, quantised))
        if a8 > 0 if quantised is None else quantised:
            groups = x.shape[1] // fp8.GROUP
            args[6] = torch.full((groups + 4, x.shape[0]), float("nan"))[:groups].t()
        return tuple(args)

    fp8._args = nan_past_the_scales
    torch.manual_seed(0)
    checked = set()
    for n, k, block in ((200, 640, (128, 128)), (96, 1024, (128, 128)), (72, 700, (1, 700))):
        w = quantize_fp8(torch.randn(n, k), block)
        want_w = w.dequantize(torch.float32)
        values = w.qweight.float()  # e4m3 values, exact in fp32
        for m in (1, 3, 8):
            x = torch.randn(m, k)
            want = x.float() @ want_w.t()
            a8 = 1 if block == (128, 128) else 0  # A8 configs beside the others
            for c in CONFIGS:  # a BITS config is its twin's code on fp32 x: the twins only
                if c.kwargs["BITS"] or not _fits(c, m == 1, k, block[1], torch.float16, a8):
                    continue
                y = torch.full((m, n), float("nan"))
                _launch(x, values, w.scale, block, y, c)
                err = ((y.float() - want).abs() / (want.abs() + 1.0)).max().item()
                assert err < 1e-4, (n, k, block, m, c.kwargs, err)
                checked.add(tuple(sorted(c.kwargs.items())))
    splits = {dict(c)["SPLIT_K"] for c in checked}
    twins = [c for c in CONFIGS if not c.kwargs["BITS"]]  # A8 ones included
    assert len(checked) == len(twins) and splits == {1, 2, 4}, (len(checked), splits)
    print("ok")
    """
)


def test_every_fp8_skinny_config_matches_the_dequantised_product():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


QUANT_CHECK = textwrap.dedent(
    """
    import torch
    from ninfer.ops.cuda.fp8 import ACT_EPS, FP8_MAX, quant_groups_into, quantize_groups_ref

    torch.manual_seed(0)
    for m, k in ((1, 128), (37, 384), (16, 256), (0, 128)):
        x = torch.randn(m, k)
        if m > 2:
            x[1] = 0.0
            x[2, :128] *= 1e4
        q = torch.full((m, k), float("nan"))
        s = quant_groups_into(x, q, 128)
        _, s_ref = quantize_groups_ref(x, 128)
        assert torch.equal(s, s_ref) and (m == 0 or s.stride() == s_ref.stride()), (m, k)
        xf = x.view(m, k // 128, 128)
        want = (xf / s_ref[..., None]).clamp(-FP8_MAX, FP8_MAX).view(m, k)
        assert torch.equal(q, want), (m, k, (q - want).abs().max())
    print("ok")
    """
)


def test_activation_quantisation_kernel_gives_the_torch_quotients():
    """`quant_groups_into` under the interpreter, q in fp32 (the interpreter has no e4m3): the
    same scales, column-major, and the same clamped quotients as `quantize_groups_ref` before
    its e4m3 rounding (that rounding runs on a GPU in tests/ops/test_cuda_fp8.py)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", QUANT_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
