"""`ops.cuda.fp8`'s decode GEMV under Triton's CPU interpreter, every config (split-K included)
against the dequantised product: 1, 3 and 8 rows (M == 1 on the CUDA cores too), 128 x 128
blocks and per-channel scales, N and K off the tile grid, K ranges split unevenly, with bf16
products and with fp16 ones (X16, a row of x past fp16's range included). The
interpreter handles neither e4m3 nor bf16, so x and the weight go in as fp32, the weight
holding the e4m3 values (the kernel converts each tile to x's dtype first: the same products);
the e4m3 and bf16 loads themselves run on a GPU in tests/ops/test_cuda_fp8.py
(`test_every_skinny_config`). TRITON_INTERPRET is read when a kernel
is defined: the check runs in a fresh interpreter."""

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
    from ninfer.ops.cuda.fp8 import CONFIGS, _fits, _launch
    from ninfer.ops.fp8 import quantize_fp8

    torch.manual_seed(0)
    checked = set()
    for n, k, block in ((200, 640, (128, 128)), (96, 1024, (128, 128)), (72, 700, (1, 700))):
        w = quantize_fp8(torch.randn(n, k), block)
        want_w = w.dequantize(torch.float32)
        values = w.qweight.float()  # e4m3 values, exact in fp32
        for m in (1, 3, 8):
            # bf16 values (as the engine's x), so the X16 path's fp16 copy of x is exact; one
            # row past fp16's range takes that path's power-of-two scaling
            x = torch.randn(m, k).to(torch.bfloat16).float()
            x[-1, :5] *= 3e5
            want = x.double() @ want_w.double().t()
            for c in CONFIGS:
                # fp16 products on two of the shapes, 1 and 8 rows (every DOT config takes one)
                for x16 in (False, True) if n != 200 and m != 3 else (False,):
                    if not _fits(c, m == 1, k, block[1], x16):
                        continue
                    y = torch.full((m, n), float("nan"))
                    _launch(x, values, w.scale, block, y, c, x16)
                    err = ((y.double() - want).abs() / (want.abs() + 1.0)).max().item()
                    assert err < 1e-4 * (1 + want.abs().max().item() / 1e3), (
                        n, k, block, m, c.kwargs, x16, err)  # fmt: skip
                    checked.add((x16, *sorted(c.kwargs.items())))
    splits = {dict(c[1:])["SPLIT_K"] for c in checked}
    dots = sum(c.kwargs["DOT"] for c in CONFIGS)
    assert len(checked) == len(CONFIGS) + dots and splits == {1, 2, 4}, (len(checked), splits)
    print("ok")
    """
)


def test_every_fp8_skinny_config_matches_the_dequantised_product():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
