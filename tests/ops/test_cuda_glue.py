"""GPU tests of the Triton glue kernels against their torch versions: SwiGLU over the strided
halves of a fused projection (`ninfer.ops.cuda.glue`) and the one-launch K/V write
(`ninfer.ops.cuda.attention.write_kv`, bit-equal to the `index_copy_` path), also inside a
captured CUDA graph. Skipped without CUDA or triton."""

from __future__ import annotations

import pytest
import torch

from ninfer.models.batch import PAGE_SIZE

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

from ninfer.ops.cuda import glue  # noqa: E402
from ninfer.ops.cuda.attention import write_kv  # noqa: E402

DEV = torch.device("cuda")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,inter", [(1, 12288), (7, 1000), (300, 17408), (0, 64)])
def test_silu_mul_matches_torch(dtype, rows, inter):
    x = torch.randn(rows, 2 * inter + 8, dtype=dtype, device=DEV)
    g, u = x[:, :inter], x[:, inter : 2 * inter]
    out = glue.silu_mul(g, u)
    ref = (torch.nn.functional.silu(g.float()) * u.float()).to(dtype)
    assert out.shape == (rows, inter) and out.is_contiguous()
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def test_silu_mul_refuses_bad_layout():
    x = torch.randn(4, 8, device=DEV)
    with pytest.raises(ValueError, match="silu_mul"):
        glue.silu_mul(x.t(), x.t())


def _index_copy(k, v, cache, slots):
    flat = cache.view(torch.int16).view(-1, *cache.shape[-2:])
    rows = slots + (slots // PAGE_SIZE) * PAGE_SIZE
    flat.index_copy_(0, rows, k.contiguous().view(torch.int16))
    flat.index_copy_(0, rows + PAGE_SIZE, v.contiguous().view(torch.int16))


@pytest.mark.parametrize("tokens", [1, 5, 200])
def test_write_kv_equals_index_copy(tokens):
    pages, hkv, dim = 8, 4, 256
    cache = torch.randn(pages, 2, PAGE_SIZE, hkv, dim, device=DEV).to(torch.bfloat16)
    ref = cache.clone()
    kv = torch.randn(tokens, 2 * hkv * dim + 32, device=DEV).to(torch.bfloat16)
    k = kv[:, : hkv * dim].view(tokens, hkv, dim)  # strided views, as the fused projection
    v = kv[:, hkv * dim : 2 * hkv * dim].view(tokens, hkv, dim)
    slots = torch.randperm(pages * PAGE_SIZE, device=DEV)[:tokens]
    write_kv(k, v, cache, slots, None, None)
    _index_copy(k, v, ref, slots)
    assert torch.equal(cache, ref)


def test_write_kv_in_a_graph():
    cache = torch.zeros(4, 2, PAGE_SIZE, 2, 128, dtype=torch.bfloat16, device=DEV)
    k = torch.randn(3, 2, 128, device=DEV).to(torch.bfloat16)
    v = torch.randn(3, 2, 128, device=DEV).to(torch.bfloat16)
    slots = torch.tensor([5, 70, 200], device=DEV)
    write_kv(k, v, cache, slots, None, None)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        write_kv(k, v, cache, slots, None, None)
    cache.zero_()
    slots.copy_(torch.tensor([1, 2, 255], device=DEV))
    graph.replay()
    ref = torch.zeros_like(cache)
    _index_copy(k, v, ref, slots)
    assert torch.equal(cache, ref)
