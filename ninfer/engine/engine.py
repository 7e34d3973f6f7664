"""The engine: one loop, on one background thread, owns every cache and memory object.

Other threads only `submit` requests, flag cancellations and read each request's sink queue;
`call` runs a function on the loop (for stats and ledgers). A queued `Request`
(engine/request.py) runs once admission gives it a `KVLane` (engine/kv/lane.py); the loop keeps
the lanes, in admission order, each naming its request. One step is

    reap cancelled -> admit (FIFO, quote/stage/activate) -> plan rows -> launch forward + sample
    -> read the sampled tokens -> append them, advance frontiers (commit blocks, taps,
    publication) -> emit deltas / finish lanes

Overlapped decode (`overlap_decode`): a pure-decode step the runner can overlap is left in
flight, and the next step, when it is again decode-only over the same lanes (no admission, no
cancellation, no page shortage, no lane sure to finish), is launched first, its input tokens
fed on the device from the step in flight; only then are the earlier step's tokens read and
settled. A lane's `computed` moves at launch, so it always says what its pages and state slot
hold in stream order. A lane that stops on a token (EOS, stop string) has run one extra decode
step on that token: its output is discarded, and its state and KV remain a valid image of
`tokens[:computed]`, the stop token included. Outputs are the same as without the overlap.

The engine knows nothing about text beyond feeding generated ids to each request's
Detokenizer.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import torch

from ninfer import structured
from ninfer.cache.keys import prepare_prompt
from ninfer.config import EngineConfig
from ninfer.engine import faults, outputs
from ninfer.engine.executor import warmup
from ninfer.engine.executor.runner import Launched, Row, Runner
from ninfer.engine.kv.lane import KVLane
from ninfer.engine.kv.state import KVState, engine_cost_model
from ninfer.engine.request import Request
from ninfer.engine.scheduler import Slice, may_admit, plan_step
from ninfer.forward import ModelCache
from ninfer.request import EngineError

BLOCKED_RETRY_S = 0.001
# Steps in a row that raise before the engine stops containing them: a fault that recurs
# whatever is scheduled is not transient, and the engine ends with it.
MAX_FAULT_STREAK = 16

logger = logging.getLogger(__name__)


class StepFault(Exception):
    """A step's forward or copy raised: its lanes fail (engine/faults.py)."""

    def __init__(self, lanes: list[KVLane], cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.lanes = lanes
        self.cause = cause


@dataclass(slots=True)
class InFlight:
    """A launched step whose tokens are not read yet: its slices (frontiers already moved)."""

    slices: list[Slice]
    launched: Launched


class Engine:
    def __init__(
        self,
        cfg: EngineConfig,
        model_config,
        model,
        ops,
        tokenizer,
        sampler,
        make_gen,
        persistence=None,
    ):
        # the parts the loop reads; the others are handed out below
        self.memory, self.scheduling = cfg.memory, cfg.scheduling
        self.prefix_reuse = cfg.cache.prefix_reuse
        self.tokenizer = tokenizer
        self.eos = tuple(model_config.eos_token_ids) + tuple(
            getattr(tokenizer, "eos_token_ids", ()) or ()
        )
        self.make_gen = make_gen
        self.vocab_size = model_config.vocab_size  # the logits' width (structured outputs' masks)
        self.device = torch.device(cfg.memory.device)
        cost = engine_cost_model(cfg.cache, cfg.scheduling.prefill_chunk, model_config)
        self.kv_state = KVState(cfg.memory, cfg.cache, model_config, self.device, cost)
        mem = self.kv_state
        cache = ModelCache(kv=mem.kv.kv, conv=mem.states.conv, ssm=mem.states.ssm)
        self.runner = Runner(model, ops, cache, self.device, sampler)
        self.startup = warmup.prepare_runner(  # CUDA only
            self.runner, cfg.ops, cfg.memory, cfg.scheduling.solo_prefill_chunk, mem.kv, mem.states
        )
        self.waiting: deque[Request] = deque()
        self.lanes: list[KVLane] = []  # the running requests' lanes, in admission order
        self.inflight: InFlight | None = None  # a decode step launched, tokens not yet read
        self.overlapped_steps = 0  # steps launched before the previous one's tokens were read
        self.steps = 0
        self.on_step = None  # test hook: called with the engine at the start of every step
        self._inbox: queue.Queue = queue.Queue()
        self._gen_counter = 0
        self._failure: BaseException | None = None
        self._failure_text = ""  # what every caller is told once the engine has failed
        self.faults_contained = 0  # step and lane faults survived (Host faults: CacheStats)
        self._fault_streak = 0  # steps in a row that raised (MAX_FAULT_STREAK ends the engine)
        # design §5.5: the Host tier is restored before any request and saved at the orderly stop
        self.persistence = persistence  # persist/cache_file.PrefixCacheFile or None
        self._save_on_stop = True
        self._stopping = False  # close() was called: the loop is ending
        if persistence is not None:
            persistence.load(self.kv_state)
        self._thread = threading.Thread(target=self._loop, name="ninfer-engine", daemon=True)
        self._thread.start()

    # ---- the thread-safe surface --------------------------------------------------------------
    def submit(self, job: Request) -> None:
        """Queue `job`. Its prompt's block keys (`cache/keys.prepare_prompt`) are built here,
        on the caller's thread, when the prefix cache is on and the job carries no error."""
        if self._failure is not None:
            raise EngineError(self._failure_text) from self._failure
        if not self._thread.is_alive():
            raise RuntimeError("the engine is closed")
        reuse = job.error is None and self.prefix_reuse
        job.blocks = prepare_prompt(job.prompt) if reuse else None
        job.t_submit = time.perf_counter()
        self._inbox.put(("job", job))

    @property
    def serving(self) -> bool:
        """The loop runs and takes work: False once asked to stop, once failed (from before
        the first caller is told), and when its thread is gone."""
        return self._failure is None and not self._stopping and self._thread.is_alive()

    @property
    def stopped(self) -> bool:
        """The engine thread has ended (closed, or failed)."""
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds (None: until it ends) for the engine thread to end;
        whether it has."""
        self._thread.join(timeout)
        return self.stopped

    def cancel(self, job: Request) -> None:
        job.cancelled.set()
        self._inbox.put(("wake", None))

    def call(self, fn):
        """Run fn() on the engine thread and return its result (re-raising its exception)."""
        fut: Future = Future()
        self._inbox.put(("call", (fn, fut)))
        while True:
            try:
                return fut.result(timeout=0.5)
            except FutureTimeout:
                if not self._thread.is_alive() and not fut.done():
                    if self._failure is not None:
                        raise EngineError(self._failure_text) from None
                    raise RuntimeError("the engine is closed") from None

    def cache_stats(self):
        """A CacheStats copy (`KVState.stats`), read on the engine thread."""
        return self.call(lambda: self.kv_state.stats())

    def memory_ledger(self) -> dict:
        """KV pages and bytes, state slots, Host slabs and bytes (`KVState.ledger`), read on
        the engine thread."""
        return self.call(lambda: self.kv_state.ledger())

    def settle_copies(self) -> None:
        """Block until every Host copy in flight has landed and the index knows it
        (`KVState.poll(wait=True)` on the engine thread)."""
        self.call(lambda: self.kv_state.poll(wait=True))

    def check_idle(self) -> None:
        """On the engine thread: AssertionError naming what is left unless no job waits, no
        lane runs and the KV state is back at its baseline (`KVState.check_idle`)."""

        def check() -> None:
            if self.lanes or self.waiting:
                raise AssertionError(
                    f"{len(self.lanes)} lane(s) running, {len(self.waiting)} job(s) waiting"
                )
            self.kv_state.check_idle()

        self.call(check)

    def busy(self) -> bool:
        """Whether a lane runs or a job waits, read on the engine thread."""
        return self.call(lambda: bool(self.lanes or self.waiting))

    def check_invariants(self, revalue: bool = False) -> None:
        """Engine thread only (an `on_step` hook, or through `call`): the KV state's invariants
        over the running lanes; with `revalue`, every Host snapshot's GDSF value is recomputed
        first (`KVState.revalue_host`)."""
        if revalue:
            self.kv_state.revalue_host()
        self.kv_state.check_invariants(self.lanes)

    def next_event(self, job: Request):
        """The job's next StreamDelta or final RequestOutput (blocking). If the engine thread
        is gone without answering, an "abort" output instead of waiting forever."""
        while True:
            try:
                return job.sink.get(timeout=0.5)
            except queue.Empty:
                if not self._thread.is_alive() and job.sink.empty():
                    if self._failure is not None:
                        return outputs.error_output(job, self._failure_text)
                    return outputs.error_output(job, "engine closed", reason="abort")

    def close(self, save: bool = True) -> None:
        """Orderly stop: running and queued requests end as "abort", every Host write lands,
        then (with a prefix_cache_file and `save`) the Host tier is saved. Blocks until done."""
        self._stopping = True
        if self._thread.is_alive():
            self._inbox.put(("stop", save))
            self._thread.join()
        # the pools, graphs and model go with the loop, so the process can build another engine
        # in the freed device memory (later calls raise "the engine is closed")
        self.runner = self.kv_state = None
        if self.device.type == "cuda":
            gc.collect()  # graphs and pools held only by reference cycles go now, not later
            torch.cuda.empty_cache()

    # ---- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        with torch.no_grad():
            self._serve()

    def _serve(self) -> None:
        try:
            # Block for new work only when idle: a waiting head with no lanes (the last lane
            # just finished) is retried at once, not left until the next submission. A head
            # that stays blocked through a step with no lane at all (say its pages are Filling
            # until a copy lands) is retried every BLOCKED_RETRY_S instead of spinning a core
            # against the GIL; new work or an engine call wakes the loop at once.
            block, timeout = True, None
            while self._drain_inbox(block=block, timeout=timeout):
                had_lanes = bool(self.lanes)
                if self.lanes or self.waiting:
                    try:
                        self.step()
                        self._fault_streak = 0
                    except Exception as e:  # contained unless fatal (engine/faults.py)
                        self._contain(e)
                stalled = not had_lanes and not self.lanes and bool(self.waiting)
                block = stalled or (not self.lanes and not self.waiting)
                timeout = BLOCKED_RETRY_S if stalled else None
            self._settle_inflight()
        except BaseException as e:  # engine-wide failure: answer everyone, then stop
            cause = e.cause if isinstance(e, StepFault) else e
            text = outputs.engine_error_text(f"the engine failed: {type(cause).__name__}: {cause}")
            self._failure_text = text
            self._failure = e
            for job in self.waiting:
                job.sink.put(outputs.error_output(job, text))
            for lane in self.lanes:  # nothing is released: the device state is not trusted
                req = lane.request
                req.sink.put(outputs.fault_output(req, text, time.perf_counter()))
            self.waiting.clear()
            self.lanes.clear()
            self._answer_inbox(text, reason="error")
            logger.exception("ninfer engine failed; every request was answered with an error")
            return
        for job in self.waiting:
            job.sink.put(outputs.error_output(job, "engine closed", reason="abort"))
        self.waiting.clear()
        for lane in list(self.lanes):
            lane.request.finish_reason = "abort"
            self._finish(lane)
        self.kv_state.poll(wait=True)
        self._answer_inbox("engine closed")
        if self.persistence is not None and self._save_on_stop:
            self.persistence.save(self.kv_state)  # after every answer: no request waits for it

    def _answer_inbox(self, message: str, reason: str = "abort") -> None:
        """After the loop ends: answer whatever is still queued so no caller waits forever."""
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "job":
                item.sink.put(outputs.error_output(item, message, reason=reason))
            elif kind == "call":
                item[1].set_exception(
                    EngineError(message) if reason == "error" else RuntimeError(message)
                )

    # ---- fault containment (engine/faults.py) ---------------------------------------------------
    def _contain(self, exc: Exception) -> None:
        """A step raised: fail the lanes it hit (a StepFault names them; any other fault hits
        every lane), release their pins and pages, and go on serving. Re-raises (the engine
        ends) when the fault is fatal or the cache is not consistent afterwards."""
        cause = exc.cause if isinstance(exc, StepFault) else exc
        self._fault_streak += 1
        if faults.is_fatal(cause) or self._fault_streak >= MAX_FAULT_STREAK:
            raise exc
        victims = list(self.lanes) if not isinstance(exc, StepFault) else exc.lanes
        if not victims and self.waiting:  # no lane to blame: the queue's head (its admission)
            job = self.waiting.popleft()  # fails, so that a recurring fault cannot stall it
            job.sink.put(outputs.error_output(job, outputs.engine_error_text(str(cause))))
        logger.warning("ninfer: a step failed (%r): failing %d request(s)", cause, len(victims))
        self._quiesce()  # the failed step's queued work may still write the victims' memory
        flight, self.inflight = self.inflight, None
        if flight is not None and any(s.lane not in victims for s in flight.slices):
            self._settle(flight)  # its other lanes keep their tokens
        message = f"{type(cause).__name__}: {cause}"
        for lane in victims:
            self._fail(lane, message)
        self._vouch(exc)

    def _fail(self, lane: KVLane, message: str) -> None:
        """End one lane's request with finish_reason "error": release the lane (no endpoint
        snapshot: its state may be half-written), answer with what it generated and the message."""
        if lane not in self.lanes:
            return
        self.faults_contained += 1
        req = lane.request
        req.finish_reason = "error"
        self.lanes.remove(lane)
        self.kv_state.release(lane)
        req.sink.put(outputs.fault_output(req, message, time.perf_counter()))

    def _vouch(self, exc: BaseException) -> None:
        """After a contained fault the cache must be consistent; if not, the engine cannot
        vouch for its state and ends with the original fault."""
        try:
            self.kv_state.check_invariants(self.lanes)
        except AssertionError as broken:
            raise RuntimeError(f"{exc!r} left the cache inconsistent: {broken}") from exc

    def _quiesce(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _launch(self, rows: list[Row], lanes: list[KVLane], feed=None, mask=None) -> Launched:
        """runner.launch; a non-fatal fault becomes a StepFault naming the step's lanes."""
        try:
            return self.runner.launch(rows, feed, mask)
        except Exception as e:
            if faults.is_fatal(e):
                raise
            raise StepFault(lanes, e) from e

    def _drain_inbox(self, block: bool, timeout: float | None = None) -> bool:
        """Move submitted work into the engine; False once asked to stop. `block`: wait for the
        first item (at most `timeout` seconds when given)."""
        while True:
            try:
                kind, item = self._inbox.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                return True
            block = False
            if kind == "stop":
                self._save_on_stop = bool(item)
                return False
            if kind == "job":
                if item.error is not None:
                    item.sink.put(outputs.error_output(item, item.error))
                else:
                    self.waiting.append(item)
            elif kind == "call":
                fn, fut = item
                try:
                    fut.set_result(fn())
                except BaseException as e:  # handed to the caller
                    fut.set_exception(e)

    def step(self) -> None:
        self.steps += 1
        if self.on_step is not None:
            self.on_step(self)
        if self._overlap_next():
            if self.waiting:  # the head waits for a free lane: prefetch its Host-only path
                self.kv_state.prefetch_head(self.waiting[0])
        else:
            self._settle_inflight()
            self._reap_cancelled()
            self._admit()
            if self.waiting:  # the FIFO head stays blocked: prefetch its Host-only path (§6.6)
                self.kv_state.prefetch_head(self.waiting[0])
            if self.lanes:
                sched = self.scheduling
                self._run(plan_step(self.lanes, sched.prefill_chunk, sched.solo_prefill_chunk))
        if self.inflight is not None and not any(
            s.lane.request.finish_reason is None and s.lane in self.lanes
            for s in self.inflight.slices
        ):
            self._settle_inflight()  # every lane of it has finished: nothing to wait for
        self.kv_state.poll()
        if self.scheduling.check_invariants:
            self.kv_state.check_invariants(self.lanes)

    # ---- admission ----------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.waiting and may_admit(
            self.lanes, self.memory.max_concurrency, self.scheduling.concurrent_prefill
        ):
            req = self.waiting[0]
            now = time.perf_counter()
            verdict = self.kv_state.try_admit(req, self.lanes)
            if verdict.lane is None and verdict.error is None:
                return  # TemporarilyBlocked: the FIFO head is never overtaken
            self.waiting.popleft()
            if verdict.error is not None:
                req.sink.put(outputs.error_output(req, verdict.error))
                continue
            lane = verdict.lane
            try:  # a resumed request keeps its sampler, grammar, text and metrics
                if not req.suspensions:
                    req.t_admit = now
                    req.detok = outputs.new_detokenizer(self.tokenizer, req)
                    req.generator = self._generator(req)
                    if req.grammar is not None:
                        req.matcher = req.grammar.start(req.prompt)
                    if req.params.logprobs is not None:
                        req.logprobs = []
            except Exception as e:  # its own state cannot be built: this request alone fails
                if faults.is_fatal(e):
                    raise
                self.faults_contained += 1
                req.finish_reason = "error"
                self.kv_state.release(lane)
                text = outputs.engine_error_text(f"{type(e).__name__}: {e}")
                req.sink.put(outputs.error_output(req, text))
                continue
            self.lanes.append(lane)

    def _generator(self, job: Request) -> torch.Generator | None:
        if job.params.greedy:
            return None
        self._gen_counter += 1
        seed = job.params.seed
        if seed is None:
            seed = (self.scheduling.seed * 1_000_003 + self._gen_counter) & 0x7FFF_FFFF_FFFF_FFFF
        return self.make_gen(seed, self.device)

    def _reap_cancelled(self) -> None:
        for req in [r for r in self.waiting if r.cancelled.is_set()]:
            self.waiting.remove(req)
            if req.suspensions:  # suspended: it ends with what it generated
                req.sink.put(outputs.suspended_output(req, "abort", time.perf_counter()))
            else:
                req.sink.put(outputs.error_output(req, "cancelled", reason="abort"))
        for lane in [ln for ln in self.lanes if ln.request.cancelled.is_set()]:
            lane.request.finish_reason = "abort"
            self._finish(lane)

    # ---- one forward step ---------------------------------------------------------------------
    def _run(self, slices: list[Slice]) -> None:
        rows: list[Row] = []
        runnable: list[Slice] = []
        suspended: list[KVLane] = []
        for s in slices:
            if not self.kv_state.budget.grow(s.lane, s.end):
                suspended.append(s.lane)  # the pool cannot extend it: suspend, never cut short
                continue
            dst = self.kv_state.before_chunk(s.lane, s.start, s.end, s.tap_at)
            lane = s.lane
            rows.append(
                Row(
                    token_ids=lane.tokens[s.start : s.end],
                    ctx_len=s.start,
                    slot=lane.slot,
                    pages=lane.pages,
                    sample=lane.request.params if s.samples else None,
                    generator=lane.request.generator,
                    before_layer=self.kv_state.first_pass_hook(lane),
                    tap=None if dst is None else (s.tap_at - s.start, dst),
                )
            )
            runnable.append(s)
            if s.start < lane.prompt_len:
                self.kv_state.counters.prefill_tokens += s.end - s.start
        if suspended:
            self._suspend(suspended)
        launched = None
        if rows:
            mask = self._token_mask([s.lane for s in runnable if s.samples])
            launched = self._launch(rows, [s.lane for s in runnable], mask=mask)
        for s in runnable:
            s.lane.computed = s.end
        flight = InFlight(runnable, launched)
        overlap = self.scheduling.overlap_decode
        if launched is not None and overlap and self._decode_only(flight, rows):
            self.inflight = flight  # settled after the next step is launched
        else:
            self._settle(flight)

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
            self.lanes.remove(lane)
            self.kv_state.suspend(lane)
            req = lane.request
            req.suspensions += 1
            if req.blocks is not None:
                req.blocks = prepare_prompt(req.tokens)
            reqs.append(req)
        self.waiting.extendleft(reversed(reqs))

    def _decode_only(self, flight: InFlight, rows: list[Row]) -> bool:
        """Whether every row decodes one sampled token and the runner can run ahead of it."""
        return all(
            s.end - s.start == 1 and s.start >= s.lane.prompt_len and r.sample is not None
            for s, r in zip(flight.slices, rows, strict=True)
        ) and self.runner.can_overlap(rows)

    def _overlap_next(self) -> bool:
        """With a decode step in flight: launch the next decode step over the same lanes,
        tokens fed on the device, then settle the one in flight. False (nothing done) when the
        next step must see the settled state first: a cancellation, an admission that may
        happen, a new or finished lane, a lane sure to stop on its pending token, or a page
        it cannot get."""
        flight = self.inflight
        if flight is None:
            return False
        if self.waiting and may_admit(
            self.lanes, self.memory.max_concurrency, self.scheduling.concurrent_prefill
        ):
            return False
        lanes = [s.lane for s in flight.slices]
        if len(lanes) != len(self.lanes) or any(r.cancelled.is_set() for r in self.waiting):
            return False
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
        # A structured output's mask for this step needs the token of the step in flight: the
        # forward is launched now and its sampling once that step is settled, the mask computed
        # on the host while the GPU runs the forward. A step without one samples at once.
        constrained = any(lane.request.matcher is not None for lane in lanes)
        mask = (lambda: self._token_mask(lanes)) if constrained else None
        feed = flight.launched.feed(list(range(len(rows))))
        launched = self._launch(rows, lanes, feed, mask=mask)
        slices = []
        for lane in lanes:
            slices.append(Slice(lane, lane.computed, lane.computed + 1))
            lane.computed += 1
        self.inflight = InFlight(slices, launched)
        self.overlapped_steps += 1
        self._settle(flight)
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

    def _settle_inflight(self) -> None:
        if self.inflight is not None:
            flight, self.inflight = self.inflight, None
            self._settle(flight)

    def _settle(self, flight: InFlight) -> None:
        """Read a launched step's tokens: append them (stop checks), advance the frontiers'
        bookkeeping (commits, taps, publication), finish lanes, stream deltas. A lane that
        finished after the step was launched is skipped (its token is discarded)."""
        try:
            result = flight.launched.result() if flight.launched is not None else None
        except Exception as e:  # reading the step's tokens failed: the step's lanes fail
            if faults.is_fatal(e):
                raise
            raise StepFault([s.lane for s in flight.slices], e) from e
        now = time.perf_counter()
        failed: list[tuple[KVLane, str]] = []
        for i, s in enumerate(flight.slices):
            lane, req = s.lane, s.lane.request
            if req.finish_reason is not None or lane not in self.lanes:
                continue
            try:  # a fault in this lane's sampling or detokenization fails it alone
                if result.errors[i] is not None:
                    raise RuntimeError(f"sampling failed: {result.errors[i]}")
                token = result.tokens[i]
                if token is not None:
                    if not lane.prefilling and not req.prefill_done_t:
                        req.prefill_done_t = now
                    self._append(req, token, result.logprobs[i], now)
            except Exception as e:
                if faults.is_fatal(e):
                    raise
                failed.append((lane, f"{type(e).__name__}: {e}"))
                continue
            self.kv_state.after_advance(lane)
        for lane, message in failed:
            self._fail(lane, message)
        if failed:
            self._vouch(RuntimeError(failed[0][1]))
        for lane in [ln for ln in self.lanes if ln.request.finish_reason is not None]:
            self._finish(lane)
        for lane in self.lanes:
            req = lane.request
            if req.stream:
                delta = outputs.stream_delta(req)
                if delta is not None:
                    req.sink.put(delta)

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

    def _finish(self, lane: KVLane) -> None:
        """Terminal settlement: publish (endpoint), release, answer. Idempotent per lane."""
        if lane not in self.lanes:
            return
        self.lanes.remove(lane)
        self.kv_state.release(lane)
        req = lane.request
        try:
            outputs.flush_text(req)
            if req.stream:
                delta = outputs.stream_delta(req)
                if delta is not None:
                    req.sink.put(delta)
            out = outputs.final_output(req, time.perf_counter())
        except Exception as e:  # its detokenization failed: this request alone fails
            if faults.is_fatal(e):
                raise
            self.faults_contained += 1
            out = outputs.fault_output(req, f"{type(e).__name__}: {e}", time.perf_counter())
        req.sink.put(out)
