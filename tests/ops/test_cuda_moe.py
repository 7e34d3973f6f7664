"""GPU tests: the sync-free MoE paths (`ninfer.ops.cuda.moe`) against `moe_ref` / `route_ref`.

Small random experts (E=16, top_k=4, so 8 tokens already route pairs to one expert more than
once), weights scaled so outputs are O(1). Up to DECODE_PAIRS pairs `moe_grouped` must take the
Triton decode path (its output equals `moe_decode`'s bit for bit); beyond, the grouped GEMM (bf16)
or bmm path. Errors are ||out - ref|| / ||ref||. Skipped without CUDA or triton.

Random bf16 logits often tie, and `moe_route` breaks ties towards the lowest expert id, where
torch.topk promises no order: the decode path is compared with `moe_ref` routed by a stable sort
(`route_lowest`, same tie-break); `moe_route` against `route_ref` itself on tie-free logits.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

from ninfer.ops.cuda.moe import (  # noqa: E402
    DECODE_PAIRS,
    ROUTE_MAX_EXPERTS,
    moe_decode,
    moe_grouped,
    moe_route,
)
from ninfer.ops.reference import dense  # noqa: E402
from ninfer.ops.reference.dense import moe_ref, route_ref  # noqa: E402

DEV = torch.device("cuda")
EXPERTS, TOP_K = 16, 4
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}
ROUTE_RTOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-6}
DTYPES = [pytest.param(d, id=str(d)[6:]) for d in TOL]


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
@pytest.mark.parametrize("n", [1, 3, 8, 40])
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
