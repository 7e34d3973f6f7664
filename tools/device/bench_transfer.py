"""Host-tier copy bandwidth on a CUDA device, at Qwen3.5-27B sizes (run on the H200, < 60 s).

    python tools/device/bench_transfer.py

27B geometry: 64 layers (every 4th full attention): 16 FA layers x [pages, 2, 64, 4, 256] bf16,
i.e. 256 KiB per layer page and a 4 MiB block bundle per slab; a state image of 48 GDN layers x
(3 MiB fp32 recurrent + 60 KiB bf16 conv) = 147 MiB (37 slabs). Measures, each verified byte for
byte after the copy (write-through from pages A, restore into pages B != A, compare):

  * write-through (D2H) and restore (H2D) of a 32k- and a 128k-token history (512 / 2048
    blocks) with consecutive pages and slabs (16 copies per run), and of a 32k history with
    scattered slabs (one 256 KiB copy per block and layer: what coalescing saves);
  * the same for one state image (1-2 copies per GDN layer);
  * per-layer restore event times (ms from the batch start), and overlap evidence: a simulated
    first prefill pass (a matmul per layer, each waiting on its layer's event) run alone, the
    restore alone, and both together.

Prints GB/s beside the 55 GB/s pinned copy bound measured on this machine (ADAPTATION.md).
Only torch, ninfer.memory and the cache's slab geometry are used.
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from ninfer.cache.host_pool import plan_slab_geometry
from ninfer.memory.host_slabs import HostSlabs
from ninfer.memory.streams import Streams
from ninfer.memory.transfer import HostTransfer

BOUND_GBS = 55.0
LAYERS = ("linear_attention",) * 3 + ("full_attention",)
LAYERS *= 16
BLOCKS_128K, BLOCKS_32K = 2048, 512


def setup(device: torch.device):
    pages = 2 * BLOCKS_128K + 8
    kv = [torch.empty(pages, 2, 64, 4, 256, dtype=torch.bfloat16, device=device) for _ in range(16)]
    for layer in kv:
        layer.view(torch.int16).random_(-(2**15), 2**15 - 1)
    conv = torch.randn(2, 48, 10240, 3, device=device).to(torch.bfloat16)
    ssm = torch.randn(2, 48, 48, 128, 128, device=device)
    host_mib = (BLOCKS_128K + 40) * 4
    t0 = time.perf_counter()
    page = kv[0][0].numel() * kv[0].element_size()
    image = conv[0].numel() * conv.element_size() + ssm[0].numel() * ssm.element_size()
    slabs = HostSlabs(plan_slab_geometry(host_mib, len(kv), page, image), pin=device.type == "cuda")
    g = slabs.geometry
    print(
        f"host tier: {host_mib} MiB pinned in {g.num_chunks} chunk(s) "
        f"({time.perf_counter() - t0:.1f} s), slab {g.slab_bytes >> 20} MiB, "
        f"{g.num_slabs} slabs, image {g.image_bytes / 2**20:.1f} MiB = {g.image_slabs} slabs"
    )
    streams = Streams(device)
    transfer = HostTransfer(slabs, kv, conv, ssm, LAYERS, streams, timing=True)
    return transfer, streams, kv, conv, ssm


def timed_write(transfer: HostTransfer, streams: Streams, **batch) -> tuple[float, int]:
    """(ms, copies) of one write-through, measured on the transfer stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(streams.transfer)
    handle = transfer.write_through(**batch)
    end.record(streams.transfer)
    transfer.drain()
    return start.elapsed_time(end), handle.ncopies


def gbs(nbytes: int, ms: float) -> str:
    rate = nbytes / ms / 1e6
    return f"{rate:6.1f} GB/s ({100 * rate / BOUND_GBS:3.0f}% of {BOUND_GBS:.0f})"


def bench_kv(transfer, streams, kv, blocks: int, scattered: bool, reps: int = 3) -> None:
    g = transfer.slabs.geometry
    slabs = list(range(blocks))
    if scattered:
        slabs = random.Random(0).sample(range(g.num_slabs - g.image_slabs), blocks)
    src = list(range(blocks))
    dst = [BLOCKS_128K + 8 + p for p in range(blocks)]
    nbytes = blocks * g.slab_bytes
    w_ms, r_ms, copies, issue = [], [], 0, []
    for _ in range(reps + 1):
        ms, copies = timed_write(transfer, streams, pages=list(zip(src, slabs, strict=True)))
        w_ms.append(ms)
        for layer in kv:
            layer[dst[0] : dst[-1] + 1].fill_(float("nan"))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ticket = transfer.restore_slabs(pages=list(zip(dst, slabs, strict=True)))
        issue.append((time.perf_counter() - t0) * 1e3)
        transfer.drain()
        r_ms.append(ticket.elapsed_ms()[ticket.parts[-1]])
        for layer in kv:
            assert torch.equal(layer[dst].view(torch.int16), layer[src].view(torch.int16))
    name = f"{blocks * 64 // 1024}k tokens {'scattered' if scattered else 'runs':9s}"
    w, r = statistics.median(w_ms[1:]), statistics.median(r_ms[1:])
    print(f"KV {name} {nbytes / 2**30:.2f} GiB, {copies} copies each way (verified)")
    print(f"   D2H write-through {w:7.1f} ms  {gbs(nbytes, w)}")
    print(f"   H2D restore       {r:7.1f} ms  {gbs(nbytes, r)}   issue {min(issue[1:]):.1f} ms CPU")


def bench_image(transfer, streams, conv, ssm, reps: int = 3) -> None:
    g = transfer.slabs.geometry
    img = list(range(g.num_slabs - g.image_slabs, g.num_slabs))
    w_ms, r_ms = [], []
    for _ in range(reps + 1):
        ms, copies = timed_write(transfer, streams, images=[(0, img)])
        w_ms.append(ms)
        conv[1].fill_(float("nan"))
        ssm[1].fill_(float("nan"))
        ticket = transfer.restore_slabs(images=[(1, img)])
        transfer.drain()
        r_ms.append(ticket.elapsed_ms()[ticket.parts[-1]])
        assert torch.equal(conv[1].view(torch.int16), conv[0].view(torch.int16))
        assert torch.equal(ssm[1].view(torch.int32), ssm[0].view(torch.int32))
    w, r = statistics.median(w_ms[1:]), statistics.median(r_ms[1:])
    print(f"image {g.image_bytes / 2**20:.1f} MiB: {copies} copies D2H, {ticket.ncopies} H2D")
    print(f"   D2H write-through {w:7.1f} ms  {gbs(g.image_bytes, w)}")
    print(f"   H2D restore       {r:7.1f} ms  {gbs(g.image_bytes, r)}")


def bench_overlap(transfer, streams, blocks: int) -> None:
    """A fake first prefill pass: per layer a matmul after wait_layer; alone / restore / both."""
    g = transfer.slabs.geometry
    img = list(range(g.num_slabs - g.image_slabs, g.num_slabs))
    pages = [(BLOCKS_128K + 8 + p, p) for p in range(blocks)]
    a = torch.randn(8192, 5120, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(5120, 5120, device="cuda", dtype=torch.bfloat16)
    compute = streams.compute

    def run(restore: bool, prefill: bool) -> tuple[float, object]:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(compute)
        ticket = transfer.restore_slabs(pages=pages, images=[(1, img)]) if restore else None
        if prefill:
            for layer in range(len(LAYERS)):
                if ticket is not None:
                    ticket.wait_layer(layer, compute)
                torch.mm(a, w)
        if ticket is not None:
            ticket.wait_all(compute)
        end.record(compute)
        torch.cuda.synchronize()
        transfer.poll()
        return start.elapsed_time(end), ticket

    for _ in range(2):
        t_c, _ = run(False, True)
        t_r, ticket = run(True, False)
        t_o, _ = run(True, True)
    print(f"overlap, {blocks * 64 // 1024}k-token history + image, 64-layer fake prefill:")
    print(f"   prefill alone {t_c:.1f} ms, restore alone {t_r:.1f} ms, sum {t_c + t_r:.1f} ms")
    print(f"   together      {t_o:.1f} ms (ideal max {max(t_c, t_r):.1f} ms)")
    times = ticket.elapsed_ms()
    shown = ["prelude", *[p for p in ticket.parts[1:] if p % 8 in (0, 3)]]
    print("   restore events (ms from start): " + ", ".join(f"{p}:{times[p]:.1f}" for p in shown))


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench_transfer needs a CUDA device")
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    t0 = time.perf_counter()
    transfer, streams, kv, conv, ssm = setup(device)
    bench_kv(transfer, streams, kv, BLOCKS_32K, scattered=False)
    bench_kv(transfer, streams, kv, BLOCKS_128K, scattered=False)
    bench_kv(transfer, streams, kv, BLOCKS_32K, scattered=True, reps=1)
    bench_image(transfer, streams, conv, ssm)
    bench_overlap(transfer, streams, BLOCKS_32K)
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
