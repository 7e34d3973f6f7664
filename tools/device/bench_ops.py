"""Times `CudaOps` at Qwen3.5 9B / 27B layer shapes and the copies the cache tiers need (H200).

Each figure is a median over repeats after warm-up (CUDA-event timing via
`triton.testing.do_bench`, host timer plus synchronize for copies that block the CPU), printed
beside its bound: bf16 matrix rate and device copy bandwidth measured here first, PCIe for host
copies. `--warm NAME` only runs one op once (JIT compile / autotune), for parallel warm-up.

Usage (device machine, repo root): python3 tools/device/bench_ops.py [--out bench.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from triton.testing import do_bench

from ninfer.forward import ForwardBatch
from ninfer.ops.cuda import CudaOps
from ninfer.page import PAGE_SIZE

DEV = torch.device("cuda")
BF16 = torch.bfloat16
GIB = 1 << 30
SHAPES = {"9B": (16, 4, 32), "27B": (24, 4, 48)}  # attention q / kv heads, GDN value heads
HK, DK, HD, CONV_K = 16, 128, 256, 4
RESULTS: list[dict] = []


def report(name: str, ms: float, bound_ms: float | None = None, **extra) -> None:
    row = {"name": name, "ms": round(ms, 4), **extra}
    if bound_ms:
        row["bound_ms"], row["of_bound"] = round(bound_ms, 4), round(bound_ms / ms, 3)
    RESULTS.append(row)
    print(json.dumps(row), flush=True)


def gpu_ms(fn) -> float:
    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def graph_ms(fn) -> float:
    """Median time of one replay of `fn` captured in a CUDA graph (decode runs that way)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as e:  # reported, so that one op that cannot be captured shows up
        print(f"capture failed: {e}", flush=True)
        return float("nan")
    return gpu_ms(graph.replay)


def host_ms(fn, reps: int = 10) -> float:
    times = []
    for _ in range(reps + 2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[2:])


def batch(rows: list[tuple[int, int]]) -> ForwardBatch:
    """Rows (ctx_len, q_len) on consecutive pages, slots 0..R-1."""
    table, slot_map, page = [], [], 1
    for c, q in rows:
        n = (c + q + PAGE_SIZE - 1) // PAGE_SIZE
        table.append(list(range(page, page + n)))
        slot_map += [(page + p // PAGE_SIZE) * PAGE_SIZE + p % PAGE_SIZE for p in range(c, c + q)]
        page += n
    width = max(map(len, table))
    cu = [0]
    for _, q in rows:
        cu.append(cu[-1] + q)
    t = torch.tensor(slot_map, device=DEV)
    return ForwardBatch(
        input_ids=torch.zeros_like(t),
        positions=torch.zeros_like(t),
        q_lens=[q for _, q in rows],
        ctx_lens=[c for c, _ in rows],
        cu_q=torch.tensor(cu, dtype=torch.int32, device=DEV),
        state_slots=torch.arange(len(rows), device=DEV),
        block_table=torch.tensor([r + [0] * (width - len(r)) for r in table], device=DEV).int(),
        slot_mapping=t,
        logits_indices=t[:1],
    )


def ceilings() -> tuple[float, float]:
    """Measured device copy bandwidth (read + write, bytes/ms) and bf16 matmul rate (FLOP/ms)."""
    src = torch.empty(2 * GIB, dtype=torch.uint8, device=DEV).random_()
    dst = torch.empty_like(src)
    copy_ms = gpu_ms(lambda: dst.copy_(src))
    report("ceiling d2d copy 2 GiB", copy_ms, gb_s=round(4 * GIB / copy_ms / 1e6, 1))
    x, y = (torch.randn(8192, 8192, device=DEV, dtype=BF16) for _ in "xy")
    mm_ms = gpu_ms(lambda: x @ y)
    report("ceiling bf16 matmul 8192^3", mm_ms, tflops=round(2 * 8192**3 / mm_ms / 1e9, 1))
    return 4 * GIB / copy_ms, 2 * 8192**3 / mm_ms


def bench_attention(ops, model: str, rows, kv_dtype, bw: float, flops: float, warm=False):
    hq, hkv, _ = SHAPES[model]
    b = batch(rows)
    n_pages = int(b.block_table.max()) + 1
    kv = torch.randn(n_pages, 2, PAGE_SIZE, hkv, HD, device=DEV).to(kv_dtype)
    q = torch.randn(b.num_tokens, hq, HD, device=DEV, dtype=BF16)
    k, v = (torch.randn(b.num_tokens, hkv, HD, device=DEV, dtype=BF16) for _ in "kv")
    sc = (1.0, 1.0) if kv_dtype != BF16 else (None, None)
    fn = lambda: ops.attention(q, k, v, kv, b, HD**-0.5, *sc)
    fn()
    if warm:
        return
    ms = gpu_ms(fn)
    pairs = sum(q_ * c + q_ * (q_ + 1) / 2 for c, q_ in rows)  # causal (query, key) pairs
    kv_bytes = sum(c + q_ for c, q_ in rows) * 2 * hkv * HD * kv.element_size()
    name = f"attention {model} {str(kv_dtype)[6:]} rows={rows[0]}x{len(rows)}"
    if b.is_decode:
        report(name + " eager", ms, kv_bytes / bw, gb_s=round(kv_bytes / ms / 1e6, 1))
        ms = graph_ms(fn)
        report(name + " graph", ms, kv_bytes / bw, gb_s=round(kv_bytes / ms / 1e6, 1))
    else:
        fl = 4 * hq * HD * pairs
        report(name, ms, fl / flops, tflops=round(fl / ms / 1e9, 1))


def gdn_inputs(t: int, hv: int):
    q, k = (torch.randn(t, HK, DK, device=DEV, dtype=BF16) for _ in "qk")
    v = torch.randn(t, hv, DK, device=DEV, dtype=BF16)
    g = -torch.rand(t, hv, device=DEV)
    beta = torch.rand(t, hv, device=DEV).to(BF16)
    return q, k, v, g, beta


def bench_gdn(ops, model: str, rows, bw: float, warm=False):
    hv = SHAPES[model][2]
    b = batch(rows)
    state = torch.randn(len(rows) + 2, 3, hv, DK, DK, device=DEV)[:, 1]  # a strided layer view
    x = gdn_inputs(b.num_tokens, hv)
    fn = lambda: ops.gdn(*x, state, b, DK**-0.5)
    fn()
    if warm:
        return
    ms = gpu_ms(fn)
    state_bytes = len(rows) * hv * DK * DK * 4 * 2
    io_bytes = b.num_tokens * (2 * HK + 2 * hv) * DK * 2
    name = f"gdn {model} rows={rows[0]}x{len(rows)}"
    report(name, ms, (state_bytes + io_bytes) / bw, tok_s=round(b.num_tokens / ms * 1e3))
    if b.is_decode:  # graph replay; and the alternative: fla's recurrent + gather/scatter
        report(name + " graph", graph_ms(fn), (state_bytes + io_bytes) / bw)
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

        def fla_step():
            h0 = state[b.state_slots]
            q, k, v, g, beta = (t[:, None] for t in x)  # [R, 1, ...]: R sequences of 1 token
            o, ht = fused_recurrent_gated_delta_rule(
                q, k, v, g=g, beta=beta, scale=DK**-0.5, initial_state=h0,
                output_final_state=True, use_qk_l2norm_in_kernel=True,
            )  # fmt: skip
            state[b.state_slots] = ht
            return o

        report(name + " fla recurrent + gather/scatter, graph", graph_ms(fla_step))


def bench_conv(ops, model: str, rows, bw: float):
    channels = 2 * HK * DK + SHAPES[model][2] * DK
    b = batch(rows)
    x = torch.randn(b.num_tokens, channels, device=DEV, dtype=BF16)
    w = torch.randn(channels, CONV_K, device=DEV, dtype=BF16)
    state = torch.randn(len(rows), channels, CONV_K - 1, device=DEV, dtype=BF16)
    fn = lambda: ops.causal_conv(x, w, state, b)
    ms = graph_ms(fn) if b.is_decode else gpu_ms(fn)
    report(f"conv {model} rows={rows[0]}x{len(rows)}", ms, 2 * x.numel() * 2 / bw)


def bench_copies(bw: float, pcie: float = 55e6):
    # 27B state image: 48 GDN layers x (48 x 128 x 128 fp32 + conv 10240 x 3 bf16), slot-major
    ssm = torch.randn(2, 48, 48, DK, DK, device=DEV)
    conv = torch.randn(2, 48, 2 * HK * DK + 48 * DK, CONV_K - 1, device=DEV, dtype=BF16)
    nbytes = ssm[0].nbytes + conv[0].nbytes
    ms = gpu_ms(lambda: (ssm[1].copy_(ssm[0]), conv[1].copy_(conv[0])))
    report("d2d 27B state image (2 copy_)", ms, 2 * nbytes / bw, mib=nbytes >> 20)
    for mib in (64, 256, 1024):
        host = torch.randn(mib << 18).pin_memory()
        dev = torch.empty_like(host, device=DEV)
        ms = host_ms(lambda h=host, d=dev: d.copy_(h, non_blocking=True))
        report(f"h2d pinned contiguous {mib} MiB", ms, host.nbytes / pcie, gb_s=gbs(host, ms))
        ms = host_ms(lambda h=host, d=dev: h.copy_(d, non_blocking=True))
        report(f"d2h pinned contiguous {mib} MiB", ms, host.nbytes / pcie, gb_s=gbs(host, ms))
    slab_run()


def gbs(t: torch.Tensor, ms: float) -> float:
    return round(t.nbytes / ms / 1e6, 1)


def slab_run(n_slabs: int = 64, layers: int = 16, page: int = 2 * PAGE_SIZE * 4 * HD * 2):
    """One layer's pages (27B bf16: 256 KiB) out of a run of slab-major host slabs (16 layers
    each, 4 MiB) into consecutive device pages: three ways."""
    from cuda.bindings import runtime as rt

    host = torch.randint(0, 255, (n_slabs, layers, page), dtype=torch.uint8).pin_memory()
    src = host[:, 3]  # strided: n_slabs x page, pitch layers * page
    dst = torch.empty(n_slabs, page, dtype=torch.uint8, device=DEV)
    kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice

    def memcpy2d():
        stream = torch.cuda.current_stream().cuda_stream
        (err,) = rt.cudaMemcpy2DAsync(
            dst.data_ptr(), page, src.data_ptr(), layers * page, page, n_slabs, kind, stream
        )
        assert err == rt.cudaError_t.cudaSuccess, err

    def per_page():
        for i in range(n_slabs):
            dst[i].copy_(src[i], non_blocking=True)

    for name, fn in (("cudaMemcpy2DAsync", memcpy2d), ("copy_ per page", per_page)):
        dst.zero_()
        ms = host_ms(fn)
        assert torch.equal(dst.cpu(), src), name
        report(
            f"h2d slab run layer ({n_slabs} x 256 KiB) {name}", ms, src[0].nbytes * n_slabs / 55e6
        )
    ms = host_ms(lambda: dst.copy_(src, non_blocking=True), reps=3)
    report(f"h2d slab run layer ({n_slabs} x 256 KiB) copy_ strided view", ms)


WARM = {
    "prefill-bf16": lambda o: bench_attention(o, "27B", [(0, 256)], BF16, 1, 1, warm=True),
    "prefill-fp8": lambda o: bench_attention(o, "27B", [(0, 256)], torch.float8_e4m3fn, 1, 1, True),
    "decode-bf16": lambda o: bench_attention(o, "27B", [(100, 1)] * 2, BF16, 1, 1, warm=True),
    "decode-fp8": lambda o: bench_attention(
        o, "27B", [(100, 1)] * 2, torch.float8_e4m3fn, 1, 1, True
    ),
    "gdn-27B": lambda o: bench_gdn(o, "27B", [(0, 1000)], 1, warm=True),
    "gdn-9B": lambda o: bench_gdn(o, "9B", [(0, 1000)], 1, warm=True),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--warm", choices=sorted(WARM))
    p.add_argument("--out", help="write all figures as JSON here")
    p.add_argument("--sections", default="attention,gdn,conv,copies", help="comma-separated")
    args = p.parse_args()
    ops = CudaOps(DEV)
    if args.warm:
        WARM[args.warm](ops)
        torch.cuda.synchronize()
        return
    sections = args.sections.split(",")
    bw, flops = ceilings()
    for model in SHAPES:
        if "attention" in sections:
            for rows in ([(0, 8192)], [(6144, 2048)], [(0, 2048)] * 4):
                for kv_dtype in (BF16, torch.float8_e4m3fn):
                    bench_attention(ops, model, rows, kv_dtype, bw, flops)
            for rows in ([(4096, 1)], [(4096, 1)] * 8, [(32768, 1)] * 8):
                for kv_dtype in (BF16, torch.float8_e4m3fn):
                    bench_attention(ops, model, rows, kv_dtype, bw, flops)
        if "gdn" in sections:
            for rows in ([(0, 8192)], [(1024, 1024)] * 8, [(100, 1)], [(100, 1)] * 8):
                bench_gdn(ops, model, rows, bw)
        if "conv" in sections:
            for rows in ([(0, 8192)], [(100, 1)], [(100, 1)] * 8):
                bench_conv(ops, model, rows, bw)
    if "copies" in sections:
        bench_copies(bw)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(RESULTS, f, indent=1)


if __name__ == "__main__":
    main()
