"""CUDA graphs for speculative decoding (`ninfer.engine.speculative`): the verify pass and the
MTP head's passes, one graph per batch size bs = 1..max_batch of each kind.

An eager speculative step is bound by the host: the verify pass runs the prefill path (a
dozen launches per layer, more for its state taps) and the head runs K more passes, each
planned and launched from Python. In the steady state every row has the same shape, so each
pass is a replay:

    VerifyGraphs   bs rows of W = K + 1 tokens (the row's next token and its K drafts) after a
                   cached context, the state after each of a row's first K tokens tapped into
                   scratch slots given per replay (`forward.StateTap`, the roll-back); logits
                   of every token and the final hidden states [bs * W, H]
    HeadGraphs     the head over bs rows of `width` tokens, reading hidden states copied into
                   a static input buffer: width W for the bridge over a verify row (the
                   positions the row accepted, n <= W, padded to W: the pad's K/V lands past
                   the lane's frontier, where the next pass writes before anything reads it),
                   logits at one index per row (its last accepted position); width W for
                   each chain step run ahead (a window of W positions, one of them the row's
                   real one; `run`'s `pads`); width 1 for a draft chain step

A step no graph serves (a prefill chunk beside the verify rows, fewer drafts near
max_model_len or the pool's end, a Host restore, images) runs eagerly, as without graphs; a
replay computes what the eager pass does up to rounding (tests/engine/test_speculative_cuda.py).
Each kind captures into its own memory pool, so a verify replay's outputs survive the head's
replays and the bridge's survive the chain's; each output is valid until its own graph kind's
next replay.

Per graph, like `graphs.PrefillGraphs`: one pinned host buffer and one non-blocking copy into

    flat int64:  ids [T] | positions [T] | slot_mapping [T] | slots [bs] | logits index [N]
                 | tap slots [bs * K] | tap slot per token [T] (-1: none) | the GDN pass
                 tables (`passmeta`; constant: every row W tokens after a context, one
                 64-token chunk each), each 16-byte aligned

and a FlashInfer graph-mode wrapper planned on the host before the replay (a paged prefill
wrapper for W tokens a row, a decode wrapper for one). The verify graph's taps are a constant
`passmeta.TapIndex` (every row, offsets 1 .. K, all inside its first chunk; the causal conv's
taps read it) whose slot column is a view of the flat buffer, and the per-token slots
(`PassMeta.tap_tok`) with which its GDN layers run the rows token by token (`gdn.gdn_rows`:
one launch a layer, the state read once a row) instead of the chunked path the eager verify
pass takes; both agree with plain decode up to bf16 near-ties.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ninfer.engine.executor.graphs import _Graphs, pinned_zeros
from ninfer.forward import ForwardBatch, ModelCache, StateTap
from ninfer.ops.cuda import passmeta
from ninfer.page import PAGE_SIZE


class _Shape:
    """Buffers, static batch, wrapper and graph of one batch size: bs rows of `width` tokens,
    `n_logits` logits, `taps` tap slots per row (and the pass tables with taps)."""

    def __init__(self, bs: int, width: int, n_logits: int, taps: int, device: torch.device) -> None:
        self.bs, self.width, self.taps = bs, width, taps
        t = bs * width
        self.sizes = [t, t, t, bs, n_logits, bs * taps, t if taps else 0]
        padded = [passmeta.even(n) for n in self.sizes]
        self.starts = [sum(padded[:i]) for i in range(len(padded) + 1)]
        chunks = bs if width > 1 else 0
        tables = passmeta.layout(t, bs, chunks) if taps else []
        n = self.starts[-1] + sum(tables)
        self.host = pinned_zeros(n, torch.int64)
        self.host_np = self.host.numpy()
        self.dev = torch.zeros(n, dtype=torch.int64, device=device)
        segs = self.dev[: self.starts[-1]].split(padded)
        ids, pos, smap, slots, lidx, tap_slots, tap_tok = (
            s[:m] for s, m in zip(segs, self.sizes, strict=True)
        )
        self.cu_dev = torch.arange(0, t + 1, width, dtype=torch.int32, device=device)
        self.batch = ForwardBatch(
            input_ids=ids,
            positions=pos,
            q_lens=[width] * bs,
            ctx_lens=[1] * bs,  # set per replay (the plan and `is_decode` read them)
            cu_q=self.cu_dev,
            state_slots=slots,
            block_table=torch.zeros((bs, 1), dtype=torch.int32, device=device),  # unused
            slot_mapping=smap,
            logits_indices=lidx,
        )
        self.meta = None
        if taps:  # the verify pass: constant tables, a TapIndex whose slots are refilled
            self.host_np[self.starts[-1] :] = passmeta.tables([width] * bs, [1] * bs).numpy()
            meta = passmeta.PassMeta.view(self.dev[self.starts[-1] :], t, bs, chunks)
            spots = [StateTap(r, o, 0) for r in range(bs) for o in range(1, taps + 1)]
            index = passmeta.TapIndex.of(spots, [width] * bs, device)
            index = replace(index, slot=tap_slots, rest=replace(index.rest, slot=tap_slots))
            self.meta = replace(meta, taps=index, tap_tok=tap_tok)
        self.qo_host = pinned_zeros(bs + 1, torch.int32)
        self.qo_host.numpy()[:] = np.arange(0, t + 1, width)
        self.indptr_host = pinned_zeros(bs + 1, torch.int32)
        self.last_host = pinned_zeros(bs, torch.int32)
        self.wrapper = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out = None


class _RowGraphs(_Graphs):
    """The skeleton of both kinds: one `_Shape` per batch size, filled from rows given as
    (tokens, ctx_len, slot, pages), replayed."""

    width = 1
    taps = 0

    def __init__(
        self, model, ops, cache: ModelCache, device: torch.device, max_batch: int,
        max_pages_per_row: int,
    ) -> None:  # fmt: skip
        super().__init__(model, ops, cache, device)
        self.max_batch, self.max_pages = max_batch, max_pages_per_row
        n_ind = max_batch * max_pages_per_row
        self.indices_host = pinned_zeros(n_ind, torch.int32)
        self.indices_np = self.indices_host.numpy()
        self.indices_dev = torch.zeros(n_ind, dtype=torch.int32, device=device)
        self.shapes: dict[int, _Shape] = {}

    def _n_logits(self, bs: int) -> int:
        return bs * self.width

    def _new_shape(self, bs: int) -> _Shape:
        s = _Shape(bs, self.width, self._n_logits(bs), self.taps, self.device)
        if self.width == 1:
            s.wrapper = self.attn.graph_wrapper(bs, self.shape[4], self.indices_dev)
        else:
            backend = self.attn.choices.verify_backend
            s.wrapper = self.attn.prefill_graph_wrapper(bs, self.indices_dev, backend)
        return s

    def fits(self, rows: list[tuple[list[int], int, int, list[int]]]) -> bool:
        """Whether rows (tokens, ctx_len, slot, pages) form a step a captured graph serves."""
        bs = len(rows)
        s = self.shapes.get(bs)
        return (
            s is not None
            and s.graph is not None
            and all(
                len(tokens) == self.width
                and ctx > 0
                and -(-(ctx + self.width) // PAGE_SIZE) <= min(len(pages), self.max_pages)
                for tokens, ctx, _, pages in rows
            )
        )

    def _fill(self, s: _Shape, rows, logits_index, tap_slots=()) -> None:
        """Writes the mirrors of `s` for rows (tokens, ctx_len, slot, pages), the logits
        indices and the tap slots, queues the H2D copies and plans the wrapper."""
        self._await_mirrors()
        w, h, o = self.width, s.host_np, s.starts
        indptr, last = s.indptr_host.numpy(), s.last_host.numpy()
        total = 0
        ctxs = []
        for i, (tokens, ctx, slot, pages) in enumerate(rows):
            a = i * w
            pos = np.arange(ctx, ctx + w)
            n_pages = -(-(ctx + w) // PAGE_SIZE)
            table = np.asarray(pages[:n_pages], dtype=np.int64)
            h[o[0] + a : o[0] + a + w] = tokens
            h[o[1] + a : o[1] + a + w] = pos
            h[o[2] + a : o[2] + a + w] = table[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE
            h[o[3] + i] = slot
            self.indices_np[total : total + n_pages] = table
            total += n_pages
            indptr[i + 1] = total
            last[i] = (ctx + w - 1) % PAGE_SIZE + 1
            ctxs.append(ctx)
        h[o[4] : o[4] + len(logits_index)] = logits_index
        if s.taps:  # the slot each token's state goes to: offsets 1 .. K of each row
            per_tok = h[o[6] : o[6] + s.bs * w].reshape(s.bs, w)
            per_tok[:, : s.taps] = np.asarray(tap_slots).reshape(s.bs, s.taps)
            per_tok[:, s.taps :] = -1
            h[o[5] : o[5] + len(tap_slots)] = tap_slots
        s.dev.copy_(s.host, non_blocking=True)
        self.indices_dev[:total].copy_(self.indices_host[:total], non_blocking=True)
        s.batch.ctx_lens = ctxs
        metadata = (s.qo_host, s.indptr_host, s.last_host, self.indices_dev[:total])
        limits = (w, self.max_pages * PAGE_SIZE)
        self.attn.plan(s.batch, self.shape, s.wrapper, metadata, limits)
        if s.meta is not None:
            self.ops.bind_pass(s.batch, s.meta)
        self._mark_mirrors(s.dev)

    def _capture_all(self, fill) -> float:
        """Captures every batch size, largest first (`fill(bs)` prepares its static batch)."""
        for bs in range(self.max_batch, 0, -1):
            self.shapes[bs] = self._new_shape(bs)
        keys = range(self.max_batch, 0, -1)
        for bs, (graph, out) in self._capture_each(keys, fill, True).items():
            self.shapes[bs].graph, self.shapes[bs].out = graph, out
        return self.capture_s


class VerifyGraphs(_RowGraphs):
    """Captured verify passes (module docstring): `run` returns (logits [bs * W, V] fp32,
    hidden [bs * W, H]), valid until the next verify replay."""

    def __init__(self, model, ops, cache, device, max_batch, max_pages_per_row, k: int):
        super().__init__(model, ops, cache, device, max_batch, max_pages_per_row)
        self.width, self.taps = k + 1, k

    def _forward(self, batch: ForwardBatch):
        return self.model.forward_hidden(batch, self.cache, self.ops)

    def run(self, rows, tap_slots: list[int], fed: torch.Tensor | None = None):
        """rows: (tokens, ctx_len, slot, pages), `fits`; tap_slots: K per row, in row order
        (offsets 1 .. K); `fed` [bs, K] int64 on the device: the rows' drafts (their tokens
        after the first are then placeholders), copied in after the fill, in stream order."""
        s = self.shapes[len(rows)]
        self._fill(s, rows, range(s.bs * self.width), tap_slots)
        if fed is not None:
            s.batch.input_ids.view(s.bs, self.width)[:, 1:].copy_(fed)
        s.graph.replay()
        self.replays += 1
        return s.out

    def ids(self, bs: int) -> torch.Tensor:
        """The input ids [bs, K + 1] the last replay of batch size bs read (valid until the
        next fill of that size)."""
        return self.shapes[bs].batch.input_ids.view(bs, self.width)

    def capture(self, page: int, slots: list[int], tap_slots: list[int]) -> float:
        """Captures every batch size on `page` and `slots` (one per row), tapping into
        `tap_slots` (K per row): free entries, overwritten."""
        k = self.taps

        def fill(bs: int) -> ForwardBatch:
            s = self.shapes[bs]
            rows = [([0] * self.width, 1, slots[i], [page]) for i in range(bs)]
            self._fill(s, rows, range(bs * self.width), tap_slots[: bs * k])
            return s.batch

        return self._capture_all(fill)


class HeadGraphs(_RowGraphs):
    """Captured MTP head passes over rows of `width` tokens (module docstring): `run` returns
    (logits [bs, V] fp32 at one index per row, the head's hidden states [bs * width, H]),
    valid until the next replay of this object's graphs."""

    def __init__(self, model, ops, cache, device, max_batch, max_pages_per_row, width: int):
        super().__init__(model, ops, cache, device, max_batch, max_pages_per_row)
        self.width = width
        hidden = model.config.hidden_size
        dtype = model.model.embed_tokens.weight.dtype
        self.hidden_in = torch.zeros(max_batch * width, hidden, dtype=dtype, device=device)
        self.columns = torch.arange(width, device=device)

    def _n_logits(self, bs: int) -> int:
        return bs

    def _forward(self, batch: ForwardBatch):
        hidden = self.hidden_in[: batch.input_ids.shape[0]]
        return self.model.mtp(batch, hidden, self.cache, self.ops, self.model)

    def run(
        self,
        rows,
        hidden: torch.Tensor,
        last: list[int],
        fed: torch.Tensor | None = None,
        index: torch.Tensor | None = None,
        pads: tuple[int, torch.Tensor] | None = None,
    ):
        """rows: (tokens, ctx_len, slot, pages), `fits`; hidden [bs * width, H]: the input
        hidden state of every token; last[i]: row i's token whose logits are returned (an
        index into the row); `fed` [bs * width] int64 on the device: the input ids (the rows'
        tokens are then placeholders); `index` [bs] int64 on the device: the flat index of
        each row's logits token (`last` is then ignored); `pads` (slot, m [bs] int64 on the
        device): the K/V of row i's tokens before its m[i]-th goes to `slot` (a scratch
        page's), not to their positions, whose K/V they would overwrite; all applied after
        the fill, in stream order."""
        s = self.shapes[len(rows)]
        self._fill(s, rows, [i * self.width + j for i, j in enumerate(last)])
        if fed is not None:
            s.batch.input_ids.copy_(fed)
        if index is not None:
            s.batch.logits_indices.copy_(index)
        if pads is not None:
            slot, m = pads
            before = self.columns[None, :] < m[:, None]
            s.batch.slot_mapping.view(s.bs, self.width).masked_fill_(before, slot)
        self.hidden_in[: hidden.shape[0]].copy_(hidden)
        s.graph.replay()
        self.replays += 1
        return s.out

    def capture(self, page: int, slots: list[int]) -> float:
        def fill(bs: int) -> ForwardBatch:
            s = self.shapes[bs]
            rows = [([0] * self.width, 1, slots[i], [page]) for i in range(bs)]
            self._fill(s, rows, [self.width - 1] * bs)
            return s.batch

        return self._capture_all(fill)


class SpecGraphs:
    """The kinds a speculator replays: `verify`, `bridge` (width K + 1), `ahead` (chain steps
    1 .. K - 1 run ahead, width K + 1 each: each its own buffers, wrappers and pool, so that
    all are filled and planned while the verify pass runs) and `chain` (width 1)."""

    def __init__(self, model, ops, cache, device, max_batch: int, max_pages_per_row: int, k: int):
        args = (model, ops, cache, device, max_batch, max_pages_per_row)
        self.verify = VerifyGraphs(*args, k)
        self.bridge = HeadGraphs(*args, k + 1)
        self.ahead = [HeadGraphs(*args, k + 1) for _ in range(k - 1)]
        self.chain = HeadGraphs(*args, 1)

    def capture(self, page: int, slots: list[int], tap_slots: list[int]) -> float:
        """Captures them all (see each `capture`); returns the seconds taken."""
        seconds = self.verify.capture(page, slots, tap_slots)
        for head in (self.bridge, *self.ahead, self.chain):
            seconds += head.capture(page, slots)
        return seconds

    @property
    def replays(self) -> int:
        kinds = (self.verify, self.bridge, *self.ahead, self.chain)
        return sum(g.replays for g in kinds)
