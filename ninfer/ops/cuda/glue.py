"""Glue kernels in Triton: SwiGLU over the (strided) halves of the fused gate | up projection,
where the compiled torch version is slow, the K/V write of an attention layer in one launch
(the torch version takes six small kernels at decode: the row arithmetic and two index_copy_),
the attention's q / k norm + partial RoPE in one launch per tensor, and its sigmoid output gate
(compiled, those two read the strided q | gate halves at a fraction of the copy rate), and the
GDN layer's gated RMSNorm over the strided z view of the fused in_proj (compiled, it stays well
off its copy bound). Measured: docs/results-h200.md, "GDN prefill glue, host time".

`torch.compile(dynamic=True)` turns `silu(gate) * up` into one kernel over a flat index, which
it splits into (row, column) with a runtime 64-bit division per element, and that division
bounds it well below the copy rate on prefill-sized halves (measured: docs/results-h200.md,
"overlapped decode, fewer launches"). Here a 2-D grid (row, column block) needs no division. Math
in fp32, one rounding to the output dtype (as the compiled version). Knows nothing about the
model.
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


@triton.jit
def _norm_rope_kernel(
    x, w, y, pos, inv_freq, n_heads, eps, s_xt, s_xh, s_yt, s_yh,
    D: tl.constexpr, HALF: tl.constexpr, BH: tl.constexpr,
):  # fmt: skip
    """Token t, heads [hb * BH, (hb + 1) * BH): zero-centred RMSNorm over D (fp32, rounded to
    y's dtype), then NeoX RoPE on dims [0, 2 * HALF) with cos / sin in fp32 rounded to y's
    dtype, the rotation in fp32 with one rounding (as the compiled reference ops compute it)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    h_ok = h < n_heads
    d = tl.arange(0, D)
    src = x + t * s_xt + h[:, None] * s_xh
    dst = y + t * s_yt + h[:, None] * s_yh
    xf = tl.load(src + d[None, :], mask=h_ok[:, None], other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / D + eps)  # [BH]
    wf = 1.0 + tl.load(w + d).to(tl.float32)
    out = (xf * rstd[:, None] * wf[None, :]).to(y.dtype.element_ty)
    rest = h_ok[:, None] & (d >= 2 * HALF)[None, :]
    tl.store(dst + d[None, :], out, mask=rest)
    i = tl.arange(0, HALF)
    freq = tl.load(pos + t).to(tl.float32) * tl.load(inv_freq + i).to(tl.float32)
    cos = tl.cos(freq).to(y.dtype.element_ty).to(tl.float32)[None, :]
    sin = tl.sin(freq).to(y.dtype.element_ty).to(tl.float32)[None, :]
    m = h_ok[:, None]
    x1 = tl.load(src + i[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + i[None, :], mask=m, other=0.0).to(tl.float32)
    n1 = x1 * rstd[:, None] * (1.0 + tl.load(w + i).to(tl.float32))[None, :]
    n2 = x2 * rstd[:, None] * (1.0 + tl.load(w + HALF + i).to(tl.float32))[None, :]
    n1 = n1.to(y.dtype.element_ty).to(tl.float32)
    n2 = n2.to(y.dtype.element_ty).to(tl.float32)
    tl.store(dst + i[None, :], (n1 * cos - n2 * sin).to(y.dtype.element_ty), mask=m)
    tl.store(dst + HALF + i[None, :], (n2 * cos + n1 * sin).to(y.dtype.element_ty), mask=m)


def norm_rope_fits(x: torch.Tensor, rotary_dim: int) -> bool:
    """Whether `norm_rope` takes x [T, H, D]: D and rotary_dim / 2 powers of two (>= 2),
    rotary_dim <= D, unit stride along D."""
    dim = x.shape[-1]
    half = rotary_dim // 2
    pow2 = dim & (dim - 1) == 0 and half >= 1 and half & (half - 1) == 0
    return x.dim() == 3 and pow2 and rotary_dim % 2 == 0 and rotary_dim <= dim and x.stride(2) == 1


def norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    rotary_dim: int,
) -> torch.Tensor:
    """`rope(rms_norm(x, weight, eps), ...)` of one of q, k [T, H, D] (any token and head
    strides, e.g. q's half of the interleaved q | gate projection) in one launch; positions
    [T] int, inv_freq [rotary_dim / 2] fp32. Returns a contiguous [T, H, D] in x.dtype.
    Needs `norm_rope_fits`."""
    if not norm_rope_fits(x, rotary_dim):
        raise ValueError(f"norm_rope: x {tuple(x.shape)}, rotary_dim {rotary_dim}")
    n_tok, heads, dim = x.shape
    y = torch.empty((n_tok, heads, dim), dtype=x.dtype, device=x.device)
    if n_tok:
        bh = min(4, triton.next_power_of_2(heads))
        _norm_rope_kernel[(n_tok, triton.cdiv(heads, bh))](
            x, weight, y, positions, inv_freq, heads, eps, x.stride(0), x.stride(1),
            y.stride(0), y.stride(1), D=dim, HALF=rotary_dim // 2, BH=bh, num_warps=4,
        )  # fmt: skip
    return y


@triton.jit
def _gate_kernel(x, g, o, n_heads, s_xt, s_xh, s_gt, s_gh, D: tl.constexpr, BH: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    m = (h < n_heads)[:, None]
    d = tl.arange(0, D)[None, :]
    a = tl.load(x + t * s_xt + h[:, None] * s_xh + d, mask=m, other=0.0).to(tl.float32)
    b = tl.load(g + t * s_gt + h[:, None] * s_gh + d, mask=m, other=0.0).to(tl.float32)
    out = a * tl.sigmoid(b)
    tl.store(o + (t * n_heads + h[:, None]) * D + d, out.to(o.dtype.element_ty), mask=m)


def gate_fits(x: torch.Tensor, gate: torch.Tensor) -> bool:
    """Whether `sigmoid_gate` takes (x, gate): both [T, H, D] of one shape and dtype, D a power
    of two, unit stride along D."""
    dim = x.shape[-1]
    return (
        x.dim() == 3
        and x.shape == gate.shape
        and x.dtype == gate.dtype
        and dim & (dim - 1) == 0
        and x.stride(2) == gate.stride(2) == 1
    )


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate) for x, gate [T, H, D] (any token and head strides: the attention
    output and the gate half of the q | gate projection), fp32 math, one rounding. Returns a
    contiguous [T, H, D]. Needs `gate_fits`."""
    if not gate_fits(x, gate):
        raise ValueError(f"sigmoid_gate: x {tuple(x.shape)}, gate {tuple(gate.shape)}")
    n_tok, heads, dim = x.shape
    out = torch.empty((n_tok, heads, dim), dtype=x.dtype, device=x.device)
    if n_tok:
        bh = min(4, triton.next_power_of_2(heads))
        _gate_kernel[(n_tok, triton.cdiv(heads, bh))](
            x, gate, out, heads, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
            D=dim, BH=bh, num_warps=4,
        )  # fmt: skip
    return out


@triton.jit
def _gated_norm_kernel(
    x, z, w, o, n_rows, n_heads, eps, s_xt, s_xh, s_zt, s_zh,
    D: tl.constexpr, BLOCK_R: tl.constexpr, ROUND_WN: tl.constexpr,
):  # fmt: skip
    """Rows [pid * BLOCK_R, (pid + 1) * BLOCK_R) of the flat (token, head) rows: RMSNorm over D
    in fp32 rounded to x's dtype, times weight (rounded to x's dtype when ROUND_WN: torch's
    promotion of a 16-bit weight times the 16-bit norm), times silu(z) in fp32, one rounding."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = (r < n_rows)[:, None]
    t, h = (r // n_heads).to(tl.int64), (r % n_heads).to(tl.int64)
    d = tl.arange(0, D)[None, :]
    xf = tl.load(x + (t * s_xt + h * s_xh)[:, None] + d, mask=r_ok, other=0.0).to(tl.float32)
    zf = tl.load(z + (t * s_zt + h * s_zh)[:, None] + d, mask=r_ok, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)
    n = (xf * rstd[:, None]).to(o.dtype.element_ty).to(tl.float32)
    wn = tl.load(w + d).to(tl.float32) * n
    if ROUND_WN:
        wn = wn.to(o.dtype.element_ty).to(tl.float32)
    out = wn * tl.div_rn(zf, 1.0 + tl.exp(-zf))  # silu as torch: z / (1 + exp(-z))
    tl.store(o + r.to(tl.int64)[:, None] * D + d, out.to(o.dtype.element_ty), mask=r_ok)


def gated_norm_fits(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `gated_norm` takes (x, z, weight): x, z [T, H, D] or [T, D] of one shape, unit
    stride along D, D a power of two <= 256, weight [D] contiguous, 16- or 32-bit floats."""
    dim = x.shape[-1]
    return (
        x.dim() in (2, 3)
        and x.shape == z.shape
        and weight.shape == (dim,)
        and weight.stride(0) == 1
        and 0 < dim <= 256
        and dim & (dim - 1) == 0
        and x.stride(-1) == z.stride(-1) == 1
        and all(t.dtype in (torch.bfloat16, torch.float16, torch.float32) for t in (x, z, weight))
    )


def gated_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`gated_rms_norm_ref` (rms_norm(x) * weight * silu(z), weight plain) for x, z [T, H, D] or
    [T, D] (any token and head strides: z is a view of the fused GDN in_proj), with the
    reference's roundings: the norm to x's dtype, weight * norm to their promoted dtype, the
    result to x's dtype. BLOCK_R = 16 rows of D a program, so that bf16 rows of 128 load in
    16-byte vectors and programs are not tiny. Returns a contiguous tensor shaped like x.
    Needs `gated_norm_fits`."""
    if not gated_norm_fits(x, z, weight):
        raise ValueError(f"gated_norm: x {tuple(x.shape)}, z {tuple(z.shape)}, w {weight.shape}")
    x3, z3 = (x, z) if x.dim() == 3 else (x[:, None], z[:, None])
    n_tok, heads, dim = x3.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows, block_r = n_tok * heads, 16
    if rows:
        # a 16-bit promotion means weight and x share that dtype: round weight * norm to x's
        round_wn = torch.promote_types(weight.dtype, x.dtype) != torch.float32
        _gated_norm_kernel[(triton.cdiv(rows, block_r),)](
            x3, z3, weight, out, rows, heads, eps, x3.stride(0), x3.stride(1), z3.stride(0),
            z3.stride(1), D=dim, BLOCK_R=block_r, ROUND_WN=round_wn, num_warps=4,
        )  # fmt: skip
    return out
