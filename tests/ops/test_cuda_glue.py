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


def qg_views(tokens: int, heads: int, kv_heads: int, dim: int, dtype):
    """q, gate [T, H, D] and k [T, Hkv, D] as strided views of one fused projection, laid out
    as the model's (per head q | gate, then k)."""
    proj = torch.randn(tokens, heads * 2 * dim + kv_heads * dim + 16, device=DEV) * 3
    proj = proj.to(dtype)
    qg = proj[:, : heads * 2 * dim].view(tokens, heads, 2 * dim)
    k = proj[:, heads * 2 * dim : heads * 2 * dim + kv_heads * dim].view(tokens, kv_heads, dim)
    return qg[..., :dim], qg[..., dim:], k


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any()
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("tokens,heads,kv_heads", [(1, 24, 4), (8, 16, 4), (777, 24, 4), (5, 3, 1)])
def test_norm_rope_matches_reference(dtype, tokens, heads, kv_heads):
    """q / k norm + partial RoPE in one launch each against the reference's rms_norm then
    rope, on the strided q half of the q | gate projection, positions up to 262k."""
    from ninfer.ops.reference import ReferenceOps

    dim, rotary = 256, 64
    q, _, k = qg_views(tokens, heads, kv_heads, dim, dtype)
    wq, wk = ((torch.randn(dim, device=DEV) * 0.1).to(dtype) for _ in "qk")
    pos = torch.randint(0, 262_144, (tokens,), device=DEV)
    inv_freq = 1.0 / (1e7 ** (torch.arange(0, rotary, 2, device=DEV).float() / rotary))
    rq, rk = ReferenceOps().qk_norm_rope(q, k, wq, wk, 1e-6, pos, inv_freq, rotary)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5  # bf16: the reference rounds per op
    for x, w, ref in ((q, wq, rq), (k, wk, rk)):
        out = glue.norm_rope(x, w, 1e-6, pos, inv_freq, rotary)
        assert out.shape == ref.shape and out.is_contiguous() and out.dtype == dtype
        assert rel(out, ref) < tol
        # the dims past the rotary ones are the norm alone, rounded once: at most an ulp off
        assert rel(out[..., rotary:], ref[..., rotary:]) < (
            1e-3 if dtype == torch.bfloat16 else 1e-6
        )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("tokens,heads", [(1, 24), (8, 16), (8192, 24), (3, 5)])
def test_sigmoid_gate_matches_reference(dtype, tokens, heads):
    from ninfer.ops.reference.dense import sigmoid_mul_ref

    _, gate, _ = qg_views(tokens, heads, 1, 256, dtype)
    o = torch.randn(tokens, heads, 256, device=DEV).to(dtype)
    out = glue.sigmoid_gate(o, gate)
    ref = sigmoid_mul_ref(o, gate)
    assert out.shape == ref.shape and out.is_contiguous()
    assert rel(out, ref) < (1e-2 if dtype == torch.bfloat16 else 1e-6)
    with pytest.raises(ValueError, match="sigmoid_gate"):
        glue.sigmoid_gate(o, gate[:, :1])  # a broadcast gate is the compiled path's
