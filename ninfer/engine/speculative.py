"""Speculative decoding with the checkpoint's MTP head: drafting, verification, acceptance and
the exact roll-back of the rejected tokens (engine thread only).

Every decoding lane speculates: it decodes K + 1 tokens per step:

    step       verify row: [t_F, d_1 .. d_k] at positions F .. F+k (one target pass, logits of
               every token, StateTaps after 1 .. k tokens into scratch slots)
    accept     `sampling.accept_drafts`: greedy = the longest prefix of drafts the target's
               argmax agrees with, plus the target's token after it; sampled = rejection
               sampling. A structured output's grammar masks each position's logits first,
               with the tokens it allows after the drafts before it (so a draft it rejects is
               never accepted; where it allows one token only, that is the draft); a request
               with logprobs gets each token's from its position
    settle     the Stepper appends the n tokens (fewer when one stops the request, or at a
               chat's output boundary: `cut`); `settle_row` sets computed = F + n and copies
               the state after n tokens of the row into the lane's slot
               (`StatePool.copy_image`) unless n = k + 1
    bridge     the MTP head runs over the positions the pass committed (`bridge`), before the
               cache commits them
    draft      `draft`: draft 1 from the bridge's logits, then k - 1 one-token head passes

The roll-back of the GDN state is the per-position snapshot design: the verify pass writes
the state after each of its first k tokens into a scratch slot (`forward.StateTap`), and the
accepted one is copied into the lane's slot (the CUDA ops advance each tap from the row's
initial state: `ops.cuda.passmeta.TapRest`). An op set that cannot snapshot at offsets 1 .. k
(`Ops.tap_stride > 1`; none of ours) saves the lane's state before the pass instead and,
when a draft is rejected, restores it and runs the accepted tokens again (`replay`: a whole
extra pass).
Attention K/V needs no roll-back: positions past the frontier are rewritten before anything
reads them (a pass reads [0, its own position]).

The head's K/V lives in its own entry of every KV page (`MemoryGeometry.kv_layers`), one token
behind the target: head position p reads the target's final hidden state at p and the token at
p + 1. After every pass over a lane's row [s, e) (a prefill chunk, or a verify row of which
n tokens were accepted: e = s + n) the head runs over the same positions ("bridge") with the
tokens [s + 1, e] (the last one sampled by that pass, or a prompt token), so its K/V covers
what the target's does wherever the cache commits or publishes a page; the bridge's last
logits are draft 1 for a lane that samples next, and k - 1 one-token head passes (their own
hidden fed back) draft the rest. The chain stays on the device: each step's tokens (a greedy
lane's argmax, a sampled lane's draw with its generator) are the next step's input ids
(`_chain_fed`), and the drafts stay there: the next verify graph copies them into its input
ids, and they are read back with the verify rows' outcome, in one copy (`Draft.pending`).
A lane resumed from the prefix cache starts bridging at its resumed frontier: the head's K/V
below it comes with the cached pages. Drafts are only proposals: whatever the head's K/V
holds, the output is the target's, verified.

With CUDA graphs (`capture`, at warm-up) the steady state replays captured passes: the verify
step when every row is a verify row of K + 1 tokens, the bridge when each of its rows is one
(padded to K + 1 tokens), and each chain step (`executor.spec_graphs`); any other step runs
eagerly. A replayed verify step's bridge is queued right behind it, before the host reads
anything (`_bridge_ahead`): how many drafts each row accepts and the token after them (a
greedy row's from the argmax, a sampled row's by the rejection rule on the device,
`sampling.accept_on_device`, with the draws the host rule makes), the head's input ids and
the index of its draft-1 logits are worked out on the device from the pass's logits and the
drafts it read (`bridge_inputs`), so the GPU runs the bridge while the host reads the
outcome, appends the tokens and settles. The draft chain is queued there too
(`_chain_ahead`): chain step j's position depends on the acceptance, so each step runs the
head over a window of K + 1 positions, planned on the host, whose one real row the device
picks, its padding's K/V sent to a trash page where it would overwrite history. A
steady-state step is then

    verify replay, bridge replay, chain window replays | read outcome (+ drafts) | settle

and its one host sync is that read: the GPU idles only while the host settles, schedules
and plans the next verify. No step is run further ahead (the next verify's rows depend on
this one's acceptance). A lane the host cuts short (a stop, an output boundary) or that has
room for fewer than K drafts drafts after the read instead, as does every lane of a step
whose windows reach past a row's pages. A step with a row accepted on the host (a grammar's
masks depend on the drafts, logprobs are read per token: `_checked`) reads its drafts before
the pass and bridges after the read.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ninfer.engine import faults
from ninfer.engine.executor.runner import Feed, Row, Runner, StepResult, read_later
from ninfer.engine.images import RowImages
from ninfer.engine.kv.lane import KVLane
from ninfer.memory.state_pool import StatePool
from ninfer.page import PAGE_SIZE
from ninfer.sampling import (
    accept_drafts,
    accept_greedy,
    accept_on_device,
    apply_token_mask,
    draw,
    greedy_outcome,
    probabilities,
    token_logprobs,
)

logger = logging.getLogger(__name__)


def draft_vocab(n: int | None, vocab_size: int, added: frozenset[int]) -> list[int] | None:
    """The token ids a draft head trimmed to `n` proposes: ids 0 .. n-1 and the tokenizer's
    `added` ones (end of turn, `</think>`, `<tool_call>`: the tokens a chat's output
    boundaries and stops need). None: the whole vocabulary (n None, or as large)."""
    if n is None or n >= vocab_size:
        return None
    return sorted(set(range(n)) | {i for i in added if 0 <= i < vocab_size})


def bridge_inputs(
    drafts: torch.Tensor, m: torch.Tensor, after: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """On the device, the bridge over verify rows before their outcome is read: `drafts`
    [rows, K] the drafts verified, `m` [rows] how many each accepts, `after` [rows] the token
    the target yields after them. Returns (the head's input ids [rows, K + 1]: the accepted
    drafts, then `after`, which also pads the rest of the row; the flat index of each row's
    last accepted position [rows])."""
    rows, k = drafts.shape
    cols = torch.arange(k + 1, device=drafts.device)
    tail = after[:, None]
    ids = torch.where(cols < m[:, None], torch.cat([drafts, tail], dim=1), tail)
    return ids, torch.arange(rows, device=drafts.device) * (k + 1) + m


def _logit_starts(rows: list[Row]) -> dict[int, int]:
    """Row index -> its first row in a step's logits, for the rows that sample: a verify row
    has one per token (K + 1), any other sampling row one; in row order."""
    starts, at = {}, 0
    for i, r in enumerate(rows):
        if r.sample is not None:
            starts[i] = at
            at += len(r.token_ids) if r.verify else 1
    return starts


class ChainIds:
    """The token ids a draft chain kept on the device (`Speculator._chain_fed`) proposed:
    `steps` (lane indices, ids [len(lanes)] int64 on the device) per chain step. `host()`
    reads them all in one copy (once); `grid` [lanes, steps] is set when every step covers
    every lane (the rows a verify graph takes its drafts from, without a read)."""

    def __init__(self, steps: list[tuple[list[int], torch.Tensor]]) -> None:
        self.steps = steps
        n = len(steps[0][0])
        full = all(len(at) == n for at, _ in steps)
        self.grid = torch.stack([t for _, t in steps], dim=1) if full else None
        self.counts = [0] * n  # each lane's number of ids
        for at, _ in steps:
            for j in at:
                self.counts[j] += 1
        self._host: list[list[int]] | None = None

    def host(self) -> list[list[int]]:
        """Each lane's ids, in chain order (one device read, the first time)."""
        if self._host is None:
            out: list[list[int]] = [[] for _ in self.steps[0][0]]
            flat = iter(torch.cat([t for _, t in self.steps]).tolist())
            for at, _ in self.steps:
                for j in at:
                    out[j].append(next(flat))
            self._host = out
        return self._host


class Draft:
    """A lane's proposals for its next verify row: tokens and, for a sampled request, the
    distributions [k, V] they were drawn from. A chain's tokens may still be on the device
    (`chain`, the lane's index `at` in it): `tokens` reads them (one copy for every lane of
    that chain), `ids` is their device tensor without a read (None where the chain's steps do
    not cover every lane), `pending` says whether they are still unread."""

    __slots__ = ("_tokens", "probs", "chain", "at")

    def __init__(self, tokens: list[int], probs: torch.Tensor | list | None = None) -> None:
        self._tokens: list[int] | None = tokens
        self.probs = probs
        self.chain: ChainIds | None = None
        self.at = 0

    @property
    def tokens(self) -> list[int]:
        if self._tokens is None:
            self._tokens = list(self.chain.host()[self.at]) if self.chain is not None else []
        return self._tokens

    @tokens.setter
    def tokens(self, value: list[int]) -> None:
        self._tokens, self.chain = value, None

    def defer(self, chain: ChainIds, at: int) -> None:
        """The tokens are lane `at` of `chain`, still on the device."""
        self._tokens, self.chain, self.at = None, chain, at

    @property
    def pending(self) -> bool:
        return self._tokens is None and self.chain is not None

    @property
    def ids(self) -> torch.Tensor | None:
        grid = self.chain.grid if self.pending else None
        return None if grid is None else grid[self.at]

    def __len__(self) -> int:
        return self.chain.counts[self.at] if self.pending else len(self.tokens)


@dataclass(slots=True)
class SpeculationStats:
    """Counters since the engine started: verify rows run, draft tokens proposed and accepted,
    tokens the verify rows yielded (accepted drafts plus the target's own, before a stop or
    max_tokens cuts them), and the head's passes that raised (`head_faults`: each cost its
    lanes their next drafts, no output)."""

    verify_rows: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    head_faults: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_row(self) -> float:
        return self.emitted / self.verify_rows if self.verify_rows else 0.0

    def since(self, before: SpeculationStats) -> SpeculationStats:
        """The counts after `before` (an earlier copy)."""
        return SpeculationStats(
            self.verify_rows - before.verify_rows, self.drafted - before.drafted,
            self.accepted - before.accepted, self.emitted - before.emitted,
            self.head_faults - before.head_faults,
        )  # fmt: skip


@dataclass(slots=True)
class SpecLaunched:
    """A step with verify rows, run and accepted: `result()` gives each row's tokens (a list
    for a verify row). `hidden` [T, H]: the target's final hidden states of the pass; `starts`:
    each row's first flat token; `taps[i]`: row i's scratch slots by offset (1 .. k)."""

    rows: list[Row]
    hidden: torch.Tensor
    starts: list[int]
    step: StepResult
    taps: dict[int, list[int]] = field(default_factory=dict)
    # the bridge's (logits, head hidden) when it ran at launch (`Speculator._bridge_ahead`)
    bridged: tuple[torch.Tensor, torch.Tensor] | None = None

    def sample(self) -> None:
        """Nothing to do (sampled at launch); `Launched`'s interface."""

    def result(self) -> StepResult:
        return self.step


class Speculator:
    """Drafts with `runner.model.mtp`, verifies and accepts; owns the lanes' drafts
    (`drafts`, by lane id), the scratch slots of the verify taps and the counters (`stats`).
    `propose`, when set, replaces the head's proposals: (lane, k) -> k tokens (benches and
    tests: a controlled draft; a sampled request draws nothing then, its draft distribution is
    the proposal itself). The head runs either way. `control`, when set (benches only), says
    how many of a verify row's k drafts are accepted, whatever they are: the row yields those
    drafts and the target's greedy token after them, so a speed figure gets the acceptance it
    asks for on any weights (the output is then not the target's)."""

    def __init__(
        self,
        runner: Runner,
        states: StatePool,
        k: int,
        scratch: list[int],
        vocab: list[int] | None = None,
        trash_page: int | None = None,
    ) -> None:
        """`vocab`: the token ids the head proposes from (sorted; None: all of them);
        `trash_page`: a KV page no lane holds (`KVPool.scratch_pages`), where the chain run
        ahead writes the K/V of its windows' padding (`_chain_ahead`; without one the chain
        runs after the read)."""
        if runner.model.mtp is None:
            raise ValueError("speculative='mtp': the model has no MTP draft head")
        model = runner.model
        head = model.lm_head.weight
        if vocab is not None and head.dtype.itemsize == 1:
            raise ValueError("draft_vocab: the checkpoint's LM head is FP8; trim a bf16 head")
        model.mtp.set_vocab(vocab, head)
        self.vocab_size = model.config.vocab_size
        self.runner, self.states, self.k = runner, states, k
        # an op set that cannot snapshot at every offset: save and replay instead (`launch`)
        self.replay = runner.ops.tap_stride != 1
        self.scratch = scratch  # k physical slots per verify row of a step
        self.drafts: dict[int, Draft] = {}
        self.stats = SpeculationStats()
        self.propose: Callable[[KVLane, int], list[int]] | None = None
        self.control: Callable[[int], int] | None = None
        self.graphs = None  # `executor.spec_graphs.SpecGraphs` once captured (`capture`)
        self.trash = None if trash_page is None else trash_page * PAGE_SIZE
        self.chain_ahead = True  # tests and benches turn it off to compare
        self.ahead_runs = 0  # chains run ahead (tests, benchmarks)
        # lane id -> (its draft from the chain run ahead, the frontier it assumed, its
        # generator's state before that chain drew: `_take_ahead`)
        self.ahead: dict[int, tuple[Draft, int, object]] = {}

    def capture(self, page: int, slots: list[int], max_pages_per_row: int) -> float:
        """Captures the verify and head graphs (CUDA) for batches up to len(slots), on the
        free `page` and `slots` and the scratch slots. Returns the seconds taken."""
        from ninfer.engine.executor.spec_graphs import SpecGraphs

        r = self.runner
        graphs = SpecGraphs(r.model, r.ops, r.cache, r.device, len(slots), max_pages_per_row,
                            self.k)  # fmt: skip
        seconds = graphs.capture(page, slots, self.scratch)
        self.graphs = graphs
        return seconds

    def verify_tokens(self, lane: KVLane) -> list[int]:
        """The drafts the lane's next decode row verifies ([] for none)."""
        draft = self.drafts.get(lane.lane_id)
        if draft is None:
            return []
        # still on the device: placeholders, which `launch` replaces
        return [0] * len(draft) if draft.pending else list(draft.tokens)

    # ---- the verify step -------------------------------------------------------------------
    def launch(self, rows: list[Row], lanes: list[KVLane], mask=None) -> SpecLaunched:
        """Run the step's target pass (prefill rows, plain decode rows and verify rows; row i
        is lanes[i]'s), sample the plain rows (`mask`: their structured outputs' masks) and
        accept the verify rows against the lanes' drafts. Each verify row gets its scratch
        slots as taps here (with `replay`: one scratch slot, the lane's state saved into it
        before the pass)."""
        runner = self.runner
        taps, used = {}, 0
        drafts = {
            i: self.drafts.pop(lanes[i].lane_id, None) for i, r in enumerate(rows) if r.verify
        }
        self.ahead = {}
        # rows whose acceptance needs the host: a grammar's masks over the drafts, logprobs
        checked = [i for i in drafts if self._checked(lanes[i], rows[i])]
        graph = self._verify_graph(rows)
        fed = self._fed_drafts(rows, drafts) if graph and not checked else None
        if fed is None:
            self._read_drafts(rows, drafts)
        masks = self._grammar_masks(rows, lanes, drafts, checked) if checked else None
        for i, r in enumerate(rows):
            if r.verify and len(r.token_ids) > 1:
                n = 1 if self.replay else len(r.token_ids) - 1
                slots = self.scratch[used : used + n]
                used += n
                taps[i] = slots
                if self.replay:
                    self.states.copy_image(r.slot, slots[0])
                elif not graph:
                    r.taps = r.taps + tuple((o + 1, s) for o, s in enumerate(slots))
        ahead = None  # the bridge run before the read (`_bridge_ahead`)
        if graph:
            meta = [(r.token_ids, r.ctx_len, r.slot, r.pages) for r in rows]
            logits, hidden = self.graphs.verify.run(meta, self.scratch[:used], fed)
            q_lens = [len(r.token_ids) for r in rows]
            known = all(r.sample.greedy or drafts[i].probs is not None for i, r in enumerate(rows))
            if known and not checked and self.graphs.bridge.fits(meta):
                ahead = self._contained_ahead(rows, lanes, meta, drafts, logits, hidden, fed)
        else:
            batch = runner.build_batch(rows)
            logits, hidden = runner.model.forward_hidden(batch, runner.cache, runner.ops)
            if batch.before_layer is not None:  # a Host restore: the head's K/V entry is the
                batch.before_layer(len(runner.model.model.layers))  # layer after the model's
            q_lens = batch.q_lens
        n = len(rows)
        step = StepResult(tokens=[None] * n, logprobs=[None] * n, errors=[None] * n)
        starts = [0, *itertools.accumulate(q_lens)]  # host: no copy back
        if ahead is not None:  # the bridge runs while the host reads and accepts
            read, bridged = ahead
            flat = read()
            if fed is not None:  # the drafts the rows verified came in the same copy
                self._put_drafts(rows, drafts, flat[2 * n :], fed.shape[1])
            for i, r in enumerate(rows):
                drafted, m = r.token_ids[1:], flat[i]
                step.tokens[i] = self._count(len(drafted), [*drafted[:m], flat[n + i]])
                got = self.ahead.get(lanes[i].lane_id)
                if got is not None:  # the frontier that chain assumed
                    self.ahead[lanes[i].lane_id] = (got[0], r.ctx_len + m + 1, got[2])
            return SpecLaunched(rows, hidden, starts, step, taps, bridged)
        if masks is not None:  # before any argmax or draw: the targets follow the grammars
            apply_token_mask(logits, *masks)
        # the greedy verify rows' target tokens, read in one copy for all of them
        greedy = any(r.verify and r.sample is not None and r.sample.greedy for r in rows)
        if fed is not None:
            flat = torch.cat([logits.argmax(dim=-1), fed.flatten()]).tolist()
            argmax = flat[: logits.shape[0]]
            self._put_drafts(rows, drafts, flat[logits.shape[0] :], fed.shape[1])
        else:
            argmax = logits.argmax(dim=-1).tolist() if greedy else None
        plain, plain_rows = [], []
        for i, at in _logit_starts(rows).items():
            r = rows[i]
            width = len(r.token_ids) if r.verify else 1
            if r.verify:
                draft = drafts[i]
                probs = None if draft is None or draft.probs is None else draft.probs
                target = argmax[at : at + width] if r.sample.greedy else None
                try:  # a fault in one row's acceptance fails its request alone
                    step.tokens[i] = self._accept(r, logits[at : at + width], probs, target)
                    if r.sample.logprobs is not None:  # one dict per token, from its own row
                        step.logprobs[i] = token_logprobs(logits[at:], step.tokens[i], r.sample)
                except Exception as e:
                    if faults.is_fatal(e):
                        raise
                    step.tokens[i], step.errors[i] = None, f"{type(e).__name__}: {e}"
            else:
                plain.append(at)
                plain_rows.append(i)
        if plain:
            sampled = runner.sample_rows(logits[plain], [rows[i] for i in plain_rows], mask)
            tokens = sampled.token_ids.tolist()
            errors = getattr(sampled, "errors", None)
            for j, i in enumerate(plain_rows):
                step.tokens[i] = tokens[j]
                step.logprobs[i] = sampled.logprobs[j]
                step.errors[i] = errors[j] if errors is not None else None
        return SpecLaunched(rows, hidden, starts, step, taps)

    @staticmethod
    def _checked(lane: KVLane, row: Row) -> bool:
        """Whether a verify row is accepted on the host: its request has a grammar (or a
        thinking budget) to mask the drafts with, or wants logprobs."""
        return lane.request.matcher is not None or (
            row.sample is not None and row.sample.logprobs is not None
        )

    def _grammar_masks(self, rows: list[Row], lanes: list[KVLane], drafts: dict, checked: list):
        """Before the pass: the structured outputs' masks of the `checked` verify rows, as
        (logits rows, bitmask) for `sampling.apply_token_mask`, or None. At position j of a
        row, the tokens its grammar allows after the row's first j drafts
        (`structured.Matcher.fill_drafts`: a draft the grammar rejects is then never the
        target's, so acceptance stops before it). Where the grammar allows one token only
        (a JSON key's quotes, a forced tool call's name), that token becomes the draft, in
        the row and its `Draft` (a sampled draft's distribution there one-hot on it: the
        rejection rule stays exact for any proposal it draws from), so a forced stretch is
        accepted whatever the head proposed."""
        starts = _logit_starts(rows)
        where, parts = [], []
        width = (self.vocab_size + 31) // 32
        for i in checked:
            matcher = lanes[i].request.matcher
            if matcher is None or i not in starts:
                continue
            row, forced = rows[i], []
            drafted = row.token_ids[1:]
            bits = torch.empty(len(drafted) + 1, width, dtype=torch.int32)
            if not matcher.fill_drafts(drafted, bits, forced):
                continue
            where.extend(range(starts[i], starts[i] + len(drafted) + 1))
            parts.append(bits)
            if forced:
                self._force(row, drafts.get(i), drafted, forced)
        if not parts:
            return None
        bits = torch.cat(parts)
        return where, bits.pin_memory() if self.runner.device.type == "cuda" else bits

    @staticmethod
    def _force(row: Row, draft: Draft | None, drafted: list[int], forced: list[int]) -> None:
        """The row's drafts become `drafted` (some `forced` by its grammar); a sampled draft's
        distribution at those positions one-hot on the forced token."""
        row.token_ids[1:] = drafted
        if draft is None:
            return
        probs = draft.probs
        if isinstance(probs, list) and probs:
            probs = draft.probs = torch.stack(probs)
        draft.tokens = list(drafted)
        if isinstance(probs, torch.Tensor):
            for j in forced:
                probs[j].zero_()
                probs[j, drafted[j]] = 1.0

    @staticmethod
    def _put_drafts(rows: list[Row], drafts: dict, ids: list[int], k: int) -> None:
        """The drafts the verify rows took on the device (`_fed_drafts`), read back as `ids`
        (k per row, in row order), into the rows (which held placeholders) and drafts."""
        for j, i in enumerate(sorted(drafts)):
            drafts[i].tokens = rows[i].token_ids[1:] = ids[j * k : (j + 1) * k]

    def _contained_ahead(
        self, rows: list[Row], lanes: list[KVLane], meta: list, drafts: dict, logits, hidden, fed
    ):
        """`_bridge_ahead`, a non-fatal fault in it contained (`_head_fault`, no lane named):
        the step then reads and accepts on the host as it does without a bridge run ahead
        (its settle bridges again), each sampled row's generator set back to before the
        draws made on the device (so the host draws what they drew), and any chain run ahead
        dropped. Returns `_bridge_ahead`'s result, or None after a fault."""
        # a generator's state is its seed and offset, on the host: no sync
        saved = [None if r.sample.greedy or r.generator is None else r.generator.get_state()
                 for r in rows]  # fmt: skip
        try:
            return self._bridge_ahead(rows, lanes, meta, drafts, logits, hidden, fed)
        except Exception as e:
            for r, state in zip(rows, saved, strict=True):
                if state is not None:
                    r.generator.set_state(state)
            self.ahead = {}
            self._head_fault(e, [])
            return None

    def _bridge_ahead(
        self, rows: list[Row], lanes: list[KVLane], meta: list, drafts: dict, logits, hidden, fed
    ):
        """The bridge of a replayed verify step, queued before the host reads anything, so
        that the GPU runs it while the host accepts and settles. Each row's outcome is worked
        out on the device from the pass's logits and the drafts it read: how many drafts it
        accepts (m) and the token after them (`sampling.greedy_outcome`; a sampled row's by
        `sampling.accept_on_device`, the rejection rule with the draws `_accept` would make;
        with `control`, m drawn here as `_accept` would); the head then runs over the row's
        K + 1 positions with the accepted tokens (`bridge_inputs`), logits at position m.
        Then the next drafts, where they can run ahead too (`_chain_ahead`).
        Returns (the read: a callable giving m [rows], the tokens after [rows], then the
        drafts [rows * K] when `fed`; (bridge logits [rows, V'], head hidden
        [rows * (K + 1), H]))."""
        g, k = self.graphs, self.k
        bs, width = len(meta), k + 1
        verified = g.verify.ids(bs)[:, 1:]
        if self.control is not None:
            m = torch.tensor([min(self.control(k), k) for _ in range(bs)])
            if logits.is_cuda:  # without a host sync
                m = m.pin_memory().to(logits.device, non_blocking=True)
            m, after = greedy_outcome(logits.argmax(dim=-1).view(bs, width), verified, m)
        elif all(r.sample.greedy for r in rows):
            m, after = greedy_outcome(logits.argmax(dim=-1).view(bs, width), verified)
        else:
            outcomes = [
                accept_on_device(logits[i * width : (i + 1) * width], verified[i],
                                 drafts[i].probs, r.sample, r.generator)
                for i, r in enumerate(rows)
            ]  # fmt: skip
            m = torch.stack([o[0] for o in outcomes])
            after = torch.stack([o[1] for o in outcomes])
        ids, index = bridge_inputs(verified, m, after)
        parts = [m, after] if fed is None else [m, after, fed.flatten()]
        read = read_later(torch.cat(parts))
        out = g.bridge.run(meta, hidden, [0] * bs, fed=ids.flatten(), index=index)
        self._chain_ahead(rows, lanes, meta, m, index, out)
        return read, out

    def _chain_ahead(self, rows: list[Row], lanes: list[KVLane], meta: list, m, index, out):
        """The draft chain of a bridged verify step, queued behind the bridge before the host
        reads the outcome, so that its planning and launches overlap the verify pass instead
        of following the read. Chain step j's real position, F + m + j (F: the row's first),
        is known only on the device; so step j runs the head over a window of K + 1
        positions F + j .. F + j + K, planned on the host, each fed the previous step's
        token and hidden state at its real index (`index`, F + m of the bridge's), logits
        there. The window's K/V past the real position lands past the frontier (rewritten
        before any read, as the bridge's pad); before it, it would overwrite K/V the real
        position reads, so it goes to the trash page (`HeadGraphs.run`'s `pads`). Each lane's
        draft is kept in `ahead` with the frontier it assumed; `_chain` takes it when the
        lane settles there with K drafts to make, else drafts as usual, a sampled lane's
        generator set back to before this chain's draws (so it draws what it would have
        drawn had no chain run ahead)."""
        g, k, width = self.graphs, self.k, self.k + 1
        if not self.chain_ahead or self.trash is None:
            return
        windows = [[(t, ctx + j, slot, pages) for t, ctx, slot, pages in meta] for j in range(1, k)]
        if not all(head.fits(w) for head, w in zip(g.ahead, windows, strict=True)):
            return
        logits, hidden = out
        picks = [(Draft([], None if r.sample.greedy else []), r) for r in rows]
        # a generator's state is its seed and offset, on the host: no sync
        saved = [None if r.sample.greedy or r.generator is None else r.generator.get_state()
                 for r in rows]  # fmt: skip
        tok = self._draw(picks, logits)
        everyone = list(range(len(rows)))
        steps = [(everyone, tok)]
        for head, window in zip(g.ahead, windows, strict=True):
            fed_hidden = hidden[index].repeat_interleave(width, dim=0)
            logits, hidden = head.run(window, fed_hidden, [0] * len(rows),
                                      fed=tok.repeat_interleave(width), index=index,
                                      pads=(self.trash, m))  # fmt: skip
            tok = self._draw(picks, logits)
            steps.append((everyone, tok))
        chain = ChainIds(steps)
        for i, (draft, _) in enumerate(picks):
            draft.defer(chain, i)
            if isinstance(draft.probs, list):
                draft.probs = torch.stack(draft.probs)
            self.ahead[lanes[i].lane_id] = (draft, -1, saved[i])  # the frontier: `launch`
        self.ahead_runs += 1

    @staticmethod
    def _fed_drafts(rows: list[Row], drafts: dict[int, Draft | None]) -> torch.Tensor | None:
        """The verify rows' drafts [rows, K] on the device, when every row's are still there
        (`_chain_fed`): the verify graph copies them in, and
        `launch` reads them back with the rows' targets, in one copy."""
        ids = []
        for i, r in enumerate(rows):
            d = drafts.get(i)
            x = d.ids if d is not None else None
            if x is None or x.shape[0] != len(r.token_ids) - 1:
                return None
            ids.append(x)
        return torch.stack(ids)

    @staticmethod
    def _read_drafts(rows: list[Row], drafts: dict[int, Draft | None]) -> None:
        """Put the tokens of drafts still on the device into their rows (a device read; the
        rows held placeholders: `verify_tokens`)."""
        for i, d in drafts.items():
            if d is not None and d.pending:
                r = rows[i]
                r.token_ids[1:] = d.tokens[: len(r.token_ids) - 1]

    def _verify_graph(self, rows: list[Row]) -> bool:
        """Whether a captured verify graph serves `rows`: every row a verify row of K + 1
        tokens (K drafts) with nothing else to tap, restore or embed."""
        g = self.graphs
        return (
            g is not None
            and not self.replay
            and all(
                r.verify
                and r.sample is not None
                and not r.taps
                and r.before_layer is None
                and r.images is None
                for r in rows
            )  # fmt: skip
            and g.verify.fits([(r.token_ids, r.ctx_len, r.slot, r.pages) for r in rows])
        )

    def _accept(
        self, row: Row, logits: torch.Tensor, probs: torch.Tensor | None, target: list | None
    ) -> list[int]:
        """The row's tokens (`sampling.accept_drafts`; `target`: a greedy row's argmax, read
        with the step's other greedy rows)."""
        drafts = row.token_ids[1:]
        if probs is not None:
            probs = probs[: len(drafts)]
        if self.control is not None:
            m = min(self.control(len(drafts)), len(drafts))
            after = target[m] if target is not None else int(logits[m].argmax())
            tokens = [*drafts[:m], after]
        elif target is not None:
            tokens = accept_greedy(target, drafts)
        else:
            tokens = accept_drafts(logits, drafts, probs, row.sample, row.generator)
        return self._count(len(drafts), tokens)

    def _count(self, drafted: int, tokens: list[int]) -> list[int]:
        """Count a verify row of `drafted` drafts that yields `tokens`; returns them."""
        st = self.stats
        st.verify_rows += 1
        st.drafted += drafted
        st.accepted += len(tokens) - 1
        st.emitted += len(tokens)
        return tokens

    def settle_row(self, launched: SpecLaunched, i: int, lane: KVLane, start: int, n: int) -> None:
        """Row i of `launched` (lane's verify row from `start`) yielded n appended tokens (0:
        none, the lane ended): the frontier moves to start + max(n, 1) and the lane's slot gets
        the state after that many tokens of the row."""
        offset = max(n, 1)
        lane.computed = start + offset
        slots = launched.taps.get(i, [])
        row = launched.rows[i]
        if not slots or offset == len(row.token_ids):
            return
        if not self.replay:
            self.states.copy_image(slots[offset - 1], lane.slot)
            return
        # the state before the row, then the accepted tokens again (their K/V rewritten as is)
        self.states.copy_image(slots[0], lane.slot)
        tokens = row.token_ids[:offset]
        again = Row(tokens, start, lane.slot, lane.pages, row.sample, row.generator)
        if row.images is not None:  # a decode row's: (t, h, w) positions, no embeddings
            again.images = RowImages(row.images.positions[:, :offset])
        runner = self.runner
        runner.model(runner.build_batch([again]), runner.cache, runner.ops)

    # ---- the head: bridge, then drafts -------------------------------------------------------
    def bridge(self, launched: SpecLaunched, slices, advanced: list[KVLane]) -> list:
        """Run the head over the positions the step committed for each lane of `advanced` (its
        row's tokens appended, its frontier moved), before they are committed to the cache:
        head position p of the row reads the target's hidden state at p and token p + 1 (the
        last one sampled by the step, or a prompt token). Returns, per lane that decodes next,
        (lane, row, draft-1 logits, the head's hidden state at its last position). A step
        bridged at launch (`_bridge_ahead`) only hands out what that bridge computed. A
        non-fatal fault of the head costs the lanes their next drafts (`_head_fault`): none
        is returned, and the head's K/V at those positions stays as it was (later drafts
        there are worse; drafts are only proposals, so the output is unchanged)."""
        try:
            return self._bridge(launched, slices, advanced)
        except Exception as e:
            self._head_fault(e, advanced)
            return []

    def _head_fault(self, exc: Exception, lanes: list[KVLane]) -> None:
        """A head pass raised: re-raised when fatal (`faults.is_fatal`), else counted and
        logged (at 1, 2, 4, ... faults), and the lanes' drafts dropped: their next rows
        decode plainly, and the step after bridges and drafts again. A chain run ahead for
        one of them (`ahead`) is dropped too, a sampled lane's generator set back to before
        its draws (as `_take_ahead` does)."""
        if faults.is_fatal(exc):
            raise exc
        st = self.stats
        st.head_faults += 1
        if st.head_faults & (st.head_faults - 1) == 0:
            logger.warning(
                "ninfer: the MTP draft head failed (%r, %d so far); %d lane(s) decode without "
                "drafts this step", exc, st.head_faults, len(lanes),
            )  # fmt: skip
        for lane in lanes:
            self.drafts.pop(lane.lane_id, None)
            got = self.ahead.pop(lane.lane_id, None)
            if got is not None and got[2] is not None:
                lane.request.generator.set_state(got[2])

    def _bridge(self, launched: SpecLaunched, slices, advanced: list[KVLane]) -> list:
        if launched.bridged is not None:
            return self._bridged(launched, slices, advanced)
        rows, hidden, lanes, wide = [], [], [], []
        width = self.k + 1
        for i, s in enumerate(slices):
            lane = s.lane
            n = lane.computed - s.start
            if lane not in advanced or n <= 0:
                continue
            if len(lane.tokens) < lane.computed + 1:
                continue  # the token after the frontier is not known
            decodes = not lane.prefilling and lane.request.finish_reason is None
            rows.append(
                Row(
                    token_ids=lane.tokens[s.start + 1 : lane.computed + 1],
                    ctx_len=s.start,
                    slot=lane.slot,
                    pages=lane.pages,
                    sample=lane.request.params if decodes else None,
                    generator=lane.request.generator,
                )
            )
            first = launched.starts[i]
            hidden.append(launched.hidden[first : first + n])
            lanes.append(lane)
            row = launched.rows[i]
            if row.verify and len(row.token_ids) == width:  # its hidden: all K + 1 positions
                wide.append(launched.hidden[first : first + width])
        if not rows:
            return []
        if self._bridge_graph(rows, wide):
            return self._bridge_replay(rows, lanes, torch.cat(wide))
        logits, out = self._head(rows, torch.cat(hidden))
        last = torch.tensor([len(r.token_ids) for r in rows]).cumsum(0) - 1
        pending, at = [], 0
        for j, (row, lane) in enumerate(zip(rows, lanes, strict=True)):
            if row.sample is not None:
                pending.append((lane, row, logits[at], out[int(last[j])]))
                at += 1
        return pending

    def _bridged(self, launched: SpecLaunched, slices, advanced: list[KVLane]) -> list:
        """`bridge`'s result for a step bridged at launch: per lane of `advanced` that decodes
        next, the bridge's logits at the row's last accepted position (m: a cut at an output
        boundary stops the frontier before it, and the head's draft 1 then follows the
        accepted run; drafts are only proposals)."""
        logits, out = launched.bridged
        width = self.k + 1
        pending = []
        for i, s in enumerate(slices):
            lane = s.lane
            if lane not in advanced or lane.prefilling or lane.request.finish_reason is not None:
                continue
            m = len(launched.step.tokens[i]) - 1
            row = Row([], s.start, lane.slot, lane.pages, lane.request.params,
                      lane.request.generator)  # fmt: skip
            pending.append((lane, row, logits[i], out[i * width + m]))
        return pending

    def _bridge_graph(self, rows: list[Row], wide: list) -> bool:
        """Whether the bridge graph serves `rows`: each over a verify row of K + 1 tokens
        (`wide`: their hidden states, one per row), padded to that width."""
        g = self.graphs
        if g is None or len(wide) != len(rows):
            return False
        width = self.k + 1
        return g.bridge.fits([([0] * width, r.ctx_len, r.slot, r.pages) for r in rows])

    def _bridge_replay(self, rows: list[Row], lanes: list[KVLane], hidden: torch.Tensor) -> list:
        """`bridge` as a replay: each row's accepted positions padded to K + 1 tokens (the
        pad's head K/V lies past the frontier: the next pass rewrites it before any read),
        logits at its last accepted one."""
        width = self.k + 1
        meta = [
            (r.token_ids + [0] * (width - len(r.token_ids)), r.ctx_len, r.slot, r.pages)
            for r in rows
        ]
        last = [len(r.token_ids) - 1 for r in rows]
        logits, out = self.graphs.bridge.run(meta, hidden, last)
        return [
            (lane, row, logits[j], out[j * width + last[j]])
            for j, (row, lane) in enumerate(zip(rows, lanes, strict=True))
            if row.sample is not None
        ]

    def draft(self, pending: list, live: list[KVLane], max_model_len: int) -> None:
        """Draft the next verify row's tokens of each `pending` lane still running (`bridge`),
        and forget the drafts of lanes that have ended. A non-fatal fault of the head drops
        the drafts of the lanes being drafted (`_head_fault`)."""
        live_ids = {lane.lane_id for lane in live}
        for lane_id in [i for i in self.drafts if i not in live_ids]:
            del self.drafts[lane_id]
        chain = [
            (lane, row, self._draft_len(lane, max_model_len), logits, hidden)
            for lane, row, logits, hidden in pending
            if lane.lane_id in live_ids
        ]
        try:
            self._chain(chain)
        except Exception as e:  # as in `bridge`: the lanes decode their next row plainly
            self._head_fault(e, [c[0] for c in chain])

    @staticmethod
    def cut(lane: KVLane, tokens: list[int]) -> list[int]:
        """The first tokens of a verify row's, up to a chat's output boundary (§7.7, the
        publisher's `_output_boundary_pays`): after a token the template re-renders the reply
        after (`</think>`) one more is kept, so the frontier lands right after it; a token it
        re-renders before (`<tool_call>`) is the last kept, so the frontier lands right before
        it. The next step yields the rest, so the frontier stops there as it does without
        speculation. (Greedy: the same tokens; sampled: a stop decided by the tokens drawn so
        far keeps them the target's.)"""
        hints = lane.request.hints
        before, after = hints.output_before, (*hints.output_after, *hints.output_before)
        if not (before or after):
            return tokens
        for j, t in enumerate(tokens):
            if t in before or (j > 0 and tokens[j - 1] in after):
                return tokens[: j + 1]
        return tokens

    def _draft_len(self, lane: KVLane, max_model_len: int) -> int:
        """Drafts for the lane's next verify row: at most K, within max_model_len and within
        its pages (chain step j writes the head's K/V at position computed + j - 2). Not
        within max_tokens: a row that reaches past it is cut there when its tokens are
        appended (as at a stop token), and its K drafts keep the step a verify graph's (a
        row of fewer drafts, or a plain decode row beside verify rows, runs the whole step
        eagerly)."""
        f = lane.computed
        room = len(lane.pages) * PAGE_SIZE - f + 1
        return max(0, min(self.k, max_model_len - f - 1, room))

    def _chain(self, chain: list) -> None:
        """Draft tokens 1 .. k of each lane: token 1 from the bridge logits, each next one
        from a one-token head pass over the previous one and the head's own hidden state."""
        ahead, self.ahead = self.ahead, {}
        chain = [c for c in chain if not self._take_ahead(ahead, c[0], c[2])]
        state, picks = [], []
        for lane, row, k, logits, hidden in chain:
            self.drafts.pop(lane.lane_id, None)
            if k == 0:
                continue
            draft = Draft([], [] if not row.sample.greedy else None)
            picks.append((draft, row, logits))
            self.drafts[lane.lane_id] = draft
            state.append((lane, row, k, hidden))
        if picks and self._fed(picks):
            self._chain_fed(state, picks)
            state = []  # drafted
        else:
            self._pick(picks)
        for step in range(1, self.k if state else 1):
            todo = [(ln, r, k, h) for ln, r, k, h in state if k > step]
            if not todo:
                break
            rows = [
                Row([self.drafts[ln.lane_id].tokens[-1]], ln.computed + step - 1, ln.slot,
                    ln.pages, r.sample, r.generator)
                for ln, r, _, _ in todo
            ]  # fmt: skip
            hidden = torch.stack([h for _, _, _, h in todo])
            meta = [(r.token_ids, r.ctx_len, r.slot, r.pages) for r in rows]
            if self.graphs is not None and self.graphs.chain.fits(meta):
                logits, out = self.graphs.chain.run(meta, hidden, [0] * len(rows))
            else:
                logits, out = self._head(rows, hidden)
            self._pick(
                [(self.drafts[ln.lane_id], r, logits[j]) for j, (ln, r, _, _) in enumerate(todo)]
            )
            state = [(ln, r, k, out[j]) for j, (ln, r, k, _) in enumerate(todo)]
        for lane, _, k, _, _ in chain:
            draft = self.drafts.get(lane.lane_id)
            if draft is None:
                continue
            if isinstance(draft.probs, list):
                draft.probs = torch.stack(draft.probs)
            self._propose(lane, draft, k)

    def _take_ahead(self, ahead: dict, lane: KVLane, k: int) -> bool:
        """Whether the lane's drafts are those its chain run ahead made (`_chain_ahead`):
        the lane settled at the frontier that chain assumed, with all K drafts to make. If
        not, its generator goes back to before that chain's draws."""
        got = ahead.get(lane.lane_id)
        if got is None:
            return False
        if got[1] != lane.computed or k != self.k:
            if got[2] is not None:
                lane.request.generator.set_state(got[2])
            return False
        self.drafts[lane.lane_id] = got[0]
        self._propose(lane, got[0], k)
        return True

    def _propose(self, lane: KVLane, draft: Draft, k: int) -> None:
        """With `propose` set, its k tokens replace the head's (a sampled lane's draft
        distribution is then a point mass on each)."""
        if self.propose is None:
            return
        draft.tokens = list(self.propose(lane, k))[:k]
        if draft.probs is not None:
            vocab = draft.probs[0].shape[-1]
            tokens = torch.tensor(draft.tokens, device=draft.probs[0].device)
            draft.probs = torch.nn.functional.one_hot(tokens, vocab).float()

    @staticmethod
    def _fed(picks: list[tuple[Draft, Row, torch.Tensor]]) -> bool:
        """Whether the chain stays on the device (`_chain_fed`): it does, greedy and sampled
        lanes alike; the tests replace this to compare it with the chain that reads each step
        back (`_pick`)."""
        return True

    def _draw(self, lanes: list[tuple[Draft, Row]], logits: torch.Tensor) -> torch.Tensor:
        """Each lane's next draft token [n] on the device, without a host sync: a greedy
        lane's argmax, a sampled lane's draw with its generator (the distribution appended to
        its draft's probs): the tokens and draws of `_pick`, in its order."""
        top = self._ids(logits.argmax(dim=-1))
        if all(row.sample.greedy for _, row in lanes):
            return top
        picked = []
        for j, (draft, row) in enumerate(lanes):
            if row.sample.greedy:
                picked.append(top[j])
                continue
            probs = probabilities(self._full(logits[j]).unsqueeze(0), row.sample)
            picked.append(draw(probs, [row.generator])[0])
            draft.probs.append(probs[0])
        return torch.stack(picked)

    def _chain_fed(self, state: list, picks: list[tuple[Draft, Row, torch.Tensor]]) -> None:
        """`_chain` without a host sync between its steps: each step's tokens (`_draw`) stay
        on the device and feed the next step's input ids (`runner.Feed`, or the chain graph's
        `fed`); the drafts stay on the device (`ChainIds`), read when first needed (with the
        next verify rows' outcome, or by `Draft.tokens`). state: (lane, row, k, hidden) per
        lane, aligned with picks (draft, row, draft-1 logits)."""
        lanes = [(draft, row) for draft, row, _ in picks]
        tok = self._draw(lanes, torch.stack([logits for _, _, logits in picks]))
        at = list(range(len(state)))  # the lanes (indices into state) of tok's rows
        steps = [(at, tok)]
        hidden = torch.stack([h for _, _, _, h in state])
        for step in range(1, self.k):
            keep = [i for i, j in enumerate(at) if state[j][2] > step]
            if not keep:
                break
            if len(keep) < len(at):
                sel = torch.tensor(keep, device=tok.device)
                tok, hidden, at = tok[sel], hidden[sel], [at[i] for i in keep]
            # token 0 is a placeholder: the fed id replaces it
            rows = [
                Row([0], ln.computed + step - 1, ln.slot, ln.pages, r.sample, r.generator)
                for ln, r, _, _ in (state[j] for j in at)
            ]
            logits, hidden = self._head_fed(rows, hidden, tok)
            tok = self._draw([lanes[j] for j in at], logits)
            steps.append((at, tok))
        chain = ChainIds(steps)  # read when the tokens are first needed on the host
        for j, (draft, _, _) in enumerate(picks):
            draft.defer(chain, j)

    def _head_fed(self, rows: list[Row], hidden: torch.Tensor, tok: torch.Tensor):
        """A head pass over one-token rows whose input ids are `tok` on the device: the chain
        graph's replay when one serves, else eagerly."""
        meta = [(r.token_ids, r.ctx_len, r.slot, r.pages) for r in rows]
        if self.graphs is not None and self.graphs.chain.fits(meta):
            return self.graphs.chain.run(meta, hidden, [0] * len(rows), fed=tok)
        runner = self.runner
        batch = runner.build_batch(rows, Feed(tok, list(range(len(rows)))))
        return runner.model.mtp(batch, hidden, runner.cache, runner.ops, runner.model)

    def _ids(self, columns: torch.Tensor) -> torch.Tensor:
        """The token ids of the head's logits columns (a trimmed vocabulary maps them)."""
        d2t = self.runner.model.mtp.d2t
        return columns if d2t is None else d2t[columns]

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's logits [V'] over the whole vocabulary [V]: -inf where it does not
        propose (a sampled draft's distribution is then zero there)."""
        d2t = self.runner.model.mtp.d2t
        if d2t is None:
            return logits
        full = logits.new_full((self.vocab_size,), float("-inf"))
        full[d2t] = logits
        return full

    def _pick(self, picks: list[tuple[Draft, Row, torch.Tensor]]) -> None:
        """Each (draft, row, logits [V']) draws its next token: the greedy ones' argmax read in
        one copy for all of them; a sampled one draws with its row's generator."""
        greedy = [(draft, logits) for draft, row, logits in picks if row.sample.greedy]
        if greedy:
            columns = torch.stack([logits for _, logits in greedy]).argmax(dim=-1)
            tokens = self._ids(columns).tolist()
            for (draft, _), token in zip(greedy, tokens, strict=True):
                draft.tokens.append(token)
        for draft, row, logits in picks:
            if not row.sample.greedy:
                probs = probabilities(self._full(logits).unsqueeze(0), row.sample)
                draft.tokens.append(int(draw(probs, [row.generator])[0]))
                draft.probs.append(probs[0])

    def _head(self, rows: list[Row], hidden: torch.Tensor):
        runner = self.runner
        batch = runner.build_batch(rows)
        return runner.model.mtp(batch, hidden, runner.cache, runner.ops, runner.model)
