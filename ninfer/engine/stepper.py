"""One forward step, and the step in flight (overlapped decode); engine thread only.

`run` turns a plan's slices into rows (suspending the lanes the pool cannot extend), launches
the forward and its sampling, moves each lane's `computed` at launch, then settles the step:
its tokens are appended to the requests (stop checks), the frontiers' bookkeeping advances
(commits, taps, publication), finished lanes end and stream deltas go out.

Overlapped decode (`overlap_decode`): a pure-decode step the runner can overlap is left in
flight, and the next step, when it is again decode-only over the same lanes (no admission, no
cancellation, no page shortage, no lane sure to finish), is launched first (`overlap_next`), its
input tokens fed on the device from the step in flight; only then are the earlier step's tokens
read and settled. A lane's `computed` moves at launch, so it always says what its pages and
state slot hold in stream order. A lane that stops on a token (EOS, stop string) has run one
extra decode step on that token: its output is discarded, and its state and KV remain a valid
image of `tokens[:computed]`, the stop token included. Outputs are the same as without the
overlap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ninfer import structured
from ninfer.cache.keys import prepare_prompt
from ninfer.config import MemoryGeometry, Scheduling
from ninfer.engine import faults, outputs
from ninfer.engine.executor.runner import Launched, Row, Runner, StepResult
from ninfer.engine.faults import StepFault
from ninfer.engine.images import EncoderCache, media_items
from ninfer.engine.kv.lane import KVLane
from ninfer.engine.kv.state import KVState
from ninfer.engine.request import Request
from ninfer.engine.roster import Roster
from ninfer.engine.scheduler import Slice, may_admit
from ninfer.engine.speculative import Speculator
from ninfer.page import PAGE_SIZE


@dataclass(slots=True)
class InFlight:
    """A launched step whose tokens are not read yet: its slices (frontiers already moved)."""

    slices: list[Slice]
    launched: Launched


class Stepper:
    """Launches steps over the roster's lanes and settles their tokens into the requests; owns
    the step in flight (`inflight`) and the count of steps launched before the previous one's
    tokens were read (`overlapped_steps`)."""

    def __init__(
        self,
        memory: MemoryGeometry,
        scheduling: Scheduling,
        runner: Runner,
        kv_state: KVState,
        roster: Roster,
        eos: tuple[int, ...],
        vocab_size: int,
        speculator: Speculator | None = None,
    ) -> None:
        self.memory, self.scheduling = memory, scheduling
        self.runner = runner
        self.kv_state = kv_state
        self.roster = roster
        self.eos = eos
        self.vocab_size = vocab_size  # the logits' width (structured outputs' masks)
        self.device = runner.device
        # speculative decoding (`engine/speculative.py`): decode rows of the lanes it serves
        # verify their drafts, several tokens per step
        self.speculator = speculator
        self.inflight: InFlight | None = None  # a decode step launched, tokens not yet read
        self.overlapped_steps = 0  # steps launched before the previous one's tokens were read
        # the vision tower's outputs by image, across requests (`engine.images`)
        self.encoder_cache = EncoderCache(scheduling.encoder_cache_bytes, kv_state.counters)

    def _launch(self, rows: list[Row], lanes: list[KVLane], feed=None, mask=None) -> Launched:
        """runner.launch (the speculator's with speculation on); a non-fatal fault becomes a
        StepFault naming the step's lanes."""
        try:
            if self.speculator is not None:
                return self.speculator.launch(rows, lanes, mask)
            return self.runner.launch(rows, feed, mask)
        except Exception as e:
            if faults.is_fatal(e):
                raise
            raise StepFault(lanes, e) from e

    def run(self, slices: list[Slice]) -> None:
        rows: list[Row] = []
        runnable: list[Slice] = []
        suspended: list[KVLane] = []
        for s in slices:
            drafts, verify = self._drafts(s.lane)
            if drafts and not self.kv_state.budget.grow(s.lane, s.end + len(drafts)):
                drafts = drafts[: len(s.lane.pages) * PAGE_SIZE - s.end]  # what its pages hold
            if not self.kv_state.budget.grow(s.lane, s.end):
                suspended.append(s.lane)  # the pool cannot extend it: suspend, never cut short
                continue
            taps = self.kv_state.before_chunk(s.lane, s.start, s.end, s.in_pass, s.tail_at)
            lane = s.lane
            rows.append(
                Row(
                    token_ids=lane.tokens[s.start : s.end] + drafts,
                    ctx_len=s.start,
                    slot=lane.slot,
                    pages=lane.pages,
                    sample=lane.request.params if s.samples else None,
                    generator=lane.request.generator,
                    before_layer=self.kv_state.first_pass_hook(lane),
                    taps=tuple((p - s.start, phys) for p, phys in taps),
                    verify=verify,
                    images=self._row_images(lane, s.start, s.end + len(drafts)),
                )
            )
            runnable.append(s)
            if s.start < lane.prompt_len:
                self.kv_state.counters.prefill_tokens += s.end - s.start
        if suspended:
            self._suspend(suspended)
        launched = None
        if rows:
            plain = [
                s.lane for s, r in zip(runnable, rows, strict=True) if s.samples and not r.verify
            ]
            launched = self._launch(rows, [s.lane for s in runnable], mask=self._token_mask(plain))
        for s, r in zip(runnable, rows, strict=True):
            s.lane.computed = s.start + len(r.token_ids)  # a verify row's: set when settled
        flight = InFlight(runnable, launched)
        if (
            launched is not None
            and self.scheduling.overlap_decode
            and self._decode_only(flight, rows)
        ):
            self.inflight = flight  # settled after the next step is launched
        else:
            self.settle(flight)

    def _drafts(self, lane: KVLane) -> tuple[list[int], bool]:
        """(draft tokens, whether the row verifies them) of the lane's next row: a decode row
        of a lane the speculator serves verifies its drafts (perhaps none)."""
        spec = self.speculator
        if spec is None or lane.prefilling:
            return [], False
        return spec.verify_tokens(lane), True

    def _suspend(self, lanes: list[KVLane]) -> None:
        """§9.5: the pool cannot extend these lanes (their steps are settled). Each is released
        through its endpoint snapshot (§7.7: image and tail published, pins released, blocks
        written through to the Host tier) and its request goes back to the head of the queue,
        in admission order, as it is: the next admission builds a lane that resumes from that
        snapshot with every generated token, the request keeping its sampler, detokenizer and
        metrics, as soon as pages allow. Without a prefix cache its tokens are recomputed from
        the start."""
        reqs = []
        for lane in lanes:
            self.roster.lanes.remove(lane)
            self.kv_state.suspend(lane)
            req = lane.request
            req.suspensions += 1
            if req.blocks is not None:
                req.blocks = prepare_prompt(req.tokens, media_items(req))
            reqs.append(req)
        self.roster.waiting.extendleft(reversed(reqs))

    def _row_images(self, lane: KVLane, start: int, end: int):
        """A row's image inputs (`engine.images.RowImages`) when its request has images."""
        images = lane.request.images
        if images is None:
            return None
        tower = self.runner.encode_image
        return images.row_inputs(start, end, lambda im: self.encoder_cache.encode(im, tower))

    def _decode_only(self, flight: InFlight, rows: list[Row]) -> bool:
        """Whether every row decodes one sampled token and the runner can run ahead of it."""
        return all(
            s.end - s.start == 1 and s.start >= s.lane.prompt_len and r.sample is not None
            for s, r in zip(flight.slices, rows, strict=True)
        ) and self.runner.can_overlap(rows)

    def overlap_next(self) -> bool:
        """With a decode step in flight: launch the next decode step over the same lanes,
        tokens fed on the device, then settle the one in flight. False (nothing done) when the
        next step must see the settled state first: a cancellation, an admission that may
        happen, a new or finished lane, a lane sure to stop on its pending token, or a page
        it cannot get."""
        flight = self.inflight
        if flight is None:
            return False
        waiting = self.roster.waiting
        if waiting and may_admit(
            self.roster.lanes, self.memory.max_concurrency, self.scheduling.concurrent_prefill
        ):
            return False
        lanes = [s.lane for s in flight.slices]
        if len(lanes) != len(self.roster.lanes) or any(r.cancelled.is_set() for r in waiting):
            return False
        if any(ln.request.images is not None for ln in lanes):
            return False  # its rows carry 3-D positions: built by the plain step
        for lane in lanes:
            req = lane.request
            if req.cancelled.is_set() or req.finish_reason is not None:
                return False
            if req.length_reached(self.memory.max_model_len, pending=1):
                return False  # sure to stop on its pending token whatever it is
        for lane in lanes:
            if not self.kv_state.budget.grow(lane, lane.computed + 1):
                return False  # settled first; the plain step then suspends it (§9.5)
        rows = [
            Row([0], ln.computed, ln.slot, ln.pages, ln.request.params, ln.request.generator)
            for ln in lanes
        ]
        if not self.runner.can_overlap(rows):
            return False
        # A mask (structured output, spent thinking budget) for this step needs the token of
        # the step in flight: the forward is launched now and its sampling once that step is
        # settled, the mask computed on the host while the GPU runs the forward. A step that
        # no mask may constrain samples at once.
        constrained = structured.may_constrain([ln.request.matcher for ln in lanes], pending=1)
        mask = (lambda: self._token_mask(lanes)) if constrained else None
        feed = flight.launched.feed(list(range(len(rows))))
        launched = self._launch(rows, lanes, feed, mask=mask)
        slices = []
        for lane in lanes:
            slices.append(Slice(lane, lane.computed, lane.computed + 1))
            lane.computed += 1
        self.inflight = InFlight(slices, launched)
        self.overlapped_steps += 1
        self.settle(flight)
        if constrained:
            self._sample_deferred(launched, lanes)
        return True

    def _token_mask(self, lanes: list[KVLane]):
        """The structured outputs' allowed tokens for the sampling rows of `lanes` (None when
        no request's grammar constrains its next token: a free batch computes nothing)."""
        matchers = [lane.request.matcher for lane in lanes]
        if all(m is None for m in matchers):
            return None
        pin = self.device.type == "cuda"
        return structured.token_mask(matchers, self.vocab_size, pin)

    def _sample_deferred(self, launched: Launched, lanes: list[KVLane]) -> None:
        """Queue the sampling of a step launched with a deferred mask (a fault fails the
        step's lanes, as the launch's would)."""
        try:
            launched.sample()
        except Exception as e:
            if faults.is_fatal(e):
                raise
            raise StepFault(lanes, e) from e

    def settle_inflight(self) -> None:
        if self.inflight is not None:
            flight, self.inflight = self.inflight, None
            self.settle(flight)

    def settle(self, flight: InFlight) -> None:
        """Read a launched step's tokens: append them (stop checks), advance the frontiers'
        bookkeeping (commits, taps, publication), finish lanes, stream deltas. A lane that
        finished after the step was launched is skipped (its token is discarded)."""
        result = self._result(flight)
        advanced, failed = self._append_tokens(flight, result, time.perf_counter())
        roster = self.roster
        pending = []  # the head's K/V first, so that what the cache commits includes it
        if self.speculator is not None and flight.launched is not None:
            pending = self.speculator.bridge(flight.launched, flight.slices, advanced)
        for lane in advanced:
            self.kv_state.after_advance(lane)
        for lane, message in failed:
            roster.fail(lane, message)
        if failed:
            roster.vouch(RuntimeError(failed[0][1]))
        for lane in [ln for ln in roster.lanes if ln.request.finish_reason is not None]:
            roster.finish(lane)
        if self.speculator is not None:
            self._draft(pending)
        self._stream_deltas()

    @staticmethod
    def _result(flight: InFlight) -> StepResult | None:
        """The step's tokens (None when it launched nothing); a failure to read them fails
        the step's lanes."""
        try:
            return flight.launched.result() if flight.launched is not None else None
        except Exception as e:  # reading the step's tokens failed: the step's lanes fail
            if faults.is_fatal(e):
                raise
            raise StepFault([s.lane for s in flight.slices], e) from e

    def _append_tokens(
        self, flight: InFlight, result: StepResult | None, now: float
    ) -> tuple[list[KVLane], list[tuple[KVLane, str]]]:
        """Append each live lane's tokens to its request (a verify row: the run the speculator
        accepts, cut at a stop). Returns the lanes that advanced and the (lane, message) of
        those whose sampling or detokenization failed (each fails alone)."""
        roster = self.roster
        failed: list[tuple[KVLane, str]] = []
        verify = [bool(r.verify) for r in flight.launched.rows] if flight.launched else []
        advanced: list[KVLane] = []
        for i, s in enumerate(flight.slices):
            lane, req = s.lane, s.lane.request
            appended = 0
            if req.finish_reason is not None or lane not in roster.lanes:
                if verify and verify[i]:
                    self.speculator.settle_row(flight.launched, i, lane, s.start, 0)
                continue
            try:  # a fault in this lane's sampling or detokenization fails it alone
                if result.errors[i] is not None:
                    raise RuntimeError(f"sampling failed: {result.errors[i]}")
                token = result.tokens[i]
                if token is not None:
                    if not lane.prefilling and not req.prefill_done_t:
                        req.prefill_done_t = now
                    lps = result.logprobs[i]  # a verify row's: one per token, or None
                    run = self.speculator.cut(lane, token) if verify[i] else [token]
                    for j, t in enumerate(run):
                        lp = lps[j] if verify[i] and lps is not None else lps
                        self._append(req, t, lp, now)
                        appended += 1
                        if req.finish_reason is not None:
                            break  # a stop among a verify row's tokens: the rest is dropped
            except Exception as e:
                if faults.is_fatal(e):
                    raise
                failed.append((lane, f"{type(e).__name__}: {e}"))
                continue
            finally:
                if verify and verify[i]:
                    self.speculator.settle_row(flight.launched, i, lane, s.start, appended)
            advanced.append(lane)
        return advanced, failed

    def _stream_deltas(self) -> None:
        """Each streaming request's new tokens and text since its last delta, to its sink."""
        for lane in self.roster.lanes:
            req = lane.request
            if req.stream:
                delta = outputs.stream_delta(req)
                if delta is not None:
                    req.sink.put(delta)

    def _draft(self, pending: list) -> None:
        """The speculator's drafts for the lanes' next verify rows, after the pages for the
        head's chain are mapped where the pool allows (a lane that cannot grow drafts fewer),
        then, from the lane's own entitlement, those the next step's chain run ahead reaches
        (its windows end K - 1 positions past the verify row's: `Speculator._chain_ahead`;
        without them that step drafts after the read)."""
        spec, lanes = self.speculator, self.roster.lanes
        budget, limit = self.kv_state.budget, self.memory.max_model_len
        for lane, *_ in pending:
            if lane in lanes and budget.grow(lane, lane.computed + spec.k - 1):
                budget.grow_entitled(lane, min(lane.computed + 2 * spec.k, limit))
        spec.draft(pending, lanes, limit)

    def _append(self, req: Request, token: int, logprobs, now: float) -> None:
        if not req.t_first:
            req.t_first = now
        if req.matcher is not None:
            req.matcher.accept(token)  # raises for a token the grammar rejects: the lane fails
        req.tokens.append(token)
        if req.logprobs is not None:
            req.logprobs.append(logprobs or {})
        stopped = outputs.add_text(req, token)
        reason = "stop" if stopped else None
        reason = reason or outputs.check_finish(req, token, self.eos, self.memory.max_model_len)
        req.finish_reason = reason
