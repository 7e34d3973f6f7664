"""GPU tests: the sync-free MoE paths (`ninfer.ops.cuda.moe`) against `moe_ref` / `route_ref`.

Small random experts (E=16, top_k=4, so 8 tokens already route pairs to one expert more than
once), weights scaled so outputs are O(1). Up to DECODE_PAIRS pairs `moe_grouped` must take the
Triton decode path (its output equals `moe_decode`'s bit for bit); beyond, the grouped GEMM (bf16)
or bmm path. Errors are ||out - ref|| / ||ref||. Skipped without CUDA or triton.

Random bf16 logits often tie, and `moe_route` breaks ties towards the lowest expert id, where
torch.topk promises no order: the decode path is compared with `moe_ref` routed by a stable sort
(`route_lowest`, same tie-break); `moe_route` against `route_ref` itself on tie-free logits.

`CudaOps.moe_block` (routed experts + sigmoid-gated shared expert, router [E + 1, H]) against
`moe_block_ref`: its decode path (`moe_block_decode`, where `block_fusable`) adds the shared term
to the routed ones in fp32 and rounds once where the reference rounds the routed sum and then the
total, a difference of about an ulp of the dtype per element, well inside TOL (which is ~2-3 ulps
of a relative norm for bf16 / fp16). The tests through `CudaOps` also need flashinfer and fla
(its constructor imports them).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

from ninfer.models.config import Qwen35Config  # noqa: E402
from ninfer.models.qwen3_5 import SparseMoE  # noqa: E402
from ninfer.ops.cuda import CudaOps  # noqa: E402
from ninfer.ops.cuda.linear import DecodeLinear  # noqa: E402
from ninfer.ops.cuda.moe import (  # noqa: E402
    DECODE_PAIRS,
    ROUTE_MAX_EXPERTS,
    block_fusable,
    moe_block_decode,
    moe_decode,
    moe_grouped,
    moe_route,
)
from ninfer.ops.reference import ReferenceOps, dense  # noqa: E402
from ninfer.ops.reference.dense import moe_block_ref, moe_ref, route_ref  # noqa: E402

DEV = torch.device("cuda")
EXPERTS, TOP_K = 16, 4
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}
ROUTE_RTOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-6}
DTYPES = [pytest.param(d, id=str(d)[6:]) for d in TOL]


@pytest.fixture(scope="module")
def ops() -> CudaOps:
    for mod in ("flashinfer", "fla"):  # CudaOps' constructor imports them
        pytest.importorskip(mod)
    return CudaOps(DEV)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert not out.isnan().any(), "NaN in output"
    return ((out - ref).norm() / ref.norm()).item()


def experts(
    hidden: int, inter: int, dtype: torch.dtype, num: int = EXPERTS
) -> tuple[torch.Tensor, ...]:
    """router [E, H], gate_up [E, 2I, H], down [E, H, I], scaled for O(1) activations."""
    router = torch.randn(num, hidden, device=DEV) * hidden**-0.5
    gate_up = torch.randn(num, 2 * inter, hidden, device=DEV) * hidden**-0.5
    down = torch.randn(num, hidden, inter, device=DEV) * inter**-0.5
    return tuple(t.to(dtype) for t in (router, gate_up, down))


def route_lowest(
    x: torch.Tensor, router_weight: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`route_ref` with top-k by a stable descending sort: ties to the lowest expert id."""
    probs = F.linear(x, router_weight).float().softmax(dim=-1)
    weights, ids = probs.sort(dim=-1, descending=True, stable=True)
    weights, ids = weights[:, :top_k], ids[:, :top_k]
    return (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype), ids


def moe_ref_lowest(*args) -> torch.Tensor:
    """`moe_ref` routed by `route_lowest`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dense, "route_ref", route_lowest)
        return moe_ref(*args)


def moe_block_ref_lowest(*args) -> torch.Tensor:
    """`moe_block_ref` routed by `route_lowest`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dense, "route_ref", route_lowest)
        return moe_block_ref(*args)


def block_weights(
    hidden: int, inter: int, dtype: torch.dtype, num: int = EXPERTS, shared: int | None = None
) -> tuple[torch.Tensor, ...]:
    """router [E + 1, H] (last row the shared expert's gate), gate_up, down (`experts`), shared
    gate_up [2Is, H], shared down [H, Is] (Is = shared or inter)."""
    router, gate_up, down = experts(hidden, inter, dtype, num)
    s = shared or inter
    gate = torch.randn(1, hidden, device=DEV) * hidden**-0.5
    s_gate_up = torch.randn(2 * s, hidden, device=DEV) * hidden**-0.5
    s_down = torch.randn(hidden, s, device=DEV) * s**-0.5
    router = torch.cat([router, gate.to(dtype)])
    return router, gate_up, down, s_gate_up.to(dtype), s_down.to(dtype)


def distinct_logits(n: int, num: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [n, num + 8] and router [num, num + 8] whose logits are, per row, a permutation of
    num distinct values exact in every dtype (multiples of 1/128, at most 2 in size): no ties."""
    vals = (torch.arange(num, device=DEV) - num // 2) / 128
    rows = [vals[torch.randperm(num, device=DEV)] for _ in range(n)]
    x = torch.cat([torch.stack(rows), torch.randn(n, 8, device=DEV)], 1).to(dtype)
    return x, torch.eye(num, num + 8, device=DEV, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num,top_k", [(16, 4), (256, 8), (100, 6), (512, 8)])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_route_matches_reference(n, num, top_k, dtype) -> None:
    """Without ties: the same ids in the same order, weights within an ulp or two."""
    x, router = distinct_logits(n, num, dtype)
    weights, ids = moe_route(x, router, top_k)
    ref_w, ref_ids = route_ref(x, router, top_k)
    assert ids.dtype == torch.int64 and weights.dtype == dtype
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=ROUTE_RTOL[dtype], atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_route_random_logits(dtype) -> None:
    """Random routers (ties likely in bf16): the picked logits are `route_ref`'s, in the same
    (descending) order, and the ids `route_lowest`'s (ties to the lowest id)."""
    x, (router, _, _) = torch.randn(8, 256, device=DEV, dtype=dtype), experts(256, 8, dtype, 256)
    weights, ids = moe_route(x, router, 8)
    ref_w, ref_ids = route_ref(x, router, 8)
    logits = F.linear(x, router).float()
    assert torch.equal(logits.gather(1, ids), logits.gather(1, ref_ids))
    torch.testing.assert_close(weights, ref_w, rtol=ROUTE_RTOL[dtype], atol=0)
    assert torch.equal(ids, route_lowest(x, router, 8)[1])


def test_route_ties_and_limits() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0, -0.0, 2.0]], device=DEV)
    _, ids = moe_route(logits, torch.eye(8, device=DEV), 6)
    assert ids.tolist() == [[1, 2, 4, 3, 7, 0]]
    router = torch.eye(8, device=DEV)
    with pytest.raises(ValueError):
        moe_route(logits, router, 9)  # top_k > E
    big = torch.zeros(ROUTE_MAX_EXPERTS + 1, 8, device=DEV)
    with pytest.raises(ValueError):
        moe_route(logits, big, 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 8, 40, 80])
def test_moe_matches_reference(n, dtype) -> None:
    weights = experts(256, 128, dtype)
    x = torch.randn(n, 256, device=DEV, dtype=dtype)
    ref = moe_ref(x, *weights, TOP_K)
    out = moe_grouped(x, *weights, TOP_K)
    decode = moe_decode(x, *weights, TOP_K)
    assert out.shape == ref.shape and out.dtype == dtype and decode.dtype == dtype
    assert rel_err(out, ref) < TOL[dtype]
    assert rel_err(decode, moe_ref_lowest(x, *weights, TOP_K)) < TOL[dtype]
    if n * TOP_K <= DECODE_PAIRS:  # the dispatch took the decode path
        assert torch.equal(out, decode)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("top_k", [6, 8])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_moe_decode_top_k(n, top_k, dtype) -> None:
    """top_k 8 (the models') and 6 (not a power of two: padded expert slots dropped), 64
    experts of which 8 tokens share some."""
    weights = experts(256, 128, dtype, 64)
    x = torch.randn(n, 256, device=DEV, dtype=dtype)
    out = moe_decode(x, *weights, top_k)
    assert rel_err(out, moe_ref_lowest(x, *weights, top_k)) < TOL[dtype]
    assert torch.equal(out, moe_decode(x, *weights, top_k))  # deterministic


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_moe_decode_odd_shapes(dtype) -> None:
    """H, I and E not multiples of any block size: the masked loads and stores."""
    weights = experts(200, 72, dtype, 20)
    x = torch.randn(3, 200, device=DEV, dtype=dtype)
    ref = moe_ref_lowest(x, *weights, TOP_K)
    assert rel_err(moe_decode(x, *weights, TOP_K), ref) < TOL[dtype]


def test_moe_decode_strided_rows() -> None:
    """x rows with a stride larger than H (a view into a wider buffer)."""
    weights = experts(256, 128, torch.bfloat16)
    x = torch.randn(8, 384, device=DEV, dtype=torch.bfloat16)[:, 64:320]
    ref = moe_ref_lowest(x.contiguous(), *weights, TOP_K)
    assert rel_err(moe_decode(x, *weights, TOP_K), ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("n", [1, 8])
def test_moe_decode_graph_replay(n) -> None:
    """Captured in a CUDA graph after one eager call (autotune), replayed on new x contents:
    the routing and the output follow x."""
    weights = experts(256, 128, torch.bfloat16)
    x = torch.randn(n, 256, device=DEV, dtype=torch.bfloat16)
    moe_decode(x, *weights, TOP_K)
    moe_route(x, weights[0], TOP_K)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_decode(x, *weights, TOP_K)
        route_w, route_ids = moe_route(x, weights[0], TOP_K)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert rel_err(out, moe_ref_lowest(x, *weights, TOP_K)) < TOL[torch.bfloat16]
        ref_w, ref_ids = route_lowest(x, weights[0], TOP_K)
        assert torch.equal(route_ids, ref_ids)
        torch.testing.assert_close(route_w, ref_w, rtol=1e-2, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num,top_k", [(16, 4), (256, 8), (100, 6)])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_route_shared_matches_reference(n, num, top_k, dtype) -> None:
    """shared=True: the routed pairs as without it, then (E, sigmoid(logit E)) per token."""
    x, router = distinct_logits(n, num, dtype)
    full = torch.cat([router, torch.randn(1, num + 8, device=DEV, dtype=dtype)])
    weights, ids = moe_route(x, full, top_k, shared=True)
    ref_w, ref_ids = route_ref(x, router, top_k)
    assert weights.shape == ids.shape == (n, top_k + 1) and weights.dtype == dtype
    assert torch.equal(ids[:, :top_k], ref_ids) and (ids[:, top_k] == num).all()
    torch.testing.assert_close(weights[:, :top_k], ref_w, rtol=ROUTE_RTOL[dtype], atol=0)
    sig = F.linear(x, full)[:, num].sigmoid()  # the gate logit of the same GEMM
    torch.testing.assert_close(weights[:, top_k], sig, rtol=ROUTE_RTOL[dtype], atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", list(range(1, 9)))
def test_moe_block_decode_matches_reference(n, dtype, ops) -> None:
    """Batch 1..8 tokens: the four-launch path, deterministic, and what `CudaOps.moe_block`
    runs (with its router linear)."""
    weights = block_weights(256, 128, dtype)
    x = torch.randn(n, 256, device=DEV, dtype=dtype)
    out = moe_block_decode(x, *weights, TOP_K)
    assert out.shape == x.shape and out.dtype == dtype
    assert rel_err(out, moe_block_ref_lowest(x, *weights, TOP_K)) < TOL[dtype]
    assert torch.equal(out, moe_block_decode(x, *weights, TOP_K))  # deterministic
    assert block_fusable(x, *weights, TOP_K)
    got = ops.moe_block(x, *weights, TOP_K)
    assert torch.equal(got, moe_block_decode(x, *weights, TOP_K, ops.linear))  # this path


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("top_k", [6, 8])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_moe_block_decode_top_k(n, top_k, dtype) -> None:
    """top_k 8 (the models': P = 9 pairs per token) and 6, 64 experts."""
    weights = block_weights(256, 128, dtype, 64)
    x = torch.randn(n, 256, device=DEV, dtype=dtype)
    out = moe_block_decode(x, *weights, top_k)
    assert rel_err(out, moe_block_ref_lowest(x, *weights, top_k)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_moe_block_decode_odd_shapes(dtype) -> None:
    """H, I and E not multiples of any block size, strided x rows."""
    weights = block_weights(200, 72, dtype, 20)
    x = torch.randn(3, 264, device=DEV, dtype=dtype)[:, 32:232]
    ref = moe_block_ref_lowest(x.contiguous(), *weights, TOP_K)
    assert rel_err(moe_block_decode(x, *weights, TOP_K), ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [65, 100])
def test_moe_block_larger_batches(n, dtype, ops) -> None:
    """Past DECODE_PAIRS routed pairs: the grouped (bf16) or bmm path plus the shared expert
    through separate ops, routed by torch.topk as the reference."""
    weights = block_weights(256, 128, dtype)
    x = torch.randn(n, 256, device=DEV, dtype=dtype)
    assert not block_fusable(x, *weights, TOP_K)
    out = ops.moe_block(x, *weights, TOP_K)
    assert out.dtype == dtype
    assert rel_err(out, moe_block_ref(x, *weights, TOP_K)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 8])
def test_moe_block_other_shared_size(n, dtype, ops) -> None:
    """A shared expert of another width than the routed ones: `moe_decode` plus separate ops."""
    weights = block_weights(256, 128, dtype, shared=200)
    x = torch.randn(n, 256, device=DEV, dtype=dtype)
    assert not block_fusable(x, *weights, TOP_K)
    ref = moe_block_ref_lowest(x, *weights, TOP_K)
    assert rel_err(ops.moe_block(x, *weights, TOP_K), ref) < TOL[dtype]


@pytest.mark.parametrize("n", [1, 40])
def test_moe_block_router_shape(n, ops) -> None:
    """A router without the shared expert's gate row: ValueError on both paths."""
    router, *weights = block_weights(256, 128, torch.bfloat16)
    x = torch.randn(n, 256, device=DEV, dtype=torch.bfloat16)
    assert not block_fusable(x, router[:-1], *weights, TOP_K)
    with pytest.raises(ValueError, match="E \\+ 1"):
        ops.moe_block(x, router[:-1], *weights, TOP_K)
    with pytest.raises(ValueError, match="E \\+ 1"):
        moe_block_decode(x, router[:-1], *weights, TOP_K)


def test_moe_block_decode_with_decode_linear(ops) -> None:
    """The router GEMV through `DecodeLinear` (cuBLAS or the skinny Triton GEMM, raced), as
    `CudaOps.moe_block` runs it, at 35B-A3B's E and top_k."""
    weights = block_weights(512, 128, torch.bfloat16, 256)
    assert isinstance(ops.linear, DecodeLinear) and ops.linear.enabled
    for n in (1, 8):
        x = torch.randn(n, 512, device=DEV, dtype=torch.bfloat16)
        assert block_fusable(x, *weights, 8)
        out = ops.moe_block(x, *weights, 8)
        ref = moe_block_ref_lowest(x, *weights, 8)
        assert rel_err(out, ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("n", [1, 3, 8])
def test_moe_block_graph_replay(n, ops) -> None:
    """Captured in a CUDA graph after one eager call (autotune), replayed on new x contents:
    the routing, the shared gate and the output follow x."""
    weights = block_weights(256, 128, torch.bfloat16)
    x = torch.randn(n, 256, device=DEV, dtype=torch.bfloat16)
    ops.moe_block(x, *weights, TOP_K)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.moe_block(x, *weights, TOP_K)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        ref = moe_block_ref_lowest(x, *weights, TOP_K)
        assert rel_err(out, ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("n", [1, 8, 24, 40])
def test_sparse_moe_fused_on_cuda(n, ops) -> None:
    """The model's SparseMoE after `fuse()` (router | shared gate as one weight, the original
    parameters views of it) through `CudaOps.moe_block`, against its unfused forward with the
    reference ops (routed as the CUDA path: ties to the lowest id at decode sizes, torch.topk
    beyond); captured in a CUDA graph at decode sizes."""
    cfg = Qwen35Config(
        vocab_size=8, hidden_size=256, num_hidden_layers=1, layer_types=("linear_attention",),
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
        linear_num_value_heads=1, linear_key_head_dim=8, linear_value_head_dim=8,
        num_experts=64, num_experts_per_tok=8, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, model_type="qwen3_5_moe_text",
    )  # fmt: skip
    decode = n * cfg.num_experts_per_tok <= DECODE_PAIRS
    moe = SparseMoE(cfg, {"dtype": torch.bfloat16, "device": DEV})

    def reference(x: torch.Tensor) -> torch.Tensor:
        with pytest.MonkeyPatch.context() as mp:
            if decode:
                mp.setattr(dense, "route_ref", route_lowest)
            return moe(x, ReferenceOps())

    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
        x = torch.randn(n, 256, device=DEV, dtype=torch.bfloat16)
        ref = reference(x)  # unfused: ops.moe + the separate shared expert
        moe.fuse()
        out = moe(x, ops)
        assert moe.gate.weight.data_ptr() == moe.router.data_ptr()
        assert rel_err(out, ref) < TOL[torch.bfloat16]
        if decode:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = moe(x, ops)
            x.copy_(torch.randn_like(x))
            graph.replay()
            assert rel_err(captured, reference(x)) < TOL[torch.bfloat16]
