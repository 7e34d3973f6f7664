"""GPU tests: `CudaOps` against `ReferenceOps` on random ragged batches.

Batches mix fresh prefill rows, prefill chunks continuing a cached context (start positions
crossing pages) and decode rows, over shuffled page ids and state slots. Pools are layer views
of slot-major pools (strided), and every slot or page the batch does not own is poisoned with
NaN and must stay bit-identical. Errors are ||out - ref|| / ||ref||. Skipped without CUDA or
without flashinfer / fla / triton.
"""

from __future__ import annotations

import random

import pytest
import torch

from ninfer.forward import ForwardBatch
from ninfer.ops.reference import ReferenceOps
from ninfer.page import PAGE_SIZE

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
for _mod in ("triton", "flashinfer", "fla"):
    pytest.importorskip(_mod)

from ninfer.ops.choices import OpChoices  # noqa: E402
from ninfer.ops.cuda import CudaOps  # noqa: E402

DEV = torch.device("cuda")
MIXED = ([(0, 130), (70, 100), (300, 1), (64, 1), (5, 3), (0, 1)], "mixed")
DECODE = ([(200, 1), (64, 1), (63, 1), (1000, 1), (1, 1)], "decode")
FRESH = ([(0, 130), (0, 64), (0, 1), (0, 300), (0, 65)], "fresh")  # a cold prompt's pass
BATCHES = [pytest.param(rows, id=name) for rows, name in (MIXED, DECODE)]
ATTENTION_BATCHES = [pytest.param(rows, id=name) for rows, name in (MIXED, DECODE, FRESH)]


@pytest.fixture(scope="module")
def ops() -> CudaOps:
    return CudaOps(DEV)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert not out.isnan().any(), "NaN in output"
    return ((out - ref).norm() / ref.norm()).item()


def make_batch(rows: list[tuple[int, int]], num_pages: int, num_slots: int) -> ForwardBatch:
    """rows: (ctx_len, q_len) each; distinct shuffled pages and slots (page 0 left unused)."""
    rng = random.Random(torch.randint(1 << 30, ()).item())
    pages, slots = list(range(1, num_pages)), list(range(num_slots))
    rng.shuffle(pages)
    rng.shuffle(slots)
    n_pages = [(c + q + PAGE_SIZE - 1) // PAGE_SIZE for c, q in rows]
    table = torch.zeros(len(rows), max(n_pages), dtype=torch.int32)
    positions, slot_map = [], []
    for r, ((c, q), n) in enumerate(zip(rows, n_pages, strict=True)):
        table[r, :n] = torch.tensor([pages.pop() for _ in range(n)], dtype=torch.int32)
        positions += range(c, c + q)
        slot_map += [
            int(table[r, p // PAGE_SIZE]) * PAGE_SIZE + p % PAGE_SIZE for p in range(c, c + q)
        ]
    cu = torch.tensor([0, *torch.tensor([q for _, q in rows]).cumsum(0).tolist()])
    t = torch.tensor(positions)
    return ForwardBatch(
        input_ids=torch.zeros_like(t, device=DEV),
        positions=t.to(DEV),
        q_lens=[q for _, q in rows],
        ctx_lens=[c for c, _ in rows],
        cu_q=cu.to(DEV, torch.int32),
        state_slots=torch.tensor([slots.pop() for _ in rows], device=DEV),
        block_table=table.to(DEV),
        slot_mapping=torch.tensor(slot_map, device=DEV),
        logits_indices=torch.arange(len(positions), device=DEV),
    )


def owned_pages(batch: ForwardBatch, num_pages: int) -> torch.Tensor:
    """Mask [num_pages] of the pages the batch's rows own."""
    mask = torch.zeros(num_pages, dtype=torch.bool, device=DEV)
    for r, (c, q) in enumerate(zip(batch.ctx_lens, batch.q_lens, strict=True)):
        mask[batch.block_table[r, : (c + q + PAGE_SIZE - 1) // PAGE_SIZE].long()] = True
    return mask


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
@pytest.mark.parametrize("rows", ATTENTION_BATCHES)
def test_attention_matches_reference(ops, rows, kv_dtype) -> None:
    """Paged decode and prefill, and the ragged prefill of an all-fresh bf16 pass (over the
    pass's own k, v; the pages are written all the same), against the reference."""
    hq, hkv, dim, num_pages, layers = 24, 4, 256, 64, 2
    batch = make_batch(rows, num_pages, 16)
    fp8 = kv_dtype == torch.float8_e4m3fn
    k_scale, v_scale = (0.5, 2.0) if fp8 else (None, None)
    tol = 3e-2 if fp8 else 1e-2
    owned = owned_pages(batch, num_pages)
    ragged = ops.attention_planner.ragged_passes
    for _ in range(layers):  # the second layer reuses the plan
        q = torch.randn(batch.num_tokens, hq, dim, device=DEV, dtype=torch.bfloat16)
        k, v = (
            torch.randn(batch.num_tokens, hkv, dim, device=DEV, dtype=torch.bfloat16) for _ in "kv"
        )
        cache = torch.randn(num_pages, 2, PAGE_SIZE, hkv, dim, device=DEV)
        cache[~owned] = float("nan")  # a read of a page the row does not own shows up
        cache = cache.to(kv_dtype)
        ref_cache = cache.clone()
        out = ops.attention(q, k, v, cache, batch, dim**-0.5, k_scale, v_scale)
        ref = ReferenceOps().attention(q, k, v, ref_cache, batch, dim**-0.5, k_scale, v_scale)
        assert out.shape == ref.shape and out.dtype == q.dtype
        assert rel_err(out, ref) < tol
        assert torch.equal(cache.view(torch.uint8), ref_cache.view(torch.uint8))
    fresh_bf16 = not any(batch.ctx_lens) and not fp8
    assert ops.attention_planner.ragged_passes - ragged == (1 if fresh_bf16 else 0)


PREFIX = ([(2048, 1024), (300, 700), (64, 1)], "prefix")  # later chunks of long prompts


@pytest.mark.parametrize("min_rows", [None, 0], ids=["threshold", "forced"])
@pytest.mark.parametrize("rows", [pytest.param(r, id=n) for r, n in (MIXED, PREFIX)])
def test_attention_gathered_matches_reference(ops, rows, min_rows) -> None:
    """Prefill passes over a cached context on the gathered path (each row's K/V pages copied
    into contiguous buffers by `kv_gather`, then FlashInfer's ragged kernel) against the
    reference: PREFIX takes it by the threshold, MIXED (decode rows beside short chunks, ctx
    crossing pages) only when forced (`OpChoices.gather_min_rows` 0). Pages the pass does not
    own are NaN and must not leak in; the cache is written as on the paged path."""
    hq, hkv, dim, num_pages = 24, 4, 256, 96
    if min_rows is not None:
        ops = CudaOps(DEV, choices=OpChoices(gather_min_rows=min_rows))
    planner = ops.attention_planner
    batch = make_batch(rows, num_pages, 16)
    owned = owned_pages(batch, num_pages)
    before = planner.gathered_passes
    for _ in range(2):  # the second layer reuses the plan (and the gather's tables)
        q = torch.randn(batch.num_tokens, hq, dim, device=DEV, dtype=torch.bfloat16)
        k, v = (torch.randn(batch.num_tokens, hkv, dim, device=DEV).bfloat16() for _ in "kv")
        cache = torch.randn(num_pages, 2, PAGE_SIZE, hkv, dim, device=DEV)
        cache[~owned] = float("nan")
        cache = cache.bfloat16()
        ref_cache = cache.clone()
        out = ops.attention(q, k, v, cache, batch, dim**-0.5)
        ref = ReferenceOps().attention(q, k, v, ref_cache, batch, dim**-0.5)
        assert rel_err(out, ref) < 1e-2
        assert torch.equal(cache.view(torch.uint8), ref_cache.view(torch.uint8))
    assert planner.gathered_passes - before == (0 if rows is MIXED[0] and min_rows is None else 1)


def test_attention_plan_waits_for_a_queued_pass(ops) -> None:
    """Two paged prefill passes queued back to back behind a GPU spin (the host a pass ahead):
    the second plan must not rewrite the schedule the first pass has yet to copy (FlashInfer
    stages it in one page-locked buffer per wrapper). Each pass gives the reference's output,
    and the second plan waited."""
    hq, hkv, dim, num_pages = 16, 4, 256, 64
    first = make_batch([(128, 192), (64, 100)], num_pages, 8)
    second = make_batch([(64, 40), (256, 3), (0, 7)], num_pages, 8)
    cache = torch.randn(num_pages, 2, PAGE_SIZE, hkv, dim, device=DEV).to(torch.bfloat16)
    ref_cache = cache.clone()
    inputs = [
        [
            torch.randn(b.num_tokens, h, dim, device=DEV, dtype=torch.bfloat16)
            for h in (hq, hkv, hkv)
        ]
        for b in (first, second)
    ]
    batches = (first, second)

    def both() -> list[torch.Tensor]:
        return [
            ops.attention(*x, cache, b, dim**-0.5) for x, b in zip(inputs, batches, strict=True)
        ]

    both()  # first use: FlashInfer loads its kernels (which synchronises), not timed here
    torch.cuda.synchronize()
    cache.copy_(ref_cache)
    waits = ops.attention_planner.guard.waits
    torch.cuda._sleep(500_000_000)  # the GPU busy for ~0.3 s: both passes queue behind it
    outs = both()
    assert ops.attention_planner.guard.waits == waits + 1
    for out, x, b in zip(outs, inputs, batches, strict=True):
        ref = ReferenceOps().attention(*x, ref_cache, b, dim**-0.5)
        assert rel_err(out, ref) < 1e-2


def gdn_inputs(batch: ForwardBatch, hk: int, hv: int, dtype: torch.dtype):
    t, dk = batch.num_tokens, 128
    q, k = (torch.randn(t, hk, dk, device=DEV, dtype=dtype) for _ in "qk")
    v = torch.randn(t, hv, dk, device=DEV, dtype=dtype)
    g = -torch.nn.functional.softplus(torch.randn(t, hv, device=DEV)) * 0.5
    beta = torch.rand(t, hv, device=DEV).to(dtype)
    return q, k, v, g, beta


def poisoned_pool(shape: tuple[int, ...], batch: ForwardBatch, dtype: torch.dtype) -> torch.Tensor:
    """NaN everywhere except random values at the batch's slots (every layer)."""
    pool = torch.full(shape, float("nan"), device=DEV, dtype=dtype)
    pool[batch.state_slots] = torch.randn(batch.num_rows, *shape[1:], device=DEV).to(dtype)
    return pool


def check_untouched(pool: torch.Tensor, before: torch.Tensor, batch: ForwardBatch, layer: int):
    keep = torch.ones(pool.shape[1], dtype=torch.bool)
    keep[layer] = False
    assert torch.equal(pool[:, keep].view(torch.uint8), before[:, keep].view(torch.uint8))
    other = torch.ones(pool.shape[0], dtype=torch.bool, device=DEV)
    other[batch.state_slots] = False
    assert pool[other].isnan().all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rows", BATCHES)
def test_gdn_matches_reference(ops, rows, dtype) -> None:
    hk, hv, layer, num_slots = 16, 48, 1, 16  # 27B GDN heads (shares fla autotune with bench)
    batch = make_batch(rows, 256, num_slots)
    q, k, v, g, beta = gdn_inputs(batch, hk, hv, dtype)
    pool = poisoned_pool((num_slots, 3, hv, 128, 128), batch, torch.float32)
    before, ref_pool = pool.clone(), pool.clone()
    out = ops.gdn(q, k, v, g, beta, pool[:, layer], batch, 128**-0.5)
    ref = ReferenceOps().gdn(q, k, v, g, beta, ref_pool[:, layer], batch, 128**-0.5)
    assert out.dtype == v.dtype
    # fla's chunked kernels use tf32 dots even for fp32 inputs; the decode kernel is pure fp32
    tol = 1e-2 if dtype == torch.bfloat16 else (1e-5 if batch.is_decode else 5e-3)
    assert rel_err(out, ref) < tol
    slots = batch.state_slots
    assert rel_err(pool[slots, layer], ref_pool[slots, layer]) < tol
    check_untouched(pool, before, batch, layer)


def correlated_gdn_inputs(t: int, hk: int, hv: int, dtype: torch.dtype):
    """GDN inputs of a repeated token: q, k, v one direction per head plus 5-10 % noise, beta
    in [0.9, 0.99], g = -0.01 (little decay)."""

    def near(direction, n, noise):
        return (direction + noise * torch.randn(n, *direction.shape[1:], device=DEV)).to(dtype)

    direction = torch.randn(1, hk, 128, device=DEV)
    q, k = near(direction, t, 0.05), near(direction, t, 0.05)
    v = near(torch.randn(1, hv, 128, device=DEV), t, 0.1)
    g = torch.full((t, hv), -0.01, device=DEV)
    beta = (0.9 + 0.09 * torch.rand(t, hv, device=DEV)).to(dtype)
    return q, k, v, g, beta


def test_gdn_prefill_is_stable_on_correlated_keys(ops) -> None:
    """A run of one repeated token: every key of a chunk nearly the same direction, beta near
    1, little decay, so the chunk's A is near beta times the all-ones lower triangle. The
    default prefill path (fla's triangular solve) stays finite and close to the reference's
    solve (H200: these inputs in a script, not this test: 0.0094 on o, 0.006 on the states); a
    matmul-product inverse (`ninfer.bench.gdn_inverse`) gave NaN on the same inputs, and NaN
    GDN states in the engine's warm-up. bf16, the engine's dtype on CUDA; the tolerance is
    twice the usual one (the inputs' bf16 rounding is amplified by the near-parallel keys)."""
    torch.manual_seed(0)
    hk, hv, layer, num_slots = 16, 32, 0, 8
    batch = make_batch([(0, 300), (64, 130), (0, 64)], 64, num_slots)
    q, k, v, g, beta = correlated_gdn_inputs(batch.num_tokens, hk, hv, torch.bfloat16)
    pool = poisoned_pool((num_slots, 2, hv, 128, 128), batch, torch.float32)
    before, ref_pool = pool.clone(), pool.clone()
    out = ops.gdn(q, k, v, g, beta, pool[:, layer], batch, 128**-0.5)
    ref = ReferenceOps().gdn(q, k, v, g, beta, ref_pool[:, layer], batch, 128**-0.5)
    assert rel_err(out, ref) < 2e-2
    slots = batch.state_slots
    assert rel_err(pool[slots, layer], ref_pool[slots, layer]) < 2e-2
    check_untouched(pool, before, batch, layer)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rows", BATCHES)
def test_gated_delta_matches_reference(ops, rows, dtype) -> None:
    """`gated_delta` (gates from the raw a, b; computed inside the decode kernel) against the
    reference's gdn_gates + gdn, prefill and decode, a and b strided views as in the model."""
    hk, hv, layer, num_slots = 16, 32, 0, 16
    batch = make_batch(rows, 256, num_slots)
    q, k, v, _, _ = gdn_inputs(batch, hk, hv, dtype)
    ab = torch.randn(batch.num_tokens, 2 * hv + 8, device=DEV).mul(3).to(dtype)
    a, b = ab[:, :hv], ab[:, hv : 2 * hv]
    a_log = torch.randn(hv, device=DEV).to(dtype)
    dt_bias = torch.randn(hv, device=DEV).to(dtype)
    pool = poisoned_pool((num_slots, 2, hv, 128, 128), batch, torch.float32)
    before, ref_pool = pool.clone(), pool.clone()
    out = ops.gated_delta(q, k, v, a, b, a_log, dt_bias, pool[:, layer], batch, 128**-0.5)
    ref = ReferenceOps().gated_delta(
        q, k, v, a, b, a_log, dt_bias, ref_pool[:, layer], batch, 128**-0.5
    )
    tol = 1e-2 if dtype == torch.bfloat16 else (1e-5 if batch.is_decode else 5e-3)
    assert rel_err(out, ref) < tol
    slots = batch.state_slots
    assert rel_err(pool[slots, layer], ref_pool[slots, layer]) < tol
    check_untouched(pool, before, batch, layer)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rows", BATCHES)
def test_conv_matches_reference(ops, rows, dtype) -> None:
    channels, width, layer, num_slots = 1024 + 3 * 128, 4, 2, 16
    batch = make_batch(rows, 256, num_slots)
    x = torch.randn(batch.num_tokens, channels, device=DEV, dtype=dtype)
    weight = torch.randn(channels, width, device=DEV, dtype=dtype)
    pool = poisoned_pool((num_slots, 3, channels, width - 1), batch, dtype)
    before, ref_pool = pool.clone(), pool.clone()
    out = ops.causal_conv(x, weight, pool[:, layer], batch)
    ref = ReferenceOps().causal_conv(x, weight, ref_pool[:, layer], batch)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert rel_err(out, ref) < tol
    slots = batch.state_slots
    assert torch.equal(pool[slots, layer], ref_pool[slots, layer])
    check_untouched(pool, before, batch, layer)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rows", BATCHES)
def test_conv_gated_delta_matches_reference(ops, rows, dtype) -> None:
    """The GDN mixer (conv writing normalised q, k and v straight into fla's layout at prefill;
    conv + gated_delta decode kernels at decode) against the reference composition, from a
    strided view of a fused projection as in the model, over NaN-poisoned conv and ssm pools."""
    hk, hv, dk, width, num_slots = 16, 48, 128, 4, 16  # 27B GDN heads
    channels = 2 * hk * dk + hv * dk
    batch = make_batch(rows, 256, num_slots)
    t = batch.num_tokens
    proj = torch.randn(t, channels + 2 * hv + 40, device=DEV).to(dtype)  # q|k|v, then b, a, pad
    x, b, a = (
        proj[:, :channels],
        proj[:, channels : channels + hv],
        proj[:, channels + hv :][:, :hv],
    )
    weight = (torch.randn(channels, width, device=DEV) * 0.5).to(dtype)
    a_log = torch.randn(hv, device=DEV).to(dtype)
    dt_bias = torch.randn(hv, device=DEV).to(dtype)
    conv_pool = poisoned_pool((num_slots, 2, channels, width - 1), batch, dtype)
    ssm_pool = poisoned_pool((num_slots, 2, hv, dk, dk), batch, torch.float32)
    conv_before, ssm_before = conv_pool.clone(), ssm_pool.clone()
    ref_conv, ref_ssm = conv_pool.clone(), ssm_pool.clone()
    args = (a, b, a_log, dt_bias)
    out = ops.conv_gated_delta(x, weight, conv_pool[:, 1], *args, ssm_pool[:, 1], batch, dk**-0.5)
    ref = ReferenceOps().conv_gated_delta(
        x, weight, ref_conv[:, 1], *args, ref_ssm[:, 1], batch, dk**-0.5
    )
    assert out.shape == (t, hv, dk) and out.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else (1e-5 if batch.is_decode else 5e-3)
    assert rel_err(out, ref) < tol
    slots = batch.state_slots
    assert torch.equal(conv_pool[slots, 1], ref_conv[slots, 1])
    assert rel_err(ssm_pool[slots, 1], ref_ssm[slots, 1]) < tol
    check_untouched(conv_pool, conv_before, batch, 1)
    check_untouched(ssm_pool, ssm_before, batch, 1)


def test_conv_qkv_layout_and_norm(ops) -> None:
    """`causal_conv_qkv` gives the plain conv's output split by channels, q and k
    L2-normalised per head from the output rounded to bf16: bit for bit for v, within an ulp
    for q and k; three contiguous tensors."""
    from ninfer.ops.cuda import conv
    from ninfer.ops.cuda.passmeta import PassMeta

    hk, hv, dk, num_slots = 4, 6, 128, 16
    key_dim, channels = hk * dk, 2 * hk * dk + hv * dk
    batch = make_batch(MIXED[0], 256, num_slots)
    x = torch.randn(batch.num_tokens, channels + 8, device=DEV, dtype=torch.bfloat16)[:, 4:-4]
    weight = torch.randn(channels, 4, device=DEV, dtype=torch.bfloat16)
    pool = poisoned_pool((num_slots, 1, channels, 3), batch, torch.bfloat16)
    plain_pool = pool.clone()
    meta = PassMeta.of(batch.q_lens, batch.ctx_lens, DEV)
    q, k, v = conv.causal_conv_qkv(x, weight, pool[:, 0], batch, meta, key_dim, dk)
    y = conv.causal_conv(x, weight, plain_pool[:, 0], batch, meta)
    assert torch.equal(pool.view(torch.uint8), plain_pool.view(torch.uint8))
    assert all(z.is_contiguous() for z in (q, k, v))
    assert torch.equal(v, y[:, 2 * key_dim :].reshape(v.shape))
    for got, part in ((q, y[:, :key_dim]), (k, y[:, key_dim : 2 * key_dim])):
        f = part.float().view(got.shape)
        want = (f / torch.sqrt((f * f).sum(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
        assert (got.float() - want.float()).abs().max().item() <= 2**-8  # one ulp near 1


@pytest.mark.parametrize(
    "tile",
    [(64, 128, 4), (16, 128, 4), (32, 256, 2), (16, 512, 8)],
    ids=lambda t: "x".join(map(str, t)),
)
def test_conv_tiles_agree(ops, tile) -> None:
    """Every prefill launch shape of the conv (across rows that start inside a tile, continue
    a state or are shorter than the taps) gives the default tile's values: v and the plain
    conv bit for bit, q and k within an ulp (their norm's sum order follows the layout); and
    the same conv state."""
    from ninfer.ops.cuda import conv
    from ninfer.ops.cuda.passmeta import PassMeta

    hk, hv, dk, num_slots = 2, 4, 128, 16
    key_dim, channels = hk * dk, 2 * hk * dk + hv * dk
    batch = make_batch([(0, 300), (70, 200), (5, 3), (0, 1), (2, 90), (300, 2)], 256, num_slots)
    x = torch.randn(batch.num_tokens, channels + 8, device=DEV, dtype=torch.bfloat16)[:, 4:-4]
    weight = torch.randn(channels, 4, device=DEV, dtype=torch.bfloat16)
    pool = poisoned_pool((num_slots, 1, channels, 3), batch, torch.bfloat16)
    meta = PassMeta.of(batch.q_lens, batch.ctx_lens, DEV)
    pools = [pool.clone() for _ in range(4)]
    t = conv.Tile(*tile)
    want = conv.causal_conv_qkv(x, weight, pools[0][:, 0], batch, meta, key_dim, dk)
    got = conv.causal_conv_qkv(x, weight, pools[1][:, 0], batch, meta, key_dim, dk, t)
    assert torch.equal(got[2], want[2])
    for g, w in zip(got[:2], want[:2], strict=True):
        assert (g.float() - w.float()).abs().max().item() <= 2**-8
    plain = conv.causal_conv(x, weight, pools[2][:, 0], batch, meta, t)
    assert torch.equal(plain, conv.causal_conv(x, weight, pools[3][:, 0], batch, meta))
    for p in pools[1:]:
        assert torch.equal(p.view(torch.uint8), pools[0].view(torch.uint8))


def test_gdn_decode_graph_replay(ops) -> None:
    """The decode step captured in a CUDA graph gives the eager result on new inputs."""
    hk, hv, num_slots = 16, 48, 16
    batch = make_batch(DECODE[0], 256, num_slots)
    pool = poisoned_pool((num_slots, 1, hv, 128, 128), batch, torch.float32)
    inputs = gdn_inputs(batch, hk, hv, torch.bfloat16)
    ops.gdn(*inputs, pool.clone()[:, 0], batch, 0.1)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.gdn(*inputs, pool[:, 0], batch, 0.1)
    fresh = gdn_inputs(batch, hk, hv, torch.bfloat16)
    for dst, src in zip(inputs, fresh, strict=True):
        dst.copy_(src)
    start = torch.randn_like(pool[batch.state_slots])
    pool[batch.state_slots] = start
    ref_pool = pool.clone()
    graph.replay()
    ref = ReferenceOps().gdn(*fresh, ref_pool[:, 0], batch, 0.1)
    assert rel_err(out, ref) < 1e-2
    assert rel_err(pool[batch.state_slots], ref_pool[batch.state_slots]) < 1e-5


def test_conv_decode_graph_replay(ops) -> None:
    """The conv decode step captured in a CUDA graph gives the eager result on new inputs."""
    channels, num_slots = 1024, 16
    batch = make_batch(DECODE[0], 256, num_slots)
    pool = poisoned_pool((num_slots, 1, channels, 3), batch, torch.bfloat16)
    x = torch.randn(batch.num_tokens, channels, device=DEV, dtype=torch.bfloat16)
    weight = torch.randn(channels, 4, device=DEV, dtype=torch.bfloat16)
    ops.causal_conv(x, weight, pool.clone()[:, 0], batch)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.causal_conv(x, weight, pool[:, 0], batch)
    x.copy_(torch.randn_like(x))
    pool[batch.state_slots] = torch.randn_like(pool[batch.state_slots])
    ref_pool = pool.clone()
    graph.replay()
    ref = ReferenceOps().causal_conv(x, weight, ref_pool[:, 0], batch)
    assert rel_err(out, ref) < 1e-2
    assert torch.equal(pool[batch.state_slots], ref_pool[batch.state_slots])
