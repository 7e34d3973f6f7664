"""GPU tests of the Triton glue kernels against their torch versions: SwiGLU over the strided
halves of a fused projection (`ninfer.ops.cuda.glue`) and the one-launch K/V write
(`ninfer.ops.cuda.attention.write_kv`, bit-equal to the `index_copy_` path), also inside a
captured CUDA graph, and the attention's norm + RoPE and output gate and the GDN's gated
output norm against the reference ops. Skipped without CUDA or triton."""

from __future__ import annotations

import pytest
import torch

from ninfer.page import PAGE_SIZE

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


def bf16_ulps(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per element distance in bf16 steps (the bit patterns in float order)."""
    a, b = (t.view(torch.int16).int() for t in (out, ref))
    a, b = (torch.where(i < 0, -32768 - i, i) for i in (a, b))
    return (a - b).abs()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32], ids=["w_bf16", "w_fp32"])
@pytest.mark.parametrize("tokens,heads", [(1, 48), (7, 48), (300, 32), (5, 3), (0, 16)])
def test_gated_norm_matches_reference(dtype, w_dtype, tokens, heads):
    """The GDN output norm on a contiguous o and z as the model's strided view of the fused
    in_proj (q | k | v | z | b | a), row counts off the 16-row block. bf16: the kernel rounds
    where the reference does, so it is bit-equal but where its fp32 rstd or silu differ by an
    ulp and a rounding flips (the norm's flip can flip weight * norm's too: up to 3 bf16 steps
    seen; on the CPU interpreter with a round-to-nearest-even cast, 0 to 12 of 1.8M elements
    differed)."""
    from ninfer.ops.reference.dense import gated_rms_norm_ref

    dim, conv = 128, 2 * heads * 128
    proj = (torch.randn(tokens, conv + heads * dim + 2 * heads, device=DEV) * 2).to(dtype)
    z = proj[:, conv : conv + heads * dim].view(tokens, heads, dim)
    o = (torch.randn(tokens, heads, dim, device=DEV) * 3).to(dtype)
    w = (1 + 0.1 * torch.randn(dim, device=DEV)).to(w_dtype)
    assert glue.gated_norm_fits(o, z, w)
    out = glue.gated_norm(o, z, w, 1e-6)
    ref = gated_rms_norm_ref(o, z, w, 1e-6)
    assert out.shape == ref.shape and out.is_contiguous() and out.dtype == dtype
    if not tokens:
        return
    if dtype == torch.bfloat16:
        steps = bf16_ulps(out, ref)
        assert steps.max() <= 4 and (steps > 0).float().mean() < 1e-3
    else:
        assert rel(out, ref) < 1e-6
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


def test_gated_norm_layouts():
    """[T, D] rows (strided) are taken; D = 96, unequal shapes or a strided last dim are not
    (the compiled reference's)."""
    from ninfer.ops.reference.dense import gated_rms_norm_ref

    w = torch.randn(128, device=DEV)
    y = torch.randn(9, 2, 128, device=DEV)
    flat = glue.gated_norm(y[:, 0], y[:, 1], w, 1e-6)
    assert flat.shape == (9, 128) and flat.is_contiguous()
    torch.testing.assert_close(flat, gated_rms_norm_ref(y[:, 0], y[:, 1], w, 1e-6))
    x = torch.randn(4, 2, 96, device=DEV)
    assert not glue.gated_norm_fits(x, x, torch.ones(96, device=DEV))
    assert not glue.gated_norm_fits(y, y[:, :1], w)
    assert not glue.gated_norm_fits(y, torch.randn(9, 128, 2, device=DEV).transpose(1, 2), w)
    with pytest.raises(ValueError, match="gated_norm"):
        glue.gated_norm(x, x, torch.ones(96, device=DEV), 1e-6)
