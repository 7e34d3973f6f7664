"""Attention of a speculative verify step: K+1 query tokens a row over each row's cached
context, causal among themselves, inside a CUDA graph. Three ways on FlashInfer:

- fa3: the paged prefill wrapper as the verify graphs plan it (`backend="auto"` picks fa3 on
  sm_90 for a bf16 cache). fa3 does not split a row's KV over several CTAs, so a row's few
  queries walk the whole context on one CTA per KV head;
- fa2: the same wrapper with `backend="fa2"`, whose plan splits long contexts over CTAs and
  merges the partial states;
- decode: the decode wrapper (tensor cores) over B x (K+1) rows, row (b, j) attending to the
  first ctx + j + 1 tokens of lane b's pages, which is the causal mask (it splits KV too).

Each case prints the medians of the chosen ways (`do_bench_cudagraph`), the bound (the K/V
bytes read once at the copy rate measured here first) and each output's largest difference
from the float32 attention over the gathered pages. A way that faults poisons the CUDA context,
so run one way per process (`--variants fa2`) to learn which one did.

Usage (device machine, repo root, after `source tools/device/env.sh`):
    python3 tools/device/bench_verify_attention.py [--models 9B,27B] [--batches 1,4,8]
        [--contexts 1024,8192,32768] [--queries 4] [--variants fa3,fa2,decode] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench_cudagraph

from ninfer.page import PAGE_SIZE

DEV = torch.device("cuda")
BF16 = torch.bfloat16
I32 = dict(dtype=torch.int32, device=DEV)
HEADS = {"9B": (16, 4), "27B": (24, 4), "35B-A3B": (16, 2)}
D = 256


def ms(fn) -> float:
    return do_bench_cudagraph(fn, rep=100, return_mode="median")


def copy_rate() -> float:
    """Bytes per ms of a 1 GiB device copy."""
    a = torch.empty(1 << 29, dtype=torch.float16, device=DEV)
    b = torch.empty_like(a)
    return 2 * a.numel() * a.element_size() / ms(lambda: b.copy_(a))


def reference(q, cache, pool, ctx: int, nq: int, hkv: int, scale: float) -> torch.Tensor:
    """float32 causal attention of each row's nq queries over its ctx + nq tokens."""
    bs, hq = pool.shape[0], q.shape[1]
    out = torch.empty(q.shape, dtype=torch.float32, device=DEV)
    for b in range(bs):
        kv = cache[pool[b].long()].float()  # [pages, 2, 64, hkv, D]
        k = kv[:, 0].reshape(-1, hkv, D)[: ctx + nq].repeat_interleave(hq // hkv, dim=1)
        v = kv[:, 1].reshape(-1, hkv, D)[: ctx + nq].repeat_interleave(hq // hkv, dim=1)
        qb = q[b * nq : (b + 1) * nq].float()
        s = torch.einsum("qhd,khd->hqk", qb, k) * scale
        keys = torch.arange(ctx + nq, device=DEV)
        s.masked_fill_(keys[None, None, :] > (ctx + torch.arange(nq, device=DEV))[None, :, None],
                       float("-inf"))  # fmt: skip
        out[b * nq : (b + 1) * nq] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v)
    return out


def case(fi, ws, model: str, bs: int, ctx: int, nq: int, rate: float, variants) -> dict:
    hq, hkv = HEADS[model]
    kv_len = ctx + nq  # the verify step's K/V are written to the pages before attention
    n = -(-kv_len // PAGE_SIZE)
    pool = torch.randperm(2 * n * bs, device=DEV)[: n * bs].to(torch.int32).view(bs, n)
    cache = torch.randn(2 * n * bs, 2, PAGE_SIZE, hkv, D, device=DEV, dtype=BF16)
    q = torch.randn(bs * nq, hq, D, device=DEV, dtype=BF16)
    scale = D**-0.5
    dt = dict(q_data_type=BF16, kv_data_type=BF16, sm_scale=scale)
    last = (kv_len - 1) % PAGE_SIZE + 1

    def prefill(backend):
        w = fi.BatchPrefillWithPagedKVCacheWrapper(
            ws, "NHD", use_cuda_graph=True, backend=backend,
            qo_indptr_buf=torch.zeros(bs + 1, **I32),
            paged_kv_indptr_buf=torch.zeros(bs + 1, **I32),
            paged_kv_indices_buf=torch.zeros(n * bs, **I32),
            paged_kv_last_page_len_buf=torch.ones(bs, **I32),
        )  # fmt: skip
        w.plan(
            torch.arange(0, (bs + 1) * nq, nq, dtype=torch.int32),
            torch.arange(0, (bs + 1) * n, n, dtype=torch.int32), pool.flatten(),
            torch.full((bs,), last, dtype=torch.int32), hq, hkv, D, PAGE_SIZE, causal=True,
            max_token_per_sequence=nq, max_sequence_kv=kv_len, **dt,
        )  # fmt: skip
        return lambda: w.run(q, cache)

    def decode():
        lens = [ctx + j + 1 for _ in range(bs) for j in range(nq)]
        pages = [-(-t // PAGE_SIZE) for t in lens]
        idx = torch.cat([pool[r // nq, :p] for r, p in enumerate(pages)])
        indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
        w = fi.BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=torch.zeros(bs * nq + 1, **I32),
            paged_kv_indices_buffer=torch.zeros(idx.numel(), **I32),
            paged_kv_last_page_len_buffer=torch.ones(bs * nq, **I32),
        )  # fmt: skip
        last_lens = torch.tensor([(t - 1) % PAGE_SIZE + 1 for t in lens], dtype=torch.int32)
        w.plan(indptr, idx, last_lens, hq, hkv, D, PAGE_SIZE, **dt)
        return lambda: w.run(q, cache)

    make = {"fa3": lambda: prefill("fa3"), "fa2": lambda: prefill("fa2"), "decode": decode}
    ref = reference(q, cache, pool, ctx, nq, hkv, scale)
    out = {"model": model, "batch": bs, "context": ctx, "queries": nq}
    kv_bytes = bs * kv_len * hkv * D * 2 * 2
    out["bound_ms"] = kv_bytes / rate
    for name in variants:
        fn = make[name]()
        out[f"{name}_maxdiff"] = (fn().float() - ref).abs().max().item()
        out[f"{name}_ms"] = ms(fn)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="9B,27B")
    p.add_argument("--batches", default="1,4,8")
    p.add_argument("--contexts", default="1024,8192,32768")
    p.add_argument("--queries", type=int, default=4, help="K + 1 query tokens a row")
    p.add_argument("--variants", default="fa3,fa2,decode")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    variants = args.variants.split(",")
    import flashinfer as fi

    ws = torch.zeros(512 << 20, dtype=torch.uint8, device=DEV)
    rate = copy_rate()
    print(f"copy rate {rate / 1e9:.2f} TB/s")
    print(
        f"{'case':>22} {'bound ms':>8} "
        + " ".join(f"{v + ' ms':>9} {'maxdiff':>7}" for v in variants)
    )
    rows = []
    for model in args.models.split(","):
        for bs in map(int, args.batches.split(",")):
            for ctx in map(int, args.contexts.split(",")):
                r = case(fi, ws, model, bs, ctx, args.queries, rate, variants)
                rows.append(r)
                cells = " ".join(f"{r[v + '_ms']:9.4f} {r[v + '_maxdiff']:7.1e}" for v in variants)
                print(f"{model:>8} b{bs} ctx {ctx:>6} {r['bound_ms']:8.4f} {cells}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_rate_bytes_per_ms": rate, "cases": rows}, f, indent=1)


if __name__ == "__main__":
    main()
