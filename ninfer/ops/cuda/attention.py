"""Paged causal attention on FlashInfer, over the NHD page layout [pages, 2, 64, Hkv, D].

Every forward pass plans once (on the host lists of its `ForwardBatch`) and all attention layers
of that pass reuse the plan. Four paths, by pass:

- a decode batch (every row one token after a cached context):
  `BatchDecodeWithPagedKVCacheWrapper` with tensor cores;
- a prefill pass whose rows all start a sequence (no cached context: a cold prompt, its first
  chunk), run eagerly: `BatchPrefillWithRaggedKVCacheWrapper` over the pass's own k and v,
  when the cache holds them unscaled in their dtype (faster than the paged kernel over the
  same tokens: docs/results-h200.md, "honest MFU, ragged attention");
- the gathered path: a prefill pass over a cached context with enough queries per KV head
  (`gather_pays`; a long prompt's later chunks, a cached turn's new tokens, every gathered
  bucket of the prefill graphs), an unscaled cache in the queries' dtype, at most
  `GATHER_SCRATCH_BYTES` of K/V to copy: each row's K and V
  pages are copied into contiguous buffers (`kv_gather`, one launch) and the ragged kernel
  attends over them, queries aligned to the end of the keys as the paged kernel aligns them
  (`tools/device/bench_prefix_attention.py`; docs/results-h200.md, "gathered attention over
  a cached context");
- anything else `BatchPrefillWithPagedKVCacheWrapper` (fa3 on sm_90 for bf16; fa2 for bf16 q
  over an fp8 cache).

K/V are written to the pages first on every path, by one Triton launch (`write_kv`;
`index_copy_` for scaled fp8), graph-safe.
Knows nothing about the model.

The CUDA graphs (`ninfer.engine.executor.graphs`) use these hooks. Decode takes
`graph_wrapper(bs, kv_dtype, ...)`: a decode wrapper with `use_cuda_graph=True` over fixed
metadata buffers (one per captured batch size); `plan(...)` plans a given wrapper for a batch
from metadata the caller built (pinned host indptr / last_page_len, device indices), OUTSIDE the
graph, before every capture and replay. While `frozen` is set (during capture) the forward never
plans: every layer runs the wrapper planned last. Prefill takes
`prefill_graph_wrapper(...)`: a paged one, planned the same way.

Prefill graphs stay on the paged path: FlashInfer's fa3 ragged kernel (the gathered path's)
reads a row's last K/V tile whole, past the row's end into the next row's; those scores are
masked, but P = 0 times a non-finite V is NaN, and a graph bucket's right neighbour is its
padding row on the shared scratch slot and page. Gathered graph buckets were not faster through
the engine either (docs/results-h200.md, "a NaN in gathered graph replays").

Plans never overtake a queued pass: FlashInfer's plan() writes its work schedule into the
wrapper's one page-locked buffer and queues an asynchronous copy of it to the device; a second
plan() before the GPU has run that copy rewrites the buffer under it, and the earlier pass then
runs the later pass's schedule (an illegal address, or silently wrong rows, when the host runs
a pass ahead, as with eager chunks of a long prompt). So every plan() first waits for
the event recorded after the wrapper's previous one (`_PlanGuard`); it only ever waits when the
host is a whole pass ahead of the GPU.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

import torch

from ninfer.forward import ForwardBatch
from ninfer.ops.choices import OpChoices
from ninfer.ops.cuda.host import pinned, to_device
from ninfer.page import PAGE_SIZE

WORKSPACE_BYTES = 256 << 20
GATHER_SCRATCH_BYTES = 2 << 30  # the most K/V one gathered pass may copy
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def page_metadata(
    batch: ForwardBatch,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer CSR page metadata of a ragged batch.

    Returns qo_indptr [R+1], kv_indptr [R+1], last_page_len [R] (pinned host int32) and
    kv_indices [kv_indptr[-1]] (device int32, gathered from batch.block_table).

        row r: kv_len = ctx_lens[r] + q_lens[r]; pages block_table[r, 0 .. ceil(kv_len / 64))
    """
    kv_lens = [c + q for c, q in zip(batch.ctx_lens, batch.q_lens, strict=True)]
    n_pages = [(n + PAGE_SIZE - 1) // PAGE_SIZE for n in kv_lens]
    rows = [r for r, n in enumerate(n_pages) for _ in range(n)]
    cols = [j for n in n_pages for j in range(n)]
    dev = batch.block_table.device
    indices = batch.block_table[to_device(rows, dev), to_device(cols, dev)].to(torch.int32)
    return (
        pinned([0, *itertools.accumulate(batch.q_lens)]),
        pinned([0, *itertools.accumulate(n_pages)]),
        pinned([(n - 1) % PAGE_SIZE + 1 for n in kv_lens]),
        indices,
    )


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float | None,
    v_scale: float | None,
) -> None:
    """Stores k, v [T, Hkv, D] at slot_mapping [T] (page * 64 + offset) of the contiguous
    kv_cache [pages, 2, 64, Hkv, D], divided by the scales first when given. In place.

    Same dtype, no scales: one Triton launch for K and V (a decode step's attention layer
    would otherwise launch six small kernels: the row arithmetic and two `index_copy_`).
    Otherwise, in the flat view [pages * 2 * 64, Hkv, D], K of (page, off) is row
    page * 128 + off and V is 64 rows further, written by `index_copy_`.
    """
    same = k.dtype == v.dtype == kv_cache.dtype and k_scale is None and v_scale is None
    dim = k.shape[-1]
    if same and kv_cache.is_cuda and k.stride(-1) == v.stride(-1) == 1 and dim & (dim - 1) == 0:
        from ninfer.ops.cuda.glue import write_kv_rows

        write_kv_rows(k, v, kv_cache, slot_mapping)
        return
    bits = _BITS[kv_cache.element_size()]  # index_copy_ has no fp8 kernel: copy the bits
    flat = kv_cache.view(bits).view(-1, *kv_cache.shape[-2:])
    k_rows = slot_mapping + (slot_mapping // PAGE_SIZE) * PAGE_SIZE
    for rows, x, s in ((k_rows, k, k_scale), (k_rows + PAGE_SIZE, v, v_scale)):
        x = x.float() / s if s is not None else x
        flat.index_copy_(0, rows, x.to(kv_cache.dtype).view(bits))


def gather_pays(q_lens: list[int], ctx_lens: list[int], group: int, min_rows: float) -> bool:
    """Whether a prefill pass should take the gathered path: attention saved grows with the
    query rows (q_len x group) times the KV tokens, the gather's copy with the KV tokens."""
    kv = [c + q for c, q in zip(ctx_lens, q_lens, strict=True)]
    return sum(q * n for q, n in zip(q_lens, kv, strict=True)) * group >= min_rows * sum(kv)


def _gather(kv_cache: torch.Tensor, g: _Gathered) -> None:
    """Fills g.k, g.v with each row's K and V from `kv_cache`: `kv_gather` (one Triton launch)
    on CUDA; the same copy in torch elsewhere (CPU tests over a stand-in FlashInfer)."""
    if kv_cache.is_cuda:
        from ninfer.ops.cuda.kv_gather import gather_kv

        gather_kv(kv_cache, g.indices, g.page_indptr, g.tok_indptr, g.rows, g.grid_pages, g.k, g.v)
        return
    pages, tokens = g.page_indptr.tolist(), g.tok_indptr.tolist()
    shape = kv_cache.shape[-2:]
    for r in range(g.rows):
        rows = g.indices[pages[r] : pages[r + 1]].long()
        a, b = tokens[r], tokens[r + 1]
        for out, plane in ((g.k, 0), (g.v, 1)):
            out[a:b] = kv_cache[rows, plane].reshape(-1, *shape)[: b - a]


def _kv_bytes(tokens: int, hkv: int, dim: int, dtype: torch.dtype) -> int:
    """Bytes of the gathered path's K and V buffers for `tokens` KV tokens."""
    return 2 * tokens * hkv * dim * dtype.itemsize


@dataclass(slots=True)
class _Gathered:
    """The gathered path of one plan: the ragged wrapper, the gather's device tables (row r's
    pages indices[page_indptr[r]:page_indptr[r + 1]], its tokens at tok_indptr[r]:...) and
    launch grid, and the K/V buffers it fills; each gathered pass plans a fresh one."""

    wrapper: object
    indices: torch.Tensor
    page_indptr: torch.Tensor
    tok_indptr: torch.Tensor
    rows: int
    grid_pages: int
    k: torch.Tensor
    v: torch.Tensor


class _PlanGuard:
    """Per FlashInfer wrapper, the event recorded after its last plan() (module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"  # else (CPU tests over a stand-in FlashInfer): no-op
        self._events: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.waits = 0  # plans that found the previous copy still queued (tests, benchmarks)

    def plan(self, wrapper, *args, **kwargs) -> None:
        """`wrapper.plan(*args, **kwargs)`, once the GPU has run the wrapper's previous plan
        copy; then records the event that the next plan of `wrapper` waits for."""
        if not self._cuda:
            wrapper.plan(*args, **kwargs)
            return
        event = self._events.get(wrapper)
        if event is not None and not event.query():
            self.waits += 1
            event.synchronize()
        wrapper.plan(*args, **kwargs)
        event = torch.cuda.Event()
        event.record()
        self._events[wrapper] = event


class PagedAttention:
    """The attention op of `CudaOps`: holds the FlashInfer wrappers and the current plan.
    `choices`: its gathered path's threshold (`gather_min_rows`), fixed here."""

    def __init__(self, device: torch.device, choices: OpChoices | None = None) -> None:
        import flashinfer

        self._flashinfer = flashinfer
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrappers: dict[tuple[bool, torch.dtype], object] = {}
        self._plan_batch: ForwardBatch | None = None
        self._plan_key: tuple | None = None
        self._wrapper = None
        self._ragged = None  # the ragged prefill wrapper, made at the first fresh pass
        self._ragged_key: tuple | None = None
        self._ragged_batch: ForwardBatch | None = None
        self.ragged_passes = 0  # passes planned (so run) on the ragged wrapper: tests, benchmarks
        self._gather: _Gathered | None = None  # the current plan's, when it is gathered
        self._gather_ragged = None  # the gathered path's ragged wrapper
        self.choices = choices or OpChoices()
        self.gathered_passes = 0  # plans on the gathered path: tests, benchmarks
        self.frozen = False  # set by the graph runner while capturing: never plan in the forward
        self.guard = _PlanGuard(device)

    def _get_wrapper(self, decode: bool, kv_dtype: torch.dtype):
        """One wrapper per (decode, kv dtype): a wrapper fixes its backend at its first plan
        (fa3 for a bf16 cache, which cannot run bf16 queries over an fp8 cache)."""
        key = (decode, kv_dtype)
        if key not in self._wrappers:
            fi = self._flashinfer
            self._wrappers[key] = (
                fi.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD", use_tensor_cores=True)
                if decode
                else fi.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
            )
        return self._wrappers[key]

    def graph_wrapper(self, bs: int, kv_dtype: torch.dtype, indices_buf: torch.Tensor):
        """A decode wrapper for exactly `bs` rows, capturable in a CUDA graph: its indptr and
        last_page_len buffers are its own, `indices_buf` (int32, on the device) may be shared by
        the wrappers of every batch size. `kv_dtype` is recorded for the caller only."""
        dev = self._workspace.device
        return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=torch.zeros(bs + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=indices_buf,
            paged_kv_last_page_len_buffer=torch.ones(bs, dtype=torch.int32, device=dev),
        )  # fmt: skip

    def prefill_graph_wrapper(self, rows: int, indices_buf: torch.Tensor, backend: str = "auto"):
        """A paged prefill wrapper for exactly `rows` rows, capturable in a CUDA graph (the
        prefill graphs, `ninfer.engine.executor.graphs`; the verify graphs pass
        `choices.verify_backend`): its indptr and last_page_len buffers are its own,
        `indices_buf` (int32, on the device) may be shared."""
        i32 = dict(dtype=torch.int32, device=self._workspace.device)
        return self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_cuda_graph=True, backend=backend,
            qo_indptr_buf=torch.zeros(rows + 1, **i32),
            paged_kv_indptr_buf=torch.zeros(rows + 1, **i32),
            paged_kv_indices_buf=indices_buf,
            paged_kv_last_page_len_buf=torch.ones(rows, **i32),
        )  # fmt: skip

    def plan(
        self,
        batch: ForwardBatch,
        shape: tuple[int, int, int, torch.dtype, torch.dtype, float],
        wrapper=None,
        metadata: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        limits: tuple[int, int] | None = None,
    ) -> None:
        """Plans `batch` now. shape = (Hq, Hkv, head_dim, q dtype, kv dtype, scale).
        `wrapper`: a `graph_wrapper` or `prefill_graph_wrapper` instead of the eager one;
        `metadata`: (qo_indptr, kv_indptr, last_page_len, kv_indices) as `page_metadata`
        returns them (host lists pinned, indices on the device), else built from `batch`;
        `limits`: (max query tokens per row, max KV tokens per row) for a prefill plan, fixed
        for a captured graph (FlashInfer passes them to the kernel call, which a replay
        repeats as captured)."""
        hq, hkv, dim, q_dtype, kv_dtype, scale = shape
        qo_indptr, kv_indptr, last_len, indices = metadata or page_metadata(batch)
        dtypes = {"q_data_type": q_dtype, "kv_data_type": kv_dtype, "sm_scale": scale}
        self._plan_batch = batch
        self._plan_key = (tuple(batch.q_lens), tuple(batch.ctx_lens), *shape)
        self._gather = None
        kv_tokens = sum(batch.ctx_lens) + sum(batch.q_lens)
        gathers = (
            wrapper is None
            and not batch.is_decode
            and q_dtype == kv_dtype
            and _kv_bytes(kv_tokens, hkv, dim, kv_dtype) <= GATHER_SCRATCH_BYTES
            and gather_pays(batch.q_lens, batch.ctx_lens, hq // hkv, self.choices.gather_min_rows)
        )
        if gathers:
            self._plan_gathered(shape, qo_indptr, kv_indptr, last_len, indices)
            return
        self._wrapper = wrapper or self._get_wrapper(batch.is_decode, kv_dtype)
        if batch.is_decode:
            self.guard.plan(
                self._wrapper, kv_indptr, indices, last_len, hq, hkv, dim, PAGE_SIZE, **dtypes
            )
        else:
            if limits is not None:
                dtypes |= {"max_token_per_sequence": limits[0], "max_sequence_kv": limits[1]}
            self.guard.plan(
                self._wrapper, qo_indptr, kv_indptr, indices, last_len, hq, hkv, dim, PAGE_SIZE,
                causal=True, **dtypes,
            )  # fmt: skip

    def _plan_gathered(self, shape, qo_indptr, kv_indptr, last_len, indices) -> None:
        """Plans the gathered path (module docstring) from page metadata, on a fresh
        `_Gathered` over the ragged wrapper and buffers for this pass."""
        hq, hkv, dim, q_dtype, kv_dtype, scale = shape
        pages, last = kv_indptr.tolist(), last_len.tolist()
        spans = zip(pages[:-1], pages[1:], last, strict=True)
        kv_lens = [(b - a - 1) * PAGE_SIZE + n for a, b, n in spans]
        tok_indptr = pinned([0, *itertools.accumulate(kv_lens)])
        rows, tokens = len(kv_lens), sum(kv_lens)
        dev = self._workspace.device
        if self._gather_ragged is None:
            self._gather_ragged = self._flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
                self._workspace, "NHD"
            )
        k, v = (torch.empty(tokens, hkv, dim, dtype=kv_dtype, device=dev) for _ in "kv")
        gathered = _Gathered(
            self._gather_ragged, indices, kv_indptr.to(dev, non_blocking=True),
            tok_indptr.to(dev, non_blocking=True), rows, pages[-1], k, v,
        )  # fmt: skip
        self.guard.plan(
            gathered.wrapper, qo_indptr, tok_indptr, hq, hkv, dim, causal=True, sm_scale=scale,
            q_data_type=q_dtype, kv_data_type=kv_dtype,
        )  # fmt: skip
        self._gather = gathered
        self._wrapper = gathered.wrapper
        self.gathered_passes += 1

    def _plan(
        self, batch: ForwardBatch, q: torch.Tensor, kv_cache: torch.Tensor, scale: float
    ) -> None:
        """Plans for `batch` unless the last plan was for this very batch and layer shape."""
        if self.frozen:  # capturing: the graph runner planned this batch before the capture
            return
        hq, (hkv, dim) = q.shape[1], kv_cache.shape[-2:]
        shape = (hq, hkv, dim, q.dtype, kv_cache.dtype, scale)
        key = (tuple(batch.q_lens), tuple(batch.ctx_lens), *shape)
        if batch is self._plan_batch and key == self._plan_key:
            return
        self.plan(batch, shape)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        batch: ForwardBatch,
        scale: float,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> torch.Tensor:
        """`ninfer.ops.base.Ops.attention`: q [T, Hq, D], k, v [T, Hkv, D] -> o [T, Hq, D]."""
        write_kv(k, v, kv_cache, batch.slot_mapping, k_scale, v_scale)
        if self._fresh(batch, k, v, kv_cache, k_scale, v_scale):
            return self._run_ragged(q, k, v, batch, scale)
        self._plan(batch, q, kv_cache, scale)
        g = self._gather
        if g is None:
            return self._wrapper.run(q.contiguous(), kv_cache, k_scale=k_scale, v_scale=v_scale)
        if k_scale is not None or v_scale is not None:
            raise ValueError("attention: the gathered path reads an unscaled cache")
        _gather(kv_cache, g)
        return g.wrapper.run(q.contiguous(), g.k, g.v)

    def _fresh(self, batch, k, v, kv_cache, k_scale, v_scale) -> bool:
        """Whether the pass can attend over its own k, v: a prefill pass (not being captured)
        whose rows all start at position 0, with k and v what the cache now holds (same dtype,
        no scales, unit stride along the head dim)."""
        return (
            not self.frozen
            and not batch.is_decode
            and not any(batch.ctx_lens)
            and k.dtype == v.dtype == kv_cache.dtype
            and k_scale is None
            and v_scale is None
            and k.stride(-1) == v.stride(-1) == 1
        )

    def _run_ragged(self, q, k, v, batch: ForwardBatch, scale: float) -> torch.Tensor:
        """Causal attention of each row over its own tokens' k, v (the pass's all fresh),
        planned once per pass as the paged path is."""
        hq, (hkv, dim) = q.shape[1], k.shape[-2:]
        key = (tuple(batch.q_lens), hq, hkv, dim, q.dtype, k.dtype, scale)
        if self._ragged is None:
            self._ragged = self._flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
                self._workspace, "NHD"
            )
        if batch is not self._ragged_batch or key != self._ragged_key:
            indptr = pinned([0, *itertools.accumulate(batch.q_lens)])
            self.guard.plan(
                self._ragged, indptr, indptr, hq, hkv, dim, causal=True, sm_scale=scale,
                q_data_type=q.dtype, kv_data_type=k.dtype,
            )  # fmt: skip
            self._ragged_batch, self._ragged_key = batch, key
            self.ragged_passes += 1
        return self._ragged.run(q.contiguous(), k, v)
