"""Plain-PyTorch paged attention over the FlashInfer NHD page layout [pages, 2, 64, Hkv, D].

Page size is `ninfer.forward.PAGE_SIZE` (64). fp8 caches hold value / scale; reads multiply
the scale back. Knows nothing about how pages are allocated.
"""

from __future__ import annotations

import torch

from ninfer.page import PAGE_SIZE


def write_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> None:
    """Writes k, v [T, Hkv, D] into kv_cache [pages, 2, 64, Hkv, D] at slot_mapping [T] (page *
    64 + offset), dividing by the scales first when given. Mutates kv_cache."""
    pages, offsets = slot_mapping // PAGE_SIZE, slot_mapping % PAGE_SIZE
    for which, x, s in ((0, k, k_scale), (1, v, v_scale)):
        x = x.float() / s if s is not None else x
        kv_cache[pages, which, offsets] = x.to(kv_cache.dtype)


def gather_kv_ref(
    kv_cache: torch.Tensor, pages: torch.Tensor, length: int, which: int, scale: float | None
) -> torch.Tensor:
    """The first `length` positions of K (which=0) or V (which=1) stored in `pages` (ids in
    position order), dequantised to fp32 (fp64 stays fp64): [length, Hkv, D]."""
    x = kv_cache[pages, which].reshape(-1, *kv_cache.shape[-2:])[:length]
    x = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    return x * scale if scale is not None else x


def paged_attention_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    q_lens: list[int],
    ctx_lens: list[int],
    scale: float,
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of ragged query rows against their pages (K/V already written).

    q [T, Hq, D] (rows back to back, row r has q_lens[r] tokens at absolute positions
    ctx_lens[r] + i); block_table [R, max_pages]. Query i of row r sees positions
    [0, ctx_lens[r] + i]. GQA: q head h reads kv head h // (Hq // Hkv). Scores, softmax and the
    weighted sum are fp32 (fp64 for fp64 caches). Returns o [T, Hq, D] in q.dtype.
    """
    out = torch.empty_like(q)
    n_rep = q.shape[1] // kv_cache.shape[-2]
    start = 0
    for r, (n, ctx) in enumerate(zip(q_lens, ctx_lens, strict=True)):
        length = ctx + n
        pages = block_table[r, : -(-length // PAGE_SIZE)].long()
        keys = gather_kv_ref(kv_cache, pages, length, 0, k_scale)
        values = gather_kv_ref(kv_cache, pages, length, 1, v_scale)
        keys, values = (x.repeat_interleave(n_rep, dim=1).transpose(0, 1) for x in (keys, values))
        qr = q[start : start + n].to(keys.dtype).transpose(0, 1)  # [Hq, n, D]
        scores = qr @ keys.transpose(-1, -2) * scale  # [Hq, n, length]
        query_pos = torch.arange(ctx, length, device=q.device)[:, None]
        key_pos = torch.arange(length, device=q.device)[None, :]
        scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
        out[start : start + n] = (scores.softmax(dim=-1) @ values).transpose(0, 1).to(q.dtype)
        start += n
    return out
