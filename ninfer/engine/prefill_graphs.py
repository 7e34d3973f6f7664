"""CUDA-graph prefill: one captured forward per padded token count, for one-row prefill steps.

Run eagerly, a prefill pass of a few hundred tokens is bound by the host (the 9B at 1024 tokens:
~90 ms of Python and launches for ~50 ms of GPU work): every layer launches a dozen kernels.
A cached chat turn or an agent step is exactly that: a short suffix after a restored prefix.
So a step of ONE row of q tokens (1 <= q <= max_tokens, any cached context, no Host restore
hook, no other rows) replays the graph of the smallest bucket k with 64k >= q. The captured
pass has T = 64k + 1 tokens in two rows:

    row 0: the real row: its q tokens at positions [ctx, ctx + q), its state slot and pages
    row 1: a padding row of T - q >= 1 fresh tokens (id 0, positions 0..) on the scratch state
           slot, every position mapped to the one scratch KV page (its page table repeats it)

Why 64k + 1: fla's chunked kernels are launched over the pass's 64-token chunks, so the chunk
count must not change between replays of one graph: ceil(q/64) + ceil((64k+1-q)/64) = k + 1
for every 1 <= q <= 64k. Every op is row-local (attention, the conv and the delta rule per row,
the rest per token), so the padding row changes nothing in row 0: its outputs are dropped and
its K/V and state land in the scratch entries (`KVPool.scratch_pages`,
`StatePool.scratch_slots`), which nothing reads. Logits: row 0's last token only.

Per bucket, fixed device buffers, refilled before every replay from one pinned host buffer by
one non-blocking copy:

    flat int64:  ids [T] | positions [T] | slot_mapping [T] | slots [2] | logits index [1]
                 | the GDN pass tables (`ninfer.ops.cuda.passmeta`, bound to the batch),
                 each segment 16-byte aligned
    cu_q int32 [3]; the FlashInfer graph-mode prefill wrapper (2 rows), planned on the host
    before the replay; its kv indices buffer is shared by every bucket. With
    `PagedAttention.gather_graphs` (off by default: see `ninfer.ops.cuda.attention`), a
    bucket with enough queries takes the gathered attention path
    (`PagedAttention.prefill_graph_wrapper`): its K/V scratch holds every page the indices
    buffer can name, shared by those buckets

One replay on the host: fill the pinned mirrors (numpy) -> 2 H2D copies -> plan -> replay.
No host synchronisation; an event guards the mirrors against a refill while an earlier
replay's copies may still read them. Capture (`capture()`): largest bucket first, one shared
memory pool (separate from the decode graphs'), each bucket run once eagerly on a side stream
(JIT, autotune, torch.compile for its shape) and then captured, both with
`PagedAttention.frozen` (the eager run takes the captured attention path).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ninfer.engine.graphs import pinned_zeros, plan_shape
from ninfer.forward import PAGE_SIZE, ForwardBatch, ModelCache
from ninfer.ops.cuda import passmeta


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

    def __init__(self, k: int, device: torch.device, indices_dev: torch.Tensor) -> None:
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


class PrefillGraphs:
    """Captured one-row prefill forwards of `model` with `ops` (a `CudaOps`) over `cache`."""

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
        self.model, self.ops, self.cache, self.device = model, ops, cache, device
        self.max_pages = max_pages_per_row
        self.scratch_page, self.scratch_slot = scratch_page, scratch_slot
        self.attn = ops.attention_planner
        self.shape = plan_shape(model, cache)
        ks = buckets(max_tokens)
        self.max_tokens = ks[-1] * PAGE_SIZE if ks else 0
        n_ind = max_pages_per_row + (ks[-1] + 1 if ks else 0)
        self.indices_host = pinned_zeros(n_ind, torch.int32)
        self.indices_np = self.indices_host.numpy()
        self.indices_dev = torch.zeros(n_ind, dtype=torch.int32, device=device)
        self.buckets = {k: _Bucket(k, device, self.indices_dev) for k in ks}
        self.replays = 0
        self.capture_s = 0.0
        self._copied: torch.cuda.Event | None = None

    # ---- eligibility ------------------------------------------------------------------------
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
            and r.tap is None
            and n_pages <= min(len(r.pages), self.max_pages)
        )

    # ---- one replay -------------------------------------------------------------------------
    def fill(self, b: _Bucket, tokens: list[int], ctx: int, slot: int, pages: list[int]) -> None:
        """Writes bucket b's pinned mirrors for the real row (tokens at [ctx, ctx + q), its
        slot and pages) plus the padding row, queues the H2D copies and plans b's wrapper."""
        # an earlier replay's copies may still read the mirrors: wait only if still queued
        if self._copied is not None and not self._copied.query():
            self._copied.synchronize()
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
        if b.dev.is_cuda:
            self._copied = self._copied or torch.cuda.Event()
            self._copied.record()

    def run(self, rows) -> torch.Tensor:
        """Replays the bucket of `rows` (see `can_run`); returns logits [1, vocab] fp32 of the
        row's last token, valid until the next prefill replay."""
        r = rows[0]
        b = self.bucket_of(len(r.token_ids))
        self.fill(b, r.token_ids, r.ctx_len, r.slot, r.pages)
        b.graph.replay()
        self.replays += 1
        return b.logits

    # ---- capture ----------------------------------------------------------------------------
    def capture(self) -> float:
        """Captures every bucket, largest first, with one shared pool. Returns the seconds
        taken. Writes only the scratch page and slot (a capture's real row is placed there
        too: ctx 0, so nothing is read from them)."""
        t0 = time.perf_counter()
        pool = None
        stream = torch.cuda.Stream(self.device)
        for k in sorted(self.buckets, reverse=True):
            b = self.buckets[k]
            b.wrapper = self.attn.prefill_graph_wrapper(
                2, self.indices_dev, self.shape, k * PAGE_SIZE, self.indices_dev.numel() * PAGE_SIZE
            )
            q = k * PAGE_SIZE
            pages = [self.scratch_page] * -(-q // PAGE_SIZE)
            self.fill(b, [0] * q, 0, self.scratch_slot, pages)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            graph = torch.cuda.CUDAGraph()
            # frozen for the uncaptured run too, so that it runs the attention path the graph
            # captures (fill's plan): unfrozen, a bucket's rows at position 0 would take the
            # fresh-rows ragged path, and a gathered bucket's gather and ragged graph wrapper
            # would first run inside the capture
            self.attn.frozen = True
            try:
                with torch.cuda.stream(stream):
                    self.model(b.batch, self.cache, self.ops)  # JIT / autotune / compile
                torch.cuda.current_stream(self.device).wait_stream(stream)
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    b.logits = self.model(b.batch, self.cache, self.ops)
            finally:
                self.attn.frozen = False
            pool = graph.pool()
            b.graph = graph
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0
        return self.capture_s
