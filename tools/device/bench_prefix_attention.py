"""Attention of a prefill chunk over a cached prefix (the engine's later chunks of a long cold
prompt, and a cached turn's new tokens): FlashInfer's paged prefill over the 64-token pages,
against gathering the row's K and V pages into a contiguous buffer and running the ragged
kernel over it (causal, queries aligned to the end of the keys, as the paged kernel does).

Each case prints both times (CUDA events, `do_bench` median), the gather's share, the
attention rate and the relative difference between the two outputs; the bound is the causal
attention FLOPs at the matmul rate measured here first.

Usage (device machine, repo root, after `source tools/device/env.sh`):
    python3 tools/device/bench_prefix_attention.py [--cases 9B:30720:2048,27B:6144:2048]
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from ninfer.page import PAGE_SIZE

DEV = torch.device("cuda")
BF16 = torch.bfloat16
HEADS = {"9B": (16, 4), "27B": (24, 4)}
D = 256


def ms(fn) -> float:
    return do_bench(fn, warmup=20, rep=200, return_mode="median")


def case(fi, workspace, model: str, ctx: int, q_len: int, peak: float) -> dict:
    hq, hkv = HEADS[model]
    kv_len = ctx + q_len
    n = -(-kv_len // PAGE_SIZE)
    perm = torch.randperm(2 * n, device=DEV)[:n].to(torch.int32)  # scattered pages of a pool
    cache = torch.randn(2 * n, 2, PAGE_SIZE, hkv, D, device=DEV, dtype=BF16)
    q = torch.randn(q_len, hq, D, device=DEV, dtype=BF16)
    scale = D**-0.5
    i32 = dict(dtype=torch.int32)
    qo = torch.tensor([0, q_len], **i32)
    paged = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    last = torch.tensor([(kv_len - 1) % PAGE_SIZE + 1], **i32)
    paged.plan(qo, torch.tensor([0, n], **i32), perm, last, hq, hkv, D, PAGE_SIZE,
               causal=True, sm_scale=scale, q_data_type=BF16, kv_data_type=BF16)  # fmt: skip
    ragged = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    ragged.plan(qo, torch.tensor([0, kv_len], **i32), hq, hkv, D, causal=True,
                sm_scale=scale, q_data_type=BF16, kv_data_type=BF16)  # fmt: skip
    k_plane, v_plane = cache[:, 0], cache[:, 1]
    idx = perm.long()

    def gather():
        k = torch.index_select(k_plane, 0, idx).view(-1, hkv, D)[:kv_len]
        v = torch.index_select(v_plane, 0, idx).view(-1, hkv, D)[:kv_len]
        return k, v

    run_paged = lambda: paged.run(q, cache)
    run_gathered = lambda: ragged.run(q, *gather())
    a, b = run_paged(), run_gathered()
    err = ((a.float() - b.float()).norm() / a.float().norm()).item()
    t_paged, t_gathered, t_gather = ms(run_paged), ms(run_gathered), ms(gather)
    flops = 4 * hq * D * (q_len * ctx + q_len * (q_len + 1) / 2)
    row = {
        "model": model, "ctx": ctx, "q": q_len, "paged_ms": round(t_paged, 4),
        "gathered_ms": round(t_gathered, 4), "gather_ms": round(t_gather, 4),
        "paged_tflops": round(flops / t_paged / 1e9, 1),
        "gathered_tflops": round(flops / t_gathered / 1e9, 1),
        "bound_ms": round(flops / peak / 1e9, 4), "rel_diff": round(err, 5),
    }  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    import flashinfer as fi

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="9B:6144:2048,9B:30720:2048,9B:24576:8192,27B:30720:2048")
    args = ap.parse_args()
    x = torch.randn(8192, 8192, device=DEV, dtype=BF16)
    peak = 2 * 8192**3 / ms(lambda: x @ x) / 1e9  # TFLOP/s
    print(json.dumps({"matmul_peak_tflops": round(peak, 1)}), flush=True)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=DEV)
    for spec in args.cases.split(","):
        model, ctx, q_len = spec.split(":")
        case(fi, workspace, model, int(ctx), int(q_len), peak)


if __name__ == "__main__":
    main()
