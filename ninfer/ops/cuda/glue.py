"""Glue kernels in Triton: SwiGLU over the (strided) halves of the fused gate | up projection,
where the compiled torch version is slow, and the K/V write of an attention layer in one launch
(the torch version takes six small kernels at decode: the row arithmetic and two index_copy_).

`torch.compile(dynamic=True)` turns `silu(gate) * up` into one kernel over a flat index, which
it splits into (row, column) with a runtime 64-bit division per element; on the 27B's prefill
([8192, 17408] halves) that kernel ran at a third of the copy rate (0.59 ms, profile of the
third session). Here a 2-D grid (row, column block) needs no division. Math in fp32, one
rounding to the output dtype (as the compiled version). Knows nothing about the model.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _silu_mul_kernel(g, u, o, n_cols, s_g, s_u, s_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < n_cols
    a = tl.load(g + row * s_g + cols, mask=m, other=0.0).to(tl.float32)
    b = tl.load(u + row * s_u + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(o + row * s_o + cols, (a * tl.sigmoid(a) * b).to(o.dtype.element_ty), mask=m)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate, up [T, I] with unit column stride (any row strides, e.g. the
    two halves of one [T, 2I] projection). Returns a contiguous [T, I] in gate.dtype."""
    if gate.shape != up.shape or gate.dim() != 2 or gate.stride(1) != 1 or up.stride(1) != 1:
        raise ValueError(f"silu_mul: [T, I] halves with unit column stride, got {gate.shape}")
    rows, cols = gate.shape
    out = torch.empty((rows, cols), dtype=gate.dtype, device=gate.device)
    if rows:
        grid = (rows, triton.cdiv(cols, BLOCK))
        _silu_mul_kernel[grid](
            gate, up, out, cols, gate.stride(0), up.stride(0), out.stride(0), BLOCK=BLOCK,
            num_warps=4,
        )  # fmt: skip
    return out


@triton.jit
def _write_kv_kernel(
    k, v, cache, slots, s_kt, s_kh, s_vt, s_vh, s_page, s_kv, s_off, s_h,
    D: tl.constexpr, PAGE: tl.constexpr,
):  # fmt: skip
    """Token t, kv head h: K and V rows of D values to (page, 0 | 1, offset, h)."""
    t, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    slot = tl.load(slots + t).to(tl.int64)
    dst = cache + (slot // PAGE) * s_page + (slot % PAGE) * s_off + h * s_h + tl.arange(0, D)
    tl.store(dst, tl.load(k + t * s_kt + h * s_kh + tl.arange(0, D)))
    tl.store(dst + s_kv, tl.load(v + t * s_vt + h * s_vh + tl.arange(0, D)))


def write_kv_rows(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v [T, Hkv, D] (unit last stride, D a power of two, kv_cache's dtype) to slot_mapping
    [T] (page * 64 + offset) of kv_cache [pages, 2, 64, Hkv, D] (`attention.write_kv`)."""
    if k.shape[0]:
        _write_kv_kernel[(k.shape[0], k.shape[1])](
            k, v, kv_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
            D=k.shape[-1], PAGE=kv_cache.shape[2], num_warps=2,
        )  # fmt: skip
