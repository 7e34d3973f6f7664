"""CUDA graphs: captured model forwards for pure-decode steps and one-row prefill steps.

Eager always works: a step no captured graph serves runs the model eagerly, and a graph's
output equals the eager pass's (tests/engine/test_engine_cuda.py). What is captured:

    DecodeGraphs   one graph per batch size 1..max_batch. A step of bs rows, each one sampled
                   token after a cached context, no Host restore hook, replays graph bs.
    PrefillGraphs  one graph per bucket k (`buckets`). A step of ONE row of q tokens
                   (1 <= q <= max_tokens, any cached context, no Host restore hook, no tap)
                   replays the smallest bucket with 64k >= q. An eager pass of a few hundred
                   tokens is bound by the host (every layer launches a dozen kernels), and a
                   cached chat turn or an agent step is exactly that: a short suffix after a
                   restored prefix (figures: docs/results-h200.md, prefill graphs).

Both share one skeleton (`_Graphs`). Per graph, fixed device buffers are read by the replay
and refilled before it from pinned host mirrors (numpy views); its logits land in its own
output buffer, valid until that graph kind's next replay (decode and prefill graphs use
separate memory pools, so a decode replay's logits survive a prefill replay). One replay on
the host:

    fill the pinned mirrors -> non-blocking H2D copies -> FlashInfer plan -> graph.replay()

No host synchronisation happens in a replay. The mirrors (ours and the wrappers' plan buffers)
are reused by the next replay, which may be filled while this one still runs (the runner's
overlapped decode): an event recorded after the copies and the plan is waited for before they
are overwritten; in the steady state it has long passed.

Capture (`capture()`): largest graph first, all of one kind in one memory pool. Each graph's
static batch is filled with dummy rows on scratch entries lent by the caller (free at startup,
read by nothing), run once eagerly on a side stream (JIT, Triton autotune, torch.compile for
that shape), then captured with `PagedAttention.frozen` set, so no layer plans inside the
capture.

Decode buffers (bs rows, max_pages = pages per row):

    meta_dev [4, max_batch] int64   rows: input ids | positions | slot_mapping | state slots
    cu [max_batch + 1] int32 (0..bs), logits_idx [max_batch] int64 (0..bs-1): constants
    indices_dev [max_batch * max_pages] int32: the rows' page ids, CSR (FlashInfer kv_indices)

A `fed` decode replay (`run(rows, fed)`) takes its input ids from a device tensor (the previous
step's sampled ids), copied over the mirrors' placeholder ids after the H2D copy, in stream
order.

Prefill: the pass of bucket k has T = 64k + 1 tokens in two rows:

    row 0: the real row: its q tokens at positions [ctx, ctx + q), its state slot and pages
    row 1: a padding row of T - q >= 1 fresh tokens (id 0, positions 0..) on the scratch state
           slot, every position mapped to the one scratch KV page (its page table repeats it)

Why 64k + 1: fla's chunked kernels are launched over the pass's 64-token chunks, so the chunk
count must not change between replays of one graph: ceil(q/64) + ceil((64k+1-q)/64) = k + 1
for every 1 <= q <= 64k. Every op is row-local (attention, the conv and the delta rule per row,
the rest per token), so the padding row changes nothing in row 0: its outputs are dropped and
its K/V and state land in the scratch entries (`KVPool.scratch_pages`,
`StatePool.scratch_slots`), which nothing reads. Logits: row 0's last token only. Per bucket,
one pinned host buffer and one non-blocking copy:

    flat int64:  ids [T] | positions [T] | slot_mapping [T] | slots [2] | logits index [1]
                 | the GDN pass tables (`ninfer.ops.cuda.passmeta`, bound to the batch),
                 each segment 16-byte aligned
    cu_q int32 [3]; the FlashInfer graph-mode prefill wrapper (2 rows), planned on the host
    before the replay; its kv indices buffer is shared by every bucket (the paged attention
    path: why not the gathered one in `ninfer.ops.cuda.attention`)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from ninfer.forward import ForwardBatch, ModelCache
from ninfer.ops.cuda import passmeta
from ninfer.page import PAGE_SIZE


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


class _Graphs:
    """The skeleton both graph kinds share: the model, its ops (a `CudaOps`) and cache, the
    attention planner, the event guarding the pinned mirrors, the capture loop."""

    def __init__(self, model, ops, cache: ModelCache, device: torch.device) -> None:
        self.model, self.ops, self.cache, self.device = model, ops, cache, device
        self.attn = ops.attention_planner
        self.shape = plan_shape(model, cache)
        self.replays = 0
        self.capture_s = 0.0
        self._copied: torch.cuda.Event | None = None  # the last fill's H2D copies and plan

    def _forward(self, batch: ForwardBatch):
        """The pass a graph captures (the model's logits; the speculative graphs' own)."""
        return self.model(batch, self.cache, self.ops)

    def _await_mirrors(self) -> None:
        """Before a fill: an earlier replay's copies may still read the mirrors; wait only if
        they are still queued."""
        if self._copied is not None and not self._copied.query():
            self._copied.synchronize()

    def _mark_mirrors(self, dev: torch.Tensor) -> None:
        """After a fill's copies and plan are queued: what `_await_mirrors` waits for."""
        if dev.is_cuda:
            self._copied = self._copied or torch.cuda.Event()
            self._copied.record()

    def _capture_each(
        self,
        keys: Iterable,
        fill: Callable[[object], ForwardBatch],
        frozen_warm_run: bool,
    ) -> dict:
        """Captures one graph per key, in the order given (largest first: the later graphs
        fit in the first one's pool), `fill(key)` preparing its static batch. The uncaptured
        run before each capture is frozen too with `frozen_warm_run`. Returns key ->
        (graph, logits) and sets `capture_s`."""
        t0 = time.perf_counter()
        pool = None
        stream = torch.cuda.Stream(self.device)
        current = torch.cuda.current_stream(self.device)
        out = {}
        for key in keys:
            batch = fill(key)
            stream.wait_stream(current)
            graph = torch.cuda.CUDAGraph()
            self.attn.frozen = frozen_warm_run
            try:
                with torch.cuda.stream(stream):
                    self._forward(batch)  # JIT / autotune / compile
                current.wait_stream(stream)
                self.attn.frozen = True
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    logits = self._forward(batch)
            finally:
                self.attn.frozen = False
            pool = graph.pool()
            out[key] = (graph, logits)
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0
        return out


class DecodeGraphs(_Graphs):
    """Captured decode forwards, one per batch size 1..max_batch (module docstring)."""

    def __init__(
        self,
        model,
        ops,
        cache: ModelCache,
        device: torch.device,
        max_batch: int,
        max_pages_per_row: int,
    ) -> None:
        super().__init__(model, ops, cache, device)
        self.max_batch, self.max_pages = max_batch, max_pages_per_row
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
                and r.images is None
                and r.ctx_len // PAGE_SIZE < min(len(r.pages), self.max_pages)
                for r in rows
            )
        )

    def _fill(self, rows_meta: list[tuple[int, int, int, list[int]]]) -> ForwardBatch:
        """Fills the static buffers for rows given as (token, ctx_len, slot, pages), queues the
        H2D copies and plans the bs-wrapper. Returns the static batch of that size."""
        bs = len(rows_meta)
        self._await_mirrors()
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
        self._mark_mirrors(self.meta_dev)
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

    def capture(self, scratch_page: int, scratch_slots: list[int]) -> float:
        """Captures every batch size, largest first. `scratch_page` and `scratch_slots`
        (>= max_batch distinct slots) are overwritten: free pool entries. Returns the seconds
        taken."""
        if len(scratch_slots) < self.max_batch:
            raise ValueError("capture needs one scratch state slot per row")

        def fill(bs: int) -> ForwardBatch:  # context 1 on the scratch page, distinct slots
            return self._fill([(0, 1, scratch_slots[i], [scratch_page]) for i in range(bs)])

        sizes = range(self.max_batch, 0, -1)
        for bs, (graph, logits) in self._capture_each(sizes, fill, False).items():
            self.graphs[bs], self.logits[bs] = graph, logits
        return self.capture_s


def buckets(max_tokens: int) -> list[int]:
    """The captured k (T = 64k + 1 tokens): every 64 tokens up to 512, every 128 up to 1024,
    every 256 beyond, up to max_tokens (a multiple of 64)."""
    top = max_tokens // PAGE_SIZE
    ks = [k for k in range(1, 9)] + list(range(10, 17, 2)) + list(range(20, top + 1, 4))
    ks = [k for k in ks if k <= top]
    if top and top not in ks:
        ks.append(top)
    return ks


@dataclass(frozen=True, slots=True)
class Padded:
    """The two rows of a replay of bucket k (module docstring), as host arrays."""

    ids: np.ndarray  # [T]
    positions: np.ndarray  # [T]
    slot_mapping: np.ndarray  # [T]
    q_lens: list[int]  # [q, T - q]
    ctx_lens: list[int]  # [ctx, 0]
    page_rows: list[list[int]]  # each row's page table (the padding row's repeats one page)
    qo_indptr: list[int]  # FlashInfer CSR: [0, q, T]
    kv_indptr: list[int]
    last_page_len: list[int]
    kv_indices: list[int]


def padded(
    tokens: list[int],
    ctx: int,
    slot: int,
    pages: list[int],
    k: int,
    scratch_page: int,
    scratch_slot: int,
) -> Padded:
    """Row 0 = `tokens` at [ctx, ctx + q) over `pages` (slot `slot`, used by the caller);
    row 1 = the padding row up to T = 64k + 1 tokens on `scratch_page` (and `scratch_slot`)."""
    t, q = k * PAGE_SIZE + 1, len(tokens)
    if not 1 <= q <= k * PAGE_SIZE:
        raise ValueError(f"padded: {q} tokens do not fit bucket k={k}")
    pad = t - q
    ids = np.zeros(t, dtype=np.int64)
    ids[:q] = tokens
    pos = np.empty(t, dtype=np.int64)
    pos[:q] = np.arange(ctx, ctx + q)
    pos[q:] = np.arange(pad)
    table = np.asarray(pages, dtype=np.int64)
    smap = np.empty(t, dtype=np.int64)
    smap[:q] = table[pos[:q] // PAGE_SIZE] * PAGE_SIZE + pos[:q] % PAGE_SIZE
    smap[q:] = scratch_page * PAGE_SIZE + pos[q:] % PAGE_SIZE
    n_real, n_pad = -(-(ctx + q) // PAGE_SIZE), -(-pad // PAGE_SIZE)
    rows = [list(pages[:n_real]), [scratch_page] * n_pad]
    return Padded(
        ids=ids,
        positions=pos,
        slot_mapping=smap,
        q_lens=[q, pad],
        ctx_lens=[ctx, 0],
        page_rows=rows,
        qo_indptr=[0, q, t],
        kv_indptr=[0, n_real, n_real + n_pad],
        last_page_len=[(ctx + q - 1) % PAGE_SIZE + 1, (pad - 1) % PAGE_SIZE + 1],
        kv_indices=rows[0] + rows[1],
    )


class _Bucket:
    """Buffers, batch and graph of one bucket (T = 64k + 1 tokens, 2 rows)."""

    def __init__(self, k: int, device: torch.device) -> None:
        self.k = k
        self.tokens = t = k * PAGE_SIZE + 1
        sizes = [t, t, t, 2, 1]  # ids, positions, slot_mapping, slots, logits index
        padded = [passmeta.even(n) for n in sizes]  # 16-byte aligned segments (see passmeta)
        self.starts = [sum(padded[:i]) for i in range(len(padded) + 1)]
        n = self.starts[-1] + sum(passmeta.layout(t, 2, k + 1))
        self.host = pinned_zeros(n, torch.int64)
        self.host_np = self.host.numpy()
        self.dev = torch.zeros(n, dtype=torch.int64, device=device)
        self.cu_host = pinned_zeros(3, torch.int32)
        self.cu_dev = torch.zeros(3, dtype=torch.int32, device=device)
        segs = self.dev[: self.starts[-1]].split(padded)
        ids, pos, smap, slots, lidx = (s[:m] for s, m in zip(segs, sizes, strict=True))
        self.meta = passmeta.PassMeta.view(self.dev[self.starts[-1] :], t, 2, k + 1)
        self.batch = ForwardBatch(
            input_ids=ids,
            positions=pos,
            q_lens=[k * PAGE_SIZE, 1],  # representative: the capture's; host lists unused
            ctx_lens=[0, 0],
            cu_q=self.cu_dev,
            state_slots=slots,
            block_table=torch.zeros((2, 1), dtype=torch.int32, device=device),  # unused
            slot_mapping=smap,
            logits_indices=lidx,
        )
        self.qo_host = pinned_zeros(3, torch.int32)
        self.indptr_host = pinned_zeros(3, torch.int32)
        self.last_host = pinned_zeros(2, torch.int32)
        self.wrapper = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None


class PrefillGraphs(_Graphs):
    """Captured one-row prefill forwards, one per bucket (module docstring)."""

    def __init__(
        self,
        model,
        ops,
        cache: ModelCache,
        device: torch.device,
        max_tokens: int,
        max_pages_per_row: int,
        scratch_page: int,
        scratch_slot: int,
    ) -> None:
        super().__init__(model, ops, cache, device)
        self.max_pages = max_pages_per_row
        self.scratch_page, self.scratch_slot = scratch_page, scratch_slot
        ks = buckets(max_tokens)
        self.max_tokens = ks[-1] * PAGE_SIZE if ks else 0
        n_ind = max_pages_per_row + (ks[-1] + 1 if ks else 0)
        self.indices_host = pinned_zeros(n_ind, torch.int32)
        self.indices_np = self.indices_host.numpy()
        self.indices_dev = torch.zeros(n_ind, dtype=torch.int32, device=device)
        self.buckets = {k: _Bucket(k, device) for k in ks}

    def bucket_of(self, q: int) -> _Bucket | None:
        for k, b in self.buckets.items():
            if q <= k * PAGE_SIZE:
                return b
        return None

    def can_run(self, rows) -> bool:
        """Whether `rows` (runner `Row`s) are one prefill row a captured bucket serves."""
        if len(rows) != 1:
            return False
        r = rows[0]
        q = len(r.token_ids)
        b = self.bucket_of(q)
        n_pages = -(-(r.ctx_len + q) // PAGE_SIZE)
        return (
            b is not None
            and b.graph is not None
            and r.before_layer is None
            and r.images is None
            and not r.taps
            and n_pages <= min(len(r.pages), self.max_pages)
        )

    def fill(self, b: _Bucket, tokens: list[int], ctx: int, slot: int, pages: list[int]) -> None:
        """Writes bucket b's pinned mirrors for the real row (tokens at [ctx, ctx + q), its
        slot and pages) plus the padding row, queues the H2D copies and plans b's wrapper."""
        self._await_mirrors()
        p = padded(tokens, ctx, slot, pages, b.k, self.scratch_page, self.scratch_slot)
        t, o, h = b.tokens, b.starts, b.host_np
        h[o[0] : o[0] + t], h[o[1] : o[1] + t], h[o[2] : o[2] + t] = (
            p.ids, p.positions, p.slot_mapping,
        )  # fmt: skip
        h[o[3] : o[3] + 2] = (slot, self.scratch_slot)
        h[o[4]] = len(tokens) - 1
        h[o[5] :] = passmeta.tables(p.q_lens, p.ctx_lens)
        b.cu_host.numpy()[:] = p.qo_indptr
        total = len(p.kv_indices)
        self.indices_np[:total] = p.kv_indices
        b.qo_host.numpy()[:] = p.qo_indptr
        b.indptr_host.numpy()[:] = p.kv_indptr
        b.last_host.numpy()[:] = p.last_page_len
        b.dev.copy_(b.host, non_blocking=True)
        b.cu_dev.copy_(b.cu_host, non_blocking=True)
        self.indices_dev[:total].copy_(self.indices_host[:total], non_blocking=True)
        metadata = (b.qo_host, b.indptr_host, b.last_host, self.indices_dev[:total])
        limits = (t, self.max_pages * PAGE_SIZE)
        self.attn.plan(b.batch, self.shape, b.wrapper, metadata, limits)
        self.ops.bind_pass(b.batch, b.meta)
        self._mark_mirrors(b.dev)

    def run(self, rows) -> torch.Tensor:
        """Replays the bucket of `rows` (see `can_run`); returns logits [1, vocab] fp32 of the
        row's last token, valid until the next prefill replay."""
        r = rows[0]
        b = self.bucket_of(len(r.token_ids))
        self.fill(b, r.token_ids, r.ctx_len, r.slot, r.pages)
        b.graph.replay()
        self.replays += 1
        return b.logits

    def capture(self) -> float:
        """Captures every bucket, largest first. Returns the seconds taken. Writes only the
        scratch page and slot (a capture's real row is placed there too: ctx 0, so nothing is
        read from them)."""

        def fill(k: int) -> ForwardBatch:
            b = self.buckets[k]
            b.wrapper = self.attn.prefill_graph_wrapper(2, self.indices_dev)
            self.fill(b, [0] * (k * PAGE_SIZE), 0, self.scratch_slot, [self.scratch_page] * k)
            return b.batch

        # frozen for the uncaptured run too, so that it runs the attention path the graph
        # captures (fill's plan): unfrozen, a bucket's rows at position 0 would take the
        # fresh-rows ragged path
        keys = sorted(self.buckets, reverse=True)
        for k, (graph, logits) in self._capture_each(keys, fill, True).items():
            self.buckets[k].graph, self.buckets[k].logits = graph, logits
        return self.capture_s
