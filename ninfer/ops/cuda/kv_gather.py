"""Copies each row's K and V, page by page, out of the paged cache into two contiguous token
buffers, so that FlashInfer's ragged prefill kernel can attend over a cached context (the
gathered path of `attention.PagedAttention`).

Why: FlashInfer's fa3 paged prefill loads K/V tiles through the page table and runs well
below the ragged kernel over contiguous K/V at head_dim 256; with many queries per row the
gather costs a small part of the attention time it saves, with few it costs more than it saves,
so the caller decides per pass (`attention.gather_pays`). Measured with
`tools/device/bench_prefix_attention.py`: docs/results-h200.md, "gathered attention
over a cached context".

Layout: cache [pages, 2, 64, Hkv, D] (K plane 0, V plane 1; each page's planes contiguous);
row r's pages are indices[page_indptr[r] : page_indptr[r + 1]] and its kv_len tokens land at
[tok_indptr[r], tok_indptr[r + 1]) of k_out, v_out [tokens, Hkv, D] (contiguous). The launch
grid may exceed the pages (a CUDA graph's fixed grid): programs past page_indptr[rows] do
nothing. No host sync; capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.page import PAGE_SIZE


@triton.jit
def _gather_kv_kernel(
    cache, k_out, v_out, indices, page_indptr, tok_indptr, rows, s_page, s_plane,
    WIDTH: tl.constexpr, BLOCK: tl.constexpr, PAGE: tl.constexpr,
):  # fmt: skip
    """One program: page p of the pass (in row order), columns [c * BLOCK, (c + 1) * BLOCK)
    of its Hkv * D token width; both planes."""
    p, c = tl.program_id(0), tl.program_id(1)
    if p < tl.load(page_indptr + rows):
        r = p * 0
        for i in range(1, rows):  # the row holding page p: rows is small
            r += (tl.load(page_indptr + i) <= p).to(tl.int32)
        j = p - tl.load(page_indptr + r)
        start = tl.load(tok_indptr + r)
        n = tl.load(tok_indptr + r + 1) - start
        page = tl.load(indices + p).to(tl.int64)
        o_t = tl.arange(0, PAGE)
        valid = (j * PAGE + o_t < n)[:, None]
        o_c = c * BLOCK + tl.arange(0, BLOCK)
        src = cache + page * s_page + o_t[:, None] * WIDTH + o_c[None, :]
        dst = (start + j * PAGE + o_t).to(tl.int64)[:, None] * WIDTH + o_c[None, :]
        tl.store(k_out + dst, tl.load(src, mask=valid), mask=valid)
        tl.store(v_out + dst, tl.load(src + s_plane, mask=valid), mask=valid)


def gather_kv(
    cache: torch.Tensor,
    indices: torch.Tensor,
    page_indptr: torch.Tensor,
    tok_indptr: torch.Tensor,
    rows: int,
    grid_pages: int,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
) -> None:
    """Fills k_out, v_out (module docstring) on the GPU. `grid_pages` >= page_indptr[rows]:
    the launch's page programs."""
    _, planes, page, hkv, dim = cache.shape
    width = hkv * dim
    if planes != 2 or page != PAGE_SIZE or cache[0, 0].stride() != (width, dim, 1):
        raise ValueError("gather_kv: cache [pages, 2, 64, Hkv, D] with contiguous planes")
    if not (k_out.is_contiguous() and v_out.is_contiguous()):
        raise ValueError("gather_kv: contiguous k_out and v_out")
    block = min(width, 256)
    if width % block or block & (block - 1):
        raise ValueError(f"gather_kv: Hkv * D = {width} is not a multiple of a power of two")
    _gather_kv_kernel[(grid_pages, width // block)](
        cache, k_out, v_out, indices, page_indptr, tok_indptr, rows,
        cache.stride(0), cache.stride(1), WIDTH=width, BLOCK=block, PAGE=PAGE_SIZE,
        num_warps=4,
    )  # fmt: skip
