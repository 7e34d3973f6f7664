"""CUDA-graph decode: one captured model forward per batch size 1..max_batch.

A pure-decode step (every row one token after a cached context, every row sampled, no Host
restore hook) replays the graph of its batch size; anything else runs eagerly. Per batch size
`bs` the graph reads fixed device buffers, refilled before every replay:

    meta_dev [4, max_batch] int64   rows: input ids | positions | slot_mapping | state slots
    cu [max_batch + 1] int32 (0..bs), logits_idx [max_batch] int64 (0..bs-1): constants
    indices_dev [max_batch * max_pages] int32: the rows' page ids, CSR (FlashInfer kv_indices)

and writes its logits [bs, vocab] fp32 into its own output buffer (read by the sampler, outside
the graph, before the next replay). One replay step on the host:

    fill the pinned mirrors (numpy views) -> two non-blocking H2D copies
    -> FlashInfer plan of the bs-wrapper (pinned indptr / last_page_len, device indices)
    -> graph.replay()

No host synchronisation happens in the step. The pinned mirrors (ours and the wrapper's plan
buffers) are reused by the next step, which may be filled while this one still runs (the
runner's overlapped decode): an event recorded after this step's copies and plan is waited for
before they are overwritten. It has long passed in the steady state: the host reads step N-1's
tokens, so the GPU has started step N, before it fills step N+1. A `fed` step (`run(rows,
fed)`) takes its input ids from a device tensor (the previous step's sampled ids), copied over
the mirrors' placeholder ids after the H2D copy, in stream order.

Capture (`capture()`): graphs are captured largest batch first and share one memory pool. For
each size the static batch is filled with dummy rows (context 1 on a scratch page, distinct
scratch state slots, all lent by the caller and free at startup), planned, run once eagerly on a
side stream (JIT, Triton autotune, torch.compile for that shape), then captured with
`PagedAttention.frozen` set, so no layer plans inside the capture.
"""

from __future__ import annotations

import time

import torch

from ninfer.forward import PAGE_SIZE, ForwardBatch, ModelCache


def pinned_zeros(shape, dtype) -> torch.Tensor:
    """A zeroed host buffer, page-locked when CUDA is present (CPU: unit tests of the fills)."""
    t = torch.zeros(shape, dtype=dtype)
    return t.pin_memory() if torch.cuda.is_available() else t


def plan_shape(model, cache: ModelCache) -> tuple:
    """`PagedAttention.plan`'s shape for `model` over `cache`: (Hq, Hkv, head_dim, q dtype,
    kv dtype, scale)."""
    cfg = model.config
    dtype = model.model.embed_tokens.weight.dtype
    kv_dtype = cache.kv[0].dtype if cache.kv else dtype
    heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    return (*heads, dtype, kv_dtype, cfg.head_dim**-0.5)


class DecodeGraphs:
    """Captured decode forwards of `model` with `ops` (a `CudaOps`) over `cache`."""

    def __init__(
        self,
        model,
        ops,
        cache: ModelCache,
        device: torch.device,
        max_batch: int,
        max_pages_per_row: int,
    ) -> None:
        self.model, self.ops, self.cache, self.device = model, ops, cache, device
        self.max_batch, self.max_pages = max_batch, max_pages_per_row
        self.attn = ops.attention_planner
        self.shape = plan_shape(model, cache)
        kv_dtype = self.shape[4]
        n = max_batch
        self.meta_host = pinned_zeros((4, n), torch.int64)
        self.meta_np = self.meta_host.numpy()
        self.meta_dev = torch.zeros((4, n), dtype=torch.int64, device=device)
        self.cu = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.logits_idx = torch.arange(n, dtype=torch.int64, device=device)
        self.indices_host = pinned_zeros(n * max_pages_per_row, torch.int32)
        self.indices_np = self.indices_host.numpy()
        self.indices_dev = torch.zeros(n * max_pages_per_row, dtype=torch.int32, device=device)
        self.indptr_host = {bs: pinned_zeros(bs + 1, torch.int32) for bs in range(1, n + 1)}
        self.last_host = {bs: pinned_zeros(bs, torch.int32) for bs in range(1, n + 1)}
        self.qo_host = {bs: torch.arange(bs + 1, dtype=torch.int32) for bs in range(1, n + 1)}
        dummy_table = torch.zeros((n, 1), dtype=torch.int32, device=device)  # unused in decode
        self.batches: dict[int, ForwardBatch] = {}
        for bs in range(1, n + 1):
            self.batches[bs] = ForwardBatch(
                input_ids=self.meta_dev[0, :bs],
                positions=self.meta_dev[1, :bs],
                q_lens=[1] * bs,
                ctx_lens=[1] * bs,
                cu_q=self.cu[: bs + 1],
                state_slots=self.meta_dev[3, :bs],
                block_table=dummy_table[:bs],
                slot_mapping=self.meta_dev[2, :bs],
                logits_indices=self.logits_idx[:bs],
            )
        self.wrappers = {
            bs: self.attn.graph_wrapper(bs, kv_dtype, self.indices_dev) for bs in range(1, n + 1)
        }
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.replays = 0
        self.capture_s = 0.0
        self._copied: torch.cuda.Event | None = None  # the last step's H2D copies and plan

    # ---- eligibility ------------------------------------------------------------------------
    def can_run(self, rows) -> bool:
        """Whether `rows` (runner `Row`s) form a pure-decode step a captured graph serves."""
        return (
            0 < len(rows) <= self.max_batch
            and len(rows) in self.graphs
            and all(
                len(r.token_ids) == 1
                and r.ctx_len > 0
                and r.sample is not None
                and r.before_layer is None
                and r.ctx_len // PAGE_SIZE < min(len(r.pages), self.max_pages)
                for r in rows
            )
        )

    # ---- one step ---------------------------------------------------------------------------
    def _fill(self, rows_meta: list[tuple[int, int, int, list[int]]]) -> ForwardBatch:
        """Fills the static buffers for rows given as (token, ctx_len, slot, pages), queues the
        H2D copies and plans the bs-wrapper. Returns the static batch of that size."""
        bs = len(rows_meta)
        # the previous step may still be reading the mirrors: wait only if its copies are queued
        if self._copied is not None and not self._copied.query():
            self._copied.synchronize()
        meta, ind = self.meta_np, self.indices_np
        indptr, last = self.indptr_host[bs].numpy(), self.last_host[bs].numpy()
        total = 0
        indptr[0] = 0
        for i, (token, ctx, slot, pages) in enumerate(rows_meta):
            n_pages = ctx // PAGE_SIZE + 1  # pages covering positions [0, ctx]
            meta[0, i] = token
            meta[1, i] = ctx
            meta[2, i] = pages[ctx // PAGE_SIZE] * PAGE_SIZE + ctx % PAGE_SIZE
            meta[3, i] = slot
            ind[total : total + n_pages] = pages[:n_pages]
            total += n_pages
            indptr[i + 1] = total
            last[i] = ctx % PAGE_SIZE + 1
        self.meta_dev.copy_(self.meta_host, non_blocking=True)  # contiguous: a true async copy
        self.indices_dev[:total].copy_(self.indices_host[:total], non_blocking=True)
        batch = self.batches[bs]
        batch.ctx_lens = [m[1] for m in rows_meta]
        metadata = (self.qo_host[bs], self.indptr_host[bs], self.last_host[bs])
        self.attn.plan(batch, self.shape, self.wrappers[bs], (*metadata, self.indices_dev[:total]))
        if self.meta_dev.is_cuda:
            self._copied = self._copied or torch.cuda.Event()
            self._copied.record()
        return batch

    def run(self, rows, fed: torch.Tensor | None = None) -> torch.Tensor:
        """Replays the graph for `rows` (see `can_run`); returns logits [bs, vocab] fp32, valid
        until the next replay. `fed` [bs] int64 on the device: the rows' input ids (their
        `token_ids` are then placeholders)."""
        self._fill([(r.token_ids[0], r.ctx_len, r.slot, r.pages) for r in rows])
        bs = len(rows)
        if fed is not None:
            self.meta_dev[0, :bs].copy_(fed)
        self.graphs[bs].replay()
        self.replays += 1
        return self.logits[bs]

    # ---- capture ----------------------------------------------------------------------------
    def capture(self, scratch_page: int, scratch_slots: list[int]) -> float:
        """Captures every batch size, largest first, with one shared pool. `scratch_page` and
        `scratch_slots` (>= max_batch distinct slots) are overwritten: free pool entries.
        Returns the seconds taken."""
        if len(scratch_slots) < self.max_batch:
            raise ValueError("capture needs one scratch state slot per row")
        t0 = time.perf_counter()
        pool = None
        stream = torch.cuda.Stream(self.device)
        for bs in range(self.max_batch, 0, -1):
            rows = [(0, 1, scratch_slots[i], [scratch_page]) for i in range(bs)]
            batch = self._fill(rows)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self.model(batch, self.cache, self.ops)  # JIT / autotune / compile, uncaptured
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            self.attn.frozen = True
            try:
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.logits[bs] = self.model(batch, self.cache, self.ops)
            finally:
                self.attn.frozen = False
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0
        return self.capture_s
