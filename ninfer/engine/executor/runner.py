"""The model runner: turns scheduled rows into a `ForwardBatch`, runs the model, samples.

Knows nothing about requests, lanes or the prefix cache: a `Row` says which tokens to feed,
from which context length, into which state slot and pages, and whether its last token's logits
are sampled. Index arithmetic is done on the host and sent as ONE pinned, non-blocking copy.

A step is launched (`launch`: forward, sampling, a non-blocking copy of the sampled ids into
pinned memory) and read later (`Launched.result`: the step's only host sync). In between the
caller may launch the next decode step with `feed`: its rows take their input token from the
earlier step's sampled ids on the device, so the GPU never waits for the host's bookkeeping:

    host   launch N | read N-1, bookkeeping | launch N+1 | read N, bookkeeping | ...
    GPU    ... N-1 ][ N ...................][ N+1 ..............................

A step replays a captured CUDA graph (`ninfer.engine.executor.graphs`) when one is set and
serves it: a pure-decode step the decode graphs, a one-row prefill step the prefill graphs, a
mixed step (decode rows, then one prefill chunk) one of each; every other step (Host restores,
in-pass snapshots, `cuda_graphs=False`) runs the model eagerly. `executor.warmup` runs the JIT /
autotune / compile paths once and captures the graphs before serving.

    flat tokens  |<- row 0 ->|<- row 1 ->| ...       position p of row r = ctx_lens[r] + i
    slot_mapping[t] = block_table[row(t), p // 64] * 64 + p % 64
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ninfer.engine.faults import is_fatal
from ninfer.forward import Embeds, ForwardBatch, ModelCache, StateTap, check_state_taps
from ninfer.page import PAGE_SIZE
from ninfer.request import SamplingParams
from ninfer.sampling import apply_token_mask


@dataclass(slots=True)
class Row:
    """One row of a ragged step: `token_ids` at positions [ctx_len, ctx_len + len)."""

    token_ids: list[int]
    ctx_len: int
    slot: int  # physical state slot
    pages: list[int]  # block table entries covering [0, ctx_len + len(token_ids))
    sample: SamplingParams | None  # None: no logits wanted (a non-final prefill chunk)
    generator: torch.Generator | None = None
    before_layer: Callable[[int], None] | None = None  # waits for a Host restore's layer
    # (offset, physical slot) pairs: snapshot the row's state after its first `offset` tokens
    # into that slot, inside the pass (`forward.StateTap`; eager steps only)
    taps: tuple[tuple[int, int], ...] = ()
    # a speculative verify row (`ninfer.engine.speculative`): logits of every token, not only
    # the last (`sample` set)
    verify: bool = False
    # a row of a request with images (`engine.images.RowImages`): its tokens' (t, h, w)
    # positions and image embeddings; the pass then runs eagerly
    images: Any = None


@dataclass(slots=True)
class Feed:
    """Input tokens taken on the device from an earlier launch's sampled ids: row i of the new
    step (one token, sampled) reads `tokens[index[i]]`."""

    tokens: torch.Tensor  # [R_prev] int64 on the device
    index: list[int]


@dataclass(slots=True)
class StepResult:
    """Per row: the sampled token (or None), its logprob record (or None), and the error of a
    row whose sampling failed (or None; its token is then meaningless)."""

    tokens: list[int | None] = field(default_factory=list)
    logprobs: list[dict[int, float] | None] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)


def read_later(x: torch.Tensor) -> Callable[[], list]:
    """Queue a copy of `x` to pinned host memory (on CUDA); the callable waits for that copy
    only (work queued after it keeps running) and returns x as a list. A CPU tensor is read
    when the callable is called."""
    if not x.is_cuda:
        return x.tolist
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    done = torch.cuda.Event()
    done.record()

    def wait() -> list:
        done.synchronize()
        return host.tolist()

    return wait


class Launched:
    """A launched step: its sampled ids are being copied to pinned host memory.

    A step launched with a deferred token mask (`Runner.launch(..., mask=callable)`) has run
    its forward only; its rows are sampled at `sample()` (or at the first `feed` / `result`),
    with the mask the callable returns then: the host computes it while the GPU runs the
    forward."""

    def __init__(self, rows: list[Row], sampled, deferred: Callable[[], object] | None = None):
        self.rows = rows
        self.sampled = None  # the sampler's result (`ninfer.sampling.SampleResult`) or None
        self.tokens: torch.Tensor | None = None  # sampled ids on the device, for a `Feed`
        self._read: Callable[[], list] | None = None  # `read_later` of the sampled ids
        self._deferred = deferred  # () -> the sampler's result, run once by `sample`
        if sampled is not None:
            self._copy(sampled)
        self._result: StepResult | None = None

    def _copy(self, sampled) -> None:
        self.sampled = sampled
        self.tokens = sampled.token_ids
        self._read = read_later(self.tokens)

    def sample(self) -> None:
        """Sample a step launched with a deferred mask (nothing for any other step)."""
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            self._copy(deferred())

    def feed(self, index: list[int]) -> Feed:
        self.sample()
        if self.tokens is None:
            raise ValueError("feed: the launched step sampled nothing")
        return Feed(self.tokens, index)

    def result(self) -> StepResult:
        """Waits for the step's sampled ids (the host sync) and maps them to rows."""
        if self._result is not None:
            return self._result
        self.sample()
        rows = self.rows
        n = len(rows)
        out = StepResult(tokens=[None] * n, logprobs=[None] * n, errors=[None] * n)
        if self.sampled is not None:
            tokens = self._read()
            logprobs = self.sampled.logprobs
            errors = getattr(self.sampled, "errors", None)
            k = 0
            for i, r in enumerate(rows):
                if r.sample is not None:
                    out.tokens[i] = tokens[k]
                    out.logprobs[i] = logprobs[k] if logprobs is not None else None
                    out.errors[i] = errors[k] if errors is not None else None
                    k += 1
        self._result = out
        return out


class RowSamples:
    """Samples drawn row by row after the batched draw raised: per row a one-row result or
    None (with its error). Quacks like `ninfer.sampling.SampleResult`, plus `errors`."""

    def __init__(self, rows: list[tuple[object | None, str | None]], device) -> None:
        zero = torch.zeros(1, dtype=torch.int64, device=device)  # a failed row's placeholder
        self.token_ids = torch.cat([zero if r is None else r.token_ids for r, _ in rows])
        self._rows = [r for r, _ in rows]
        self.errors = [err for _, err in rows]

    @property
    def logprobs(self) -> list[dict[int, float] | None]:
        return [None if r is None else r.logprobs[0] for r in self._rows]


class Runner:
    """Owns the model, the op set and the `ModelCache` view of the memory pools."""

    def __init__(self, model, ops, cache: ModelCache, device: torch.device, sampler) -> None:
        self.model = model
        self.ops = ops
        self.cache = cache
        self.device = device
        # callable(logits, params, generators) -> an object with `token_ids` (int64 [R] on the
        # device, no host sync) and `logprobs` (per row or None; may sync when read)
        self.sampler = sampler
        self.graphs = None  # a DecodeGraphs once captured (`executor.warmup`)
        self.prefill_graphs = None  # a PrefillGraphs once captured
        self.split_steps = 0  # mixed steps run as a decode replay + a prefill replay
        self.startup: dict[str, float] = {}  # warm-up figures (seconds)

    def build_batch(self, rows: list[Row], feed: Feed | None = None) -> ForwardBatch:
        q_lens = [len(r.token_ids) for r in rows]
        ctx_lens = [r.ctx_len for r in rows]
        n_rows, n_tok = len(rows), sum(q_lens)
        width = max(len(r.pages) for r in rows)
        want = [i for i, r in enumerate(rows) if r.sample is not None]
        n_logits = sum(q_lens[i] if rows[i].verify else 1 for i in want)
        # one int64 host buffer: ids | positions | slot_mapping | cu_q | slots | logits idx | table,
        # each segment 16-byte aligned (Triton specializes kernels on pointer alignment: views at
        # odd offsets would compile new kernel variants whenever the parity of T or R changes)
        sizes = [n_tok, n_tok, n_tok, n_rows + 1, n_rows, n_logits, n_rows * width]
        padded = [n + (n & 1) for n in sizes]
        host = torch.zeros(sum(padded), dtype=torch.int64)
        ids, pos, smap, cu, slots, lidx, table = _segments(host, padded, sizes)
        q_t = torch.tensor(q_lens, dtype=torch.int64)
        torch.cumsum(q_t, 0, out=cu[1:])
        table2d = table.view(n_rows, width)
        for i, r in enumerate(rows):
            table2d[i, : len(r.pages)] = torch.tensor(r.pages, dtype=torch.int64)
        if n_tok == n_rows:  # decode-only step, one token per row: vectorised over the rows
            ids.copy_(_int64(itertools.chain.from_iterable(r.token_ids for r in rows)))
            pos.copy_(torch.tensor(ctx_lens, dtype=torch.int64))
            page = table2d[torch.arange(n_rows), pos // PAGE_SIZE]
            torch.add(page * PAGE_SIZE, pos % PAGE_SIZE, out=smap)
        else:  # row by row: no gathers over the tokens (host time grows with them)
            _fill_prefill_rows(rows, table2d, ids, pos, smap)
        slots.copy_(torch.tensor([r.slot for r in rows], dtype=torch.int64))
        if n_logits == len(want):
            lidx.copy_(cu[1:][torch.tensor(want, dtype=torch.int64)] - 1)
        else:  # verify rows: every token's logits, in row order
            starts = cu.tolist()
            spans = (range(starts[i] if rows[i].verify else starts[i + 1] - 1, starts[i + 1])
                     for i in want)  # fmt: skip
            lidx.copy_(_int64(itertools.chain.from_iterable(spans)))
        if self.device.type == "cuda":
            host = host.pin_memory()
        dev = host.to(self.device, non_blocking=True)
        ids, pos, smap, cu, slots, lidx, table = _segments(dev, padded, sizes)
        if feed is not None:  # decode rows: flat token i is row i's only token
            ids.copy_(_gather(feed, self.device))
        batch = ForwardBatch(
            input_ids=ids,
            positions=pos,
            q_lens=q_lens,
            ctx_lens=ctx_lens,
            cu_q=cu.to(torch.int32),
            state_slots=slots,
            block_table=table.view(n_rows, width).to(torch.int32),
            slot_mapping=smap,
            logits_indices=lidx,
            before_layer=_join_hooks([r.before_layer for r in rows if r.before_layer]),
        )
        if any(r.images is not None for r in rows):
            self._add_images(batch, rows, cu.tolist())
        taps = tuple(StateTap(i, o, d) for i, r in enumerate(rows) for o, d in r.taps)
        if taps:
            check_state_taps(taps, q_lens, [r.slot for r in rows])
            batch.state_taps = taps
        return batch

    @torch.no_grad()
    def encode_image(self, pixel_values: torch.Tensor, grids: list) -> torch.Tensor:
        """The vision tower's output [tokens, hidden] for whole images' `pixel_values`."""
        tower = self.model.model.visual
        dtype = next(tower.parameters()).dtype
        return tower(pixel_values.to(self.device, dtype), grids)

    def _add_images(self, batch: ForwardBatch, rows: list[Row], starts: list[int]) -> None:
        """The pass's [3, T] positions (text rows t = h = w = their position) and the image
        embeddings of the rows that carry them."""
        parts, at, values = [], [], []
        for r, start in zip(rows, starts[:-1], strict=True):
            im = r.images
            if im is None:
                n = len(r.token_ids)
                parts.append(torch.arange(r.ctx_len, r.ctx_len + n).expand(3, -1))
                continue
            parts.append(im.positions)
            if im.rows is not None:
                at.append(im.rows + start)
                values.append(im.values)
        batch.mrope_positions = torch.cat(parts, dim=1).to(self.device)
        if at:
            batch.embeds = Embeds(torch.cat(at).to(self.device), torch.cat(values))

    def forward(self, rows: list[Row], feed: Feed | None = None) -> torch.Tensor:
        """Logits [N, vocab] fp32 of the rows that sample: a graph replay for a pure-decode
        step the captured graphs serve, else the eager model. `feed`: see `launch`."""
        if feed is not None:
            _check_feed(rows, feed)
        if self.graphs is not None and self.graphs.can_run(rows):
            return self.graphs.run(rows, None if feed is None else _gather(feed, self.device))
        if feed is None and self.prefill_graphs is not None:
            if self.prefill_graphs.can_run(rows):
                return self.prefill_graphs.run(rows)
            logits = self._split_mixed(rows)
            if logits is not None:
                return logits
        return self.model(self.build_batch(rows, feed), self.cache, self.ops)

    def _split_mixed(self, rows: list[Row]) -> torch.Tensor | None:
        """A mixed step (the scheduler's decode rows, then one prefill chunk) as two graph
        replays, decode rows first, when a captured graph serves each part: rows are
        independent, so the two passes compute what the mixed one does, and two replays beat one
        eager pass bound by the host (figures: docs/results-h200.md, prefill graphs).
        Returns the logits of the sampling rows in row order, or None (run it eagerly)."""
        head, tail = rows[:-1], rows[-1:]
        if not head or self.graphs is None or not self.graphs.can_run(head):
            return None
        if not self.prefill_graphs.can_run(tail):
            return None
        decode = self.graphs.run(head)  # every decode row samples (can_run)
        prefill = self.prefill_graphs.run(tail)  # separate pools: decode's logits stay valid
        self.split_steps += 1
        return decode if tail[0].sample is None else torch.cat([decode, prefill])

    def can_overlap(self, rows: list[Row]) -> bool:
        """Whether the next step may be launched before this one's result is read: a pure
        decode step replayed from a graph (its host buffers are guarded by an event), or any
        step on the CPU (where nothing runs ahead: the overlap only reorders bookkeeping)."""
        if self.device.type != "cuda":
            return True
        return self.graphs is not None and self.graphs.can_run(rows)

    def launch(self, rows: list[Row], feed: Feed | None = None, mask=None) -> Launched:
        """Queue one ragged forward pass and the sampling of every row that asks for it; no
        host sync. `feed`: every row is one sampled token whose id comes from an earlier
        launch (`Launched.feed`), not from `Row.token_ids`. `mask`: the structured outputs'
        allowed tokens (`ninfer.structured.TokenMask`, its rows indexing the sampling rows),
        or a callable returning one (or None) that `Launched.sample` calls: the sampling is
        then queued after the forward, once the host has the mask."""
        logits = self.forward(rows, feed)
        want = [r for r in rows if r.sample is not None]
        if not want:
            return Launched(rows, None)
        if callable(mask):
            return Launched(rows, None, deferred=lambda: self.sample_rows(logits, want, mask()))
        return Launched(rows, self.sample_rows(logits, want, mask))

    def sample_rows(self, logits: torch.Tensor, want: list[Row], mask=None):
        """Sample every row at once; if that raises, row by row, so that a row whose sampling
        fails fails alone (`RowSamples.errors`) and the others get their tokens."""
        if mask is not None:
            apply_token_mask(logits, mask.rows, mask.bits)
        params, gens = [r.sample for r in want], [r.generator for r in want]
        # A fault can strike after the batch call advanced some seeded generators: the row-by-row
        # retry starts each from where it stood before the step, so a neighbour draws as in a
        # cold run. (Host-side generator state: no device sync.)
        before = [(g, g.get_state()) for g in gens if g is not None]
        try:
            return self.sampler(logits, params, gens)
        except Exception as e:
            if is_fatal(e):  # a poisoned context: nothing to retry
                raise
            for g, state in before:
                g.set_state(state)
            rows = [self._sample_row(logits, params, gens, i) for i in range(len(want))]
            return RowSamples(rows, logits.device)

    def _sample_row(self, logits, params, gens, i: int):
        try:
            return self.sampler(logits[i : i + 1], params[i : i + 1], gens[i : i + 1]), None
        except Exception as e:
            if is_fatal(e):
                raise
            return None, f"{type(e).__name__}: {e}"

    def step(self, rows: list[Row]) -> StepResult:
        """Run one ragged forward pass and sample every row that asks for it."""
        return self.launch(rows).result()


def _fill_prefill_rows(rows, table2d, ids, pos, smap) -> None:
    """The token ids, positions and KV slots of each row, in its segment of the flat tokens:
    ids from one array per row (an `array` of a list is twice as fast as of a chained
    iterator), positions as a range, slots as a slice of its pages' slot ranges."""
    offset = 0
    in_page = torch.arange(PAGE_SIZE, dtype=torch.int64)
    for i, r in enumerate(rows):
        q, c = len(r.token_ids), r.ctx_len
        span = slice(offset, offset + q)
        ids[span].copy_(_int64(r.token_ids))
        torch.arange(c, c + q, out=pos[span])
        slots = (table2d[i, : len(r.pages), None] * PAGE_SIZE + in_page).view(-1)
        smap[span].copy_(slots[c : c + q])
        offset += q


def _int64(values) -> torch.Tensor:
    """A CPU int64 tensor of the ints `values` (through an `array`: much less host time than
    `torch.tensor` on a list)."""
    buf = array.array("q", values)
    return torch.frombuffer(buf, dtype=torch.int64) if buf else torch.empty(0, dtype=torch.int64)


def _segments(flat: torch.Tensor, padded: list[int], sizes: list[int]) -> list[torch.Tensor]:
    """`flat` split into segments of `padded` lengths, each cut to its `sizes` length."""
    return [s[:n] for s, n in zip(flat.split(padded), sizes, strict=True)]


def _check_feed(rows: list[Row], feed: Feed) -> None:
    if len(feed.index) != len(rows) or any(len(r.token_ids) != 1 or r.sample is None for r in rows):
        raise ValueError("feed: every row must be one sampled token, one index per row")


def _gather(feed: Feed, device: torch.device) -> torch.Tensor:
    """The fed ids [R] on the device: a slice when the rows keep the earlier order (the
    steady state), else one small gather."""
    n = len(feed.index)
    if feed.index == list(range(n)):
        return feed.tokens[:n]
    index = torch.tensor(feed.index, dtype=torch.int64)
    if device.type == "cuda":
        index = index.pin_memory()
    return feed.tokens.index_select(0, index.to(device, non_blocking=True))


def _join_hooks(hooks: list[Callable[[int], None]]) -> Callable[[int], None] | None:
    """One before_layer callback calling every row's (restores of several admitted lanes)."""
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    def joined(layer: int) -> None:
        for hook in hooks:
            hook(layer)

    return joined
