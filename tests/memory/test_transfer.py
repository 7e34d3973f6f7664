"""Write-through then restore into other pages / slots is bit-identical; batches retire in order.

Runs on the CPU (synchronous copies); the same tests run on CUDA when it is present (pinned
slabs, real streams and events).
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from slab_helpers import slabs_for_pools

from ninfer.memory.streams import Streams
from ninfer.memory.transfer import HostTransfer, Landed

LAYERS = ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 2
LAYERS += ("full_attention",) * 2  # 5 GDN + 3 FA, two FA layers back to back
PAGES, SLOTS = 40, 4
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def make(kv_dtype: torch.dtype, slabs_per_chunk: int, device: str = "cpu", seed: int = 0):
    """Pools of random NaN-free data: kv 3 x [40, 2, 64, 1, 8]; conv [4, 5, 8, 3] bf16;
    ssm [4, 5, 4, 16, 16] fp32. Image 5 x 4144 B: 4 slabs of 6 KiB (bf16), 2 of 12 KiB (fp32)."""
    gen = torch.Generator().manual_seed(seed)
    kv = [
        torch.randn(PAGES, 2, 64, 1, 8, generator=gen).to(kv_dtype).to(device)
        for _ in range(LAYERS.count("full_attention"))
    ]
    conv = torch.randn(SLOTS, 5, 8, 3, generator=gen).to(torch.bfloat16).to(device)
    ssm = torch.randn(SLOTS, 5, 4, 16, 16, generator=gen).to(device)
    page = kv[0][0].numel() * kv[0].element_size()
    slab = 3 * page
    slabs = slabs_for_pools(kv, conv, ssm, 1, max_chunk_bytes=slabs_per_chunk * slab)
    transfer = HostTransfer(slabs, kv, conv, ssm, LAYERS, Streams(torch.device(device)))
    return transfer, kv, conv, ssm


def clones(*tensors):
    return [t.clone() for t in tensors]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def roundtrip(transfer, kv, conv, ssm, src_pages, dst_pages, slabs, src_slot, dst_slot, img):
    """Write src pages + src slot's image through, restore into dst pages / dst slot, check."""
    tail = len(src_pages) // 3  # restore a third of them as tails (prelude), the rest as blocks
    before_kv, before_conv, before_ssm = clones(*kv), conv.clone(), ssm.clone()
    write = transfer.write_through(
        list(zip(src_pages, slabs, strict=True)), [(src_slot, img)], tag="w"
    )
    pairs = list(zip(dst_pages, slabs, strict=True))
    ticket = transfer.restore_slabs(pairs[tail:], pairs[:tail], [(dst_slot, img)], tag="t")
    landed = transfer.drain()
    assert landed == Landed(restores=["t"], writes=["w"]) and transfer.in_flight == 0
    assert ticket.done() and write.done() and ticket.parts[0] == "prelude"
    moved = set(dst_pages)
    for layer, old in zip(kv, before_kv, strict=True):
        for s, d in zip(src_pages, dst_pages, strict=True):
            assert same_bits(layer[d], old[s])
        untouched = [p for p in range(PAGES) if p not in moved]
        assert same_bits(layer[untouched], old[untouched])
    for pool, old in ((conv, before_conv), (ssm, before_ssm)):
        assert same_bits(pool[dst_slot], old[src_slot])
        others = [s for s in range(SLOTS) if s != dst_slot]
        assert same_bits(pool[others], old[others])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("per_chunk", [1, 3, 7, 1000], ids=lambda n: f"chunk{n}")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roundtrip_random_pages_and_slabs(device, kv_dtype, per_chunk, seed):
    transfer, kv, conv, ssm = make(kv_dtype, per_chunk, device, seed)
    rng = random.Random(seed)
    n = 14
    g = transfer.slabs.geometry
    # slabs: a run crossing chunk boundaries plus scattered ones; pages: partly consecutive
    start = rng.randrange(g.num_slabs - 40)
    pool = list(range(start, start + 40))
    slabs = pool[:8] + rng.sample(pool[8:], n - 8)
    img = rng.sample([s for s in range(g.num_slabs) if s not in slabs], g.image_slabs)
    pages = rng.sample(range(PAGES), 2 * n)
    src, dst = sorted(pages[:n]), pages[n:]
    dst[:6] = sorted(dst[:6])
    src_slot, dst_slot = rng.sample(range(SLOTS), 2)
    roundtrip(transfer, kv, conv, ssm, src, dst, slabs, src_slot, dst_slot, img)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), per_chunk=st.integers(1, 9), bf16=st.booleans())
def test_roundtrip_property(data, per_chunk, bf16):
    transfer, kv, conv, ssm = make(torch.bfloat16 if bf16 else torch.float32, per_chunk)
    g = transfer.slabs.geometry
    n = data.draw(st.integers(0, 12))
    ids = data.draw(st.permutations(range(60)))
    slabs, img = list(ids[:n]), list(ids[n : n + g.image_slabs])
    pages = data.draw(st.permutations(range(PAGES)))
    slots = data.draw(st.permutations(range(SLOTS)))
    roundtrip(transfer, kv, conv, ssm, pages[:n], pages[n : 2 * n], slabs, *slots[:2], img)


def test_image_spanning_many_slabs_roundtrips():
    # fp32 pages of 1 KiB, slabs of 3 KiB; image 5 x (2048 + 48) B -> 4 slabs, 2 per chunk
    kv = [torch.randn(8, 2, 64, 1, 2) for _ in range(3)]
    conv = torch.randn(2, 5, 8, 3).to(torch.bfloat16)
    ssm = torch.randn(2, 5, 2, 16, 16)
    slabs = slabs_for_pools(kv, conv, ssm, 1, max_chunk_bytes=2 * 3 * 1024)
    assert slabs.geometry.image_slabs == 4
    transfer = HostTransfer(slabs, kv, conv, ssm, LAYERS, Streams(torch.device("cpu")))
    expect = conv[0].clone(), ssm[0].clone()
    transfer.write_through(images=[(0, [5, 6, 9, 2])])
    ticket = transfer.restore_slabs(images=[(1, [5, 6, 9, 2])])
    assert ticket.parts == ("prelude", 0, 1, 2, 4, 5)
    assert same_bits(conv[1], expect[0]) and same_bits(ssm[1], expect[1])


def test_poll_returns_batches_once_in_issue_order():
    transfer, *_ = make(torch.bfloat16, 3)
    w1 = transfer.write_through([(0, 0)], tag="a")
    w2 = transfer.write_through([(1, 1)], tag="b")
    r1 = transfer.restore_slabs([(5, 0)], tag="r")
    empty = transfer.restore_slabs(tag="e")
    assert empty.parts == () and empty.ncopies == 0 and empty.done()
    landed = transfer.poll()
    assert landed == Landed(restores=["r", "e"], writes=["a", "b"])
    assert all(x.retired for x in (w1, w2, r1)) and transfer.poll() == Landed()
    assert (w1.ncopies, w1.nbytes) == (3, 3 * 2048)  # one copy per full-attention layer
    r1.wait_prelude()  # retired: nothing to wait for
    hook = r1.hook()
    for layer in range(len(LAYERS)):
        hook(layer)
    r1.wait_all()


def test_mismatched_pools_are_rejected():
    transfer, kv, conv, ssm = make(torch.bfloat16, 3)
    streams = Streams(torch.device("cpu"))
    with pytest.raises(ValueError, match="slab geometry"):
        HostTransfer(transfer.slabs, kv[:2], conv, ssm, LAYERS, streams)
    with pytest.raises(ValueError, match="contiguous"):
        HostTransfer(transfer.slabs, kv, conv.transpose(2, 3), ssm, LAYERS, streams)
    with pytest.raises(ValueError, match="image size"):
        HostTransfer(transfer.slabs, kv, conv[:, :4].contiguous(), ssm, LAYERS, streams)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_compute_stream_reads_after_layer_events():
    transfer, kv, conv, ssm = make(torch.bfloat16, 7, "cuda")
    assert transfer.slabs.pinned and transfer.slabs.chunks[0].is_pinned()
    g = transfer.slabs.geometry
    want = [layer[:10].clone() for layer in kv], ssm[0].clone()
    transfer.write_through([(p, p) for p in range(10)], [(0, list(range(20, 20 + g.image_slabs)))])
    transfer.drain()
    for layer in kv:
        layer[20:30].zero_()
    ssm[3].zero_()
    ticket = transfer.restore_slabs(
        [(20 + p, p) for p in range(10)], images=[(3, range(20, 24))], tag="r"
    )
    compute = transfer.streams.compute
    seen = []
    for layer, kind in enumerate(LAYERS):
        ticket.wait_layer(layer, compute)  # what ForwardBatch.before_layer does
        if kind == "full_attention":
            seen.append(kv[LAYERS[: layer + 1].count(kind) - 1][20:30].clone())
    ssm_seen = ssm[3].clone()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(seen, want[0], strict=True))
    assert torch.equal(ssm_seen, want[1])
    assert transfer.poll().restores == ["r"] and ticket.retired
