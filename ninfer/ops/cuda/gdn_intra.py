"""The intra-chunk stage of the chunked gated delta rule, in one Triton launch.

**Not the engine's kernel: numerically unstable when a chunk's keys are correlated.** The
product of matmuls below equals (I + A)^-1 in exact arithmetic, but its factors A^(2^i) grow
like binomial coefficients when the keys point the same way (A[i, j] ~ beta for k_i = k_j), and
their rounding errors do not cancel. Against the float64 inverse (largest entry 1), with tf32
products: keys of mean cosine 0.7 and beta = 0.5, off by 1.8e3; one repeated key, beta = 0.5,
by 4.6e5, beta = 0.9 by 1.1e13; even fp32 products give 2.1e9 there; random keys, 7e-5
(`tools/gdn_inverse_stability.py`, CPU). A run of one repeated token is such a chunk, and
the engine's warm-up and prefill-graph capture passes repeat one token: with this kernel they
produce NaN states, which can reach a real row through the gathered attention's shared K/V
scratch (`ninfer.ops.cuda.attention`; found on the device: docs/results-h200.md, "the NaN's
cause was our GDN intra kernel"). Random test inputs (near-orthogonal keys) do not show it:
errors 2e-5 to 7e-5. So `OpChoices.gdn_intra` defaults to "fla" (fla's kkt + blocked triangular
solve: substitution, stable), and this kernel stays for the benchmarks that compare the two
(`tools/device/bench_gdn_intra.py`); making it stable (substitution on the 16 x 16 diagonal
blocks, products only to merge them, as fla does) is open.

For every 64-token chunk of a row and every value head h (key head h // group), with k the
chunk's keys [64, dk], beta [64], g [64] the chunk-local cumulative log2 decay:

    A    = strictly_lower(beta_i * (k_i . k_j) * 2^(g_i - g_j))     [64, 64]
    T    = (I + A)^-1
    w    = T @ (k * beta * 2^g)                                     [64, dk]
    u    = T @ (v * beta)                                           [64, dv]

which is what fla's `chunk_gated_delta_rule_fwd_intra` returns (its kkt + triangular solve
kernel, then its `recompute_w_u`), for the inter-chunk state pass and the output stage that
follow. Two differences, both for time: the inverse is not a row-by-row forward substitution
(fla's kernel runs 4 x 14 dependent steps of cross-thread reductions for it) but a product of
tensor-core matmuls, and T never leaves the registers (no [T, Hv, 64] buffer, no memset, no
second launch reading it back).

The inverse: A is strictly lower triangular, so A^64 = 0 and

    (I + A)^-1 = sum_{n < 64} (-A)^n = (I - A)(I + A^2)(I + A^4)(I + A^8)(I + A^16)(I + A^32)

ten 64 x 64 x 64 matmuls (five squarings, five products). In exact arithmetic it is the same
matrix; in floating point each product rounds differently from a substitution, so the GPU
tests bound both against a float64 solve. `SOLVE` picks the matmul precision: "tf32" for bf16
inputs (T is rounded to bf16 before the output matmuls, as fla does, which dominates the
error, for tf32, tf32x3 and fla alike), "tf32x3" (three tf32 products, about fp32 accuracy,
twice the time) for fp32 inputs. Its time against fla's (`tools/device/bench_gdn_intra.py`):
docs/results-h200.md, "our own GDN intra kernel".

Varlen layout as fla's: k [1, T, Hk, dk], v [1, T, Hv, dv], beta [1, T, Hv], g [1, T, Hv]
fp32, all contiguous; `cu_seqlens` [R + 1] and `chunk_indices` [NC, 2] (row, chunk in row)
from the pass's `PassMeta`. No host sync, capturable in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.ops.cuda.passmeta import CHUNK


@triton.jit
def _wy_kernel(
    k, v, g, beta, w, u, cu_seqlens, chunk_indices,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    SOLVE: tl.constexpr, OUT: tl.constexpr,
):  # fmt: skip
    """One program: chunk c of the pass (its row and index from `chunk_indices`), value head
    h. SOLVE: the precision of the inverse's matmuls; OUT: that of the two output matmuls."""
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    row = tl.load(chunk_indices + 2 * i_c)
    j = tl.load(chunk_indices + 2 * i_c + 1)
    bos = tl.load(cu_seqlens + row)
    n = tl.load(cu_seqlens + row + 1) - bos
    o_t = j * BT + tl.arange(0, BT)
    m_t = o_t < n
    tok = (bos + o_t).to(tl.int64)
    hk = i_h // (HV // H)
    o_k = tl.arange(0, K)
    o_v = tl.arange(0, V)
    p_k = k + (tok * H + hk)[:, None] * K + o_k[None, :]
    b_k = tl.load(p_k, mask=m_t[:, None], other=0.0)
    b_b = tl.load(beta + tok * HV + i_h, mask=m_t, other=0.0)
    b_g = tl.load(g + tok * HV + i_h, mask=m_t, other=0.0)

    o_i = tl.arange(0, BT)
    lower = (o_i[:, None] > o_i[None, :]) & m_t[:, None] & m_t[None, :]
    b_a = tl.dot(b_k, tl.trans(b_k), input_precision=OUT, out_dtype=tl.float32)
    decay = tl.exp2(tl.where(lower, b_g[:, None] - b_g[None, :], 0.0))
    b_m = tl.where(lower, -b_a * decay * b_b.to(tl.float32)[:, None], 0.0)  # -A
    eye = (o_i[:, None] == o_i[None, :]).to(tl.float32)
    b_t = eye + b_m
    for _ in tl.static_range(5):  # b_m: A^2, A^4, ..., A^32 (signs: (-A)^(2^i) = A^(2^i))
        b_m = tl.dot(b_m, b_m, input_precision=SOLVE)
        b_t += tl.dot(b_t, b_m, input_precision=SOLVE)
    b_t = b_t.to(k.dtype.element_ty)

    p_v = v + (tok * HV + i_h)[:, None] * V + o_v[None, :]
    b_v = tl.load(p_v, mask=m_t[:, None], other=0.0)
    b_vb = (b_v * b_b[:, None]).to(b_v.dtype)
    b_u = tl.dot(b_t, b_vb, input_precision=OUT)
    p_u = u + (tok * HV + i_h)[:, None] * V + o_v[None, :]
    tl.store(p_u, b_u.to(u.dtype.element_ty), mask=m_t[:, None])

    b_kb = (b_k * b_b[:, None] * tl.exp2(b_g)[:, None]).to(b_k.dtype)
    b_w = tl.dot(b_t, b_kb, input_precision=OUT)
    p_w = w + (tok * HV + i_h)[:, None] * K + o_k[None, :]
    tl.store(p_w, b_w.to(w.dtype.element_ty), mask=m_t[:, None])


def wy_repr(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    chunk_indices: torch.Tensor,
    solve: str | None = None,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, u) of the module docstring: w [1, T, Hv, dk] in k's dtype, u [1, T, Hv, dv] in v's.
    `solve`: the inverse's matmul precision (None: "tf32" for bf16 inputs, "tf32x3" for fp32).
    fp32 inputs take fp32 output matmuls ("ieee"); bf16 inputs tensor-core bf16 ones."""
    _, _, hk, dk = k.shape
    hv, dv = v.shape[2], v.shape[3]
    if hv % hk or not all(x.is_contiguous() for x in (k, v, g, beta)):
        raise ValueError("wy_repr: contiguous k, v, g, beta with Hv a multiple of Hk")
    w = k.new_empty(1, k.shape[1], hv, dk)
    u = torch.empty_like(v)
    fp32 = k.dtype == torch.float32
    out = "ieee" if fp32 else "tf32"  # bf16 operands ignore it
    solve = solve or ("tf32x3" if fp32 else "tf32")
    _wy_kernel[(chunk_indices.shape[0], hv)](
        k, v, g, beta, w, u, cu_seqlens, chunk_indices,
        H=hk, HV=hv, K=dk, V=dv, BT=CHUNK, SOLVE=solve, OUT=out, num_warps=num_warps,
    )  # fmt: skip
    return w, u
