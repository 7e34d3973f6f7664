"""Prefill glue kernels on their own (CUDA events, median of do_bench), at 9B / 27B prefill
shapes, beside the copy bound: SwiGLU (compiled torch vs Triton), the K/V write (index_copy_
vs one Triton launch), and the causal-conv prefill kernel over block shapes.

    python3 tools/device/bench_glue.py [--tokens 8192] [--out bench_glue.json]
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from ninfer.forward import ForwardBatch
from ninfer.ops.cuda import attention, conv, glue
from ninfer.ops.cuda.passmeta import PassMeta
from ninfer.ops.reference.dense import silu_mul_ref
from ninfer.page import PAGE_SIZE

DEV, BF16 = torch.device("cuda"), torch.bfloat16
ROWS: list[dict] = []


def emit(**row) -> None:
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def copy_bw() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    return 2 * a.numel() / (do_bench(lambda: b.copy_(a), return_mode="median") / 1e3)


def bench_silu(tokens: int, inter: int, bw: float, name: str) -> None:
    x = torch.randn(tokens, 2 * inter, dtype=BF16, device=DEV)
    g, u = x.split([inter, inter], dim=1)
    comp = torch.compile(silu_mul_ref, dynamic=True)
    comp(g, u)
    ms_c = do_bench(lambda: comp(g, u), return_mode="median")
    ms_t = do_bench(lambda: glue.silu_mul(g, u), return_mode="median")
    ok = torch.allclose(comp(g, u).float(), glue.silu_mul(g, u).float(), atol=2e-2, rtol=2e-2)
    bound = 3 * tokens * inter * 2 / bw * 1e3
    emit(kind="silu_mul", model=name, tokens=tokens, compiled_ms=round(ms_c, 4),
         triton_ms=round(ms_t, 4), bound_ms=round(bound, 4), same=ok)  # fmt: skip


def bench_write_kv(tokens: int, bw: float) -> None:
    pages = -(-tokens // PAGE_SIZE) + 2
    cache = torch.zeros(pages, 2, PAGE_SIZE, 4, 256, dtype=BF16, device=DEV)
    kv = torch.randn(tokens, 2 * 4 * 256 + 64, dtype=BF16, device=DEV)
    k = kv[:, :1024].view(tokens, 4, 256)
    v = kv[:, 1024:2048].view(tokens, 4, 256)
    slots = torch.randperm(pages * PAGE_SIZE, device=DEV)[:tokens]
    ref = cache.clone()
    flat = ref.view(torch.int16).view(-1, 4, 256)
    rows = slots + (slots // PAGE_SIZE) * PAGE_SIZE

    def old():
        flat.index_copy_(0, rows, k.view(torch.int16))
        flat.index_copy_(0, rows + PAGE_SIZE, v.view(torch.int16))

    def new():
        attention.write_kv(k, v, cache, slots, None, None)

    old()
    new()
    same = torch.equal(cache, ref)
    ms_o = do_bench(old, return_mode="median")
    ms_n = do_bench(new, return_mode="median")
    bound = 4 * tokens * 1024 * 2 / bw * 1e3
    emit(kind="write_kv", tokens=tokens, index_copy_ms=round(ms_o, 4),
         triton_ms=round(ms_n, 4), bound_ms=round(bound, 4), same=same)  # fmt: skip


def bench_conv(tokens: int, channels: int, bw: float) -> None:
    x = torch.randn(tokens, channels, dtype=BF16, device=DEV)
    w = torch.randn(channels, 4, dtype=BF16, device=DEV)
    state = torch.zeros(4, channels, 3, dtype=BF16, device=DEV)
    batch = ForwardBatch(
        input_ids=torch.zeros(tokens, dtype=torch.int64, device=DEV),
        positions=torch.arange(tokens, device=DEV),
        q_lens=[tokens], ctx_lens=[0],
        cu_q=torch.tensor([0, tokens], dtype=torch.int32, device=DEV),
        state_slots=torch.tensor([1], device=DEV),
        block_table=torch.zeros(1, 1, dtype=torch.int32, device=DEV),
        slot_mapping=torch.arange(tokens, device=DEV),
        logits_indices=torch.tensor([tokens - 1], device=DEV),
    )  # fmt: skip
    meta = PassMeta.of(batch.q_lens, batch.ctx_lens, DEV)  # per pass in the engine: untimed
    ref = conv.causal_conv(x, w, state, batch, meta)
    bound = 2 * tokens * channels * 2 / bw * 1e3
    base = (conv.BLOCK_T, conv.BLOCK_C)
    for bt, bc, warps in [(32, 128, 4), (64, 128, 4), (64, 256, 8), (128, 128, 8),
                          (128, 256, 8), (32, 256, 4), (256, 64, 8), (16, 512, 4)]:  # fmt: skip
        conv.BLOCK_T, conv.BLOCK_C, conv.PREFILL_WARPS = bt, bc, warps
        try:
            y = conv.causal_conv(x, w, state, batch, meta)
            same = torch.equal(y, ref)
            ms = do_bench(lambda: conv.causal_conv(x, w, state, batch, meta), return_mode="median")
        except Exception as e:  # noqa: BLE001
            emit(kind="conv", bt=bt, bc=bc, warps=warps, error=repr(e)[:200])
            continue
        emit(kind="conv", tokens=tokens, channels=channels, bt=bt, bc=bc, warps=warps,
             ms=round(ms, 4), bound_ms=round(bound, 4), same=same)  # fmt: skip
    conv.BLOCK_T, conv.BLOCK_C, conv.PREFILL_WARPS = *base, 4


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--out", default="bench_glue.json")
    args = ap.parse_args()
    bw = copy_bw()
    emit(kind="ceiling", copy_TBps=round(bw / 1e12, 3))
    t = args.tokens
    bench_silu(t, 17408, bw, "27B")
    bench_silu(t, 12288, bw, "9B")
    bench_silu(1, 12288, bw, "9B")
    for n in (1, 8, t):
        bench_write_kv(n, bw)
    bench_conv(t, 10240, bw)
    bench_conv(t, 8192, bw)
    with open(args.out, "w") as f:
        json.dump(ROWS, f, indent=1)


if __name__ == "__main__":
    main()
