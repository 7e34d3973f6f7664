"""The engine: one loop, on one background thread, owns every cache and memory object.

Other threads only `submit` jobs, flag cancellations and read each job's sink queue; `call`
runs a function on the loop (for stats and ledgers). One step is

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

The engine knows nothing about text beyond feeding generated ids to each lane's Detokenizer.
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

from ninfer.cache.keys import prepare_prompt
from ninfer.config import EngineConfig
from ninfer.engine import faults, outputs
from ninfer.engine.executor import warmup
from ninfer.engine.executor.runner import Launched, Row, Runner
from ninfer.engine.kv.state import KVState
from ninfer.engine.lane import Job, Lane
from ninfer.engine.scheduler import InPass, Slice, may_admit, plan_step
from ninfer.forward import ModelCache
from ninfer.request import EngineError

BLOCKED_RETRY_S = 0.001
# Steps in a row that raise before the engine stops containing them: a fault that recurs
# whatever is scheduled is not transient, and the engine ends with it.
MAX_FAULT_STREAK = 16

logger = logging.getLogger(__name__)


class StepFault(Exception):
    """A step's forward or copy raised: its lanes fail (engine/faults.py)."""

    def __init__(self, lanes: list[Lane], cause: BaseException) -> None:
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
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.eos = tuple(model_config.eos_token_ids) + tuple(
            getattr(tokenizer, "eos_token_ids", ()) or ()
        )
        self.make_gen = make_gen
        self.device = torch.device(cfg.device)
        self.kv_state = KVState(cfg, model_config, self.device)
        mem = self.kv_state
        cache = ModelCache(kv=mem.kv.kv, conv=mem.states.conv, ssm=mem.states.ssm)
        self.runner = Runner(model, ops, cache, self.device, sampler)
        self.startup = warmup.prepare_runner(self.runner, cfg, mem.kv, mem.states)  # CUDA only
        # rows that snapshot inside their pass: those no prefill graph replays, on the ops' grid
        self.in_pass = InPass(cfg.prefill_graph_tokens, ops.tap_stride)
        self.waiting: deque[Job] = deque()
        self.lanes: list[Lane] = []
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
    def submit(self, job: Job) -> None:
        """Queue `job`. Its prompt's block keys (`cache/keys.prepare_prompt`) are built here,
        on the caller's thread, when the prefix cache is on and the job carries no error."""
        if self._failure is not None:
            raise EngineError(self._failure_text) from self._failure
        if not self._thread.is_alive():
            raise RuntimeError("the engine is closed")
        reuse = job.error is None and self.cfg.prefix_reuse
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

    def cancel(self, job: Job) -> None:
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

    def next_event(self, job: Job):
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
                lane.job.sink.put(outputs.fault_output(lane, text, time.perf_counter()))
            self.waiting.clear()
            self.lanes.clear()
            self._answer_inbox(text, reason="error")
            logger.exception("ninfer engine failed; every request was answered with an error")
            return
        for job in self.waiting:
            job.sink.put(outputs.error_output(job, "engine closed", reason="abort"))
        self.waiting.clear()
        for lane in list(self.lanes):
            lane.finish_reason = "abort"
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

    def _fail(self, lane: Lane, message: str) -> None:
        """End one lane with finish_reason "error": release it (no endpoint snapshot: its state
        may be half-written), answer with what it generated and the message."""
        if lane not in self.lanes:
            return
        self.faults_contained += 1
        lane.finish_reason = "error"
        self.lanes.remove(lane)
        self.kv_state.release(lane)
        lane.job.sink.put(outputs.fault_output(lane, message, time.perf_counter()))

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

    def _launch(self, rows: list[Row], lanes: list[Lane], feed=None) -> Launched:
        """runner.launch; a non-fatal fault becomes a StepFault naming the step's lanes."""
        try:
            return self.runner.launch(rows, feed)
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
                cfg = self.cfg
                chunks = (cfg.prefill_chunk, cfg.solo_prefill_chunk)
                self._run(plan_step(self.lanes, *chunks, self.in_pass))
        if self.inflight is not None and not any(
            s.lane.finish_reason is None and s.lane in self.lanes for s in self.inflight.slices
        ):
            self._settle_inflight()  # every lane of it has finished: nothing to wait for
        self.kv_state.poll()
        if self.cfg.check_invariants:
            self.kv_state.check_invariants(self.lanes)

    # ---- admission ----------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.waiting and may_admit(
            self.lanes, self.cfg.max_concurrency, self.cfg.concurrent_prefill
        ):
            job = self.waiting[0]
            verdict = self.kv_state.try_admit(job, time.perf_counter(), self.lanes)
            if verdict.lane is None and verdict.error is None:
                return  # TemporarilyBlocked: the FIFO head is never overtaken
            self.waiting.popleft()
            if verdict.error is not None:
                job.sink.put(outputs.error_output(job, verdict.error))
                continue
            lane = verdict.lane
            try:
                if job.resume is not None:  # a suspended request: same sampler, text, metrics
                    lane.carry(job.resume)
                    job.resume = None
                else:
                    lane.detok = outputs.new_detokenizer(self.tokenizer, job)
                    lane.generator = self._generator(job)
                    if job.params.logprobs is not None:
                        lane.logprobs = []
            except Exception as e:  # its own state cannot be built: this request alone fails
                if faults.is_fatal(e):
                    raise
                self.faults_contained += 1
                lane.finish_reason = "error"
                self.kv_state.release(lane)
                text = outputs.engine_error_text(f"{type(e).__name__}: {e}")
                job.sink.put(outputs.error_output(job, text))
                continue
            self.lanes.append(lane)

    def _generator(self, job: Job) -> torch.Generator | None:
        if job.params.greedy:
            return None
        self._gen_counter += 1
        seed = job.params.seed
        if seed is None:
            seed = (self.cfg.seed * 1_000_003 + self._gen_counter) & 0x7FFF_FFFF_FFFF_FFFF
        return self.make_gen(seed, self.device)

    def _reap_cancelled(self) -> None:
        for job in [j for j in self.waiting if j.cancelled.is_set()]:
            self.waiting.remove(job)
            if job.resume is not None:  # suspended: it ends with what it generated
                job.sink.put(outputs.suspended_output(job.resume, "abort", time.perf_counter()))
            else:
                job.sink.put(outputs.error_output(job, "cancelled", reason="abort"))
        for lane in [ln for ln in self.lanes if ln.job.cancelled.is_set()]:
            lane.finish_reason = "abort"
            self._finish(lane)

    # ---- one forward step ---------------------------------------------------------------------
    def _run(self, slices: list[Slice]) -> None:
        rows: list[Row] = []
        runnable: list[Slice] = []
        suspended: list[Lane] = []
        for s in slices:
            if not self.kv_state.budget.grow(s.lane, s.end):
                suspended.append(s.lane)  # the pool cannot extend it: suspend, never cut short
                continue
            taps = self.kv_state.before_chunk(s.lane, s.start, s.end, s.in_pass, s.tail_at)
            lane = s.lane
            rows.append(
                Row(
                    token_ids=lane.tokens[s.start : s.end],
                    ctx_len=s.start,
                    slot=lane.slot,
                    pages=lane.pages,
                    sample=lane.job.params if s.samples else None,
                    generator=lane.generator,
                    before_layer=self.kv_state.first_pass_hook(lane),
                    taps=tuple((p - s.start, phys) for p, phys in taps),
                )
            )
            runnable.append(s)
            if s.start < lane.prompt_len:
                self.kv_state.counters.prefill_tokens += s.end - s.start
        if suspended:
            self._suspend(suspended)
        launched = self._launch(rows, [s.lane for s in runnable]) if rows else None
        for s in runnable:
            s.lane.computed = s.end
        flight = InFlight(runnable, launched)
        if launched is not None and self.cfg.overlap_decode and self._decode_only(flight, rows):
            self.inflight = flight  # settled after the next step is launched
        else:
            self._settle(flight)

    def _suspend(self, lanes: list[Lane]) -> None:
        """§9.5: the pool cannot extend these lanes (their steps are settled). Each is released
        through its endpoint snapshot (§7.7: image and tail published, pins released, blocks
        written through to the Host tier) and its job goes back to the head of the queue, in
        admission order, carrying the lane: the next admission resumes from that snapshot with
        every generated token and the lane's sampler, detokenizer and metrics, as soon as pages
        allow. Without a prefix cache the lane's tokens are recomputed from the start."""
        jobs = []
        for lane in lanes:
            self.lanes.remove(lane)
            self.kv_state.suspend(lane)
            lane.suspensions += 1
            job = lane.job
            job.resume = lane
            if job.blocks is not None:
                job.blocks = prepare_prompt(lane.tokens)
            jobs.append(job)
        self.waiting.extendleft(reversed(jobs))

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
            self.lanes, self.cfg.max_concurrency, self.cfg.concurrent_prefill
        ):
            return False
        lanes = [s.lane for s in flight.slices]
        if len(lanes) != len(self.lanes) or any(j.cancelled.is_set() for j in self.waiting):
            return False
        for lane in lanes:
            if lane.job.cancelled.is_set() or lane.finish_reason is not None:
                return False
            if self._sure_to_stop(lane):
                return False
        for lane in lanes:
            if not self.kv_state.budget.grow(lane, lane.computed + 1):
                return False  # settled first; the plain step then suspends it (§9.5)
        rows = [
            Row([0], lane.computed, lane.slot, lane.pages, lane.job.params, lane.generator)
            for lane in lanes
        ]
        if not self.runner.can_overlap(rows):
            return False
        launched = self._launch(rows, lanes, flight.launched.feed(list(range(len(rows)))))
        slices = []
        for lane in lanes:
            slices.append(Slice(lane, lane.computed, lane.computed + 1))
            lane.computed += 1
        self.inflight = InFlight(slices, launched)
        self.overlapped_steps += 1
        self._settle(flight)
        return True

    def _sure_to_stop(self, lane: Lane) -> bool:
        """The lane finishes on its pending token whatever it is (max_tokens, model length)."""
        n = len(lane.tokens) + 1
        return n - lane.gen_start >= lane.job.params.max_tokens or n >= self.cfg.max_model_len

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
        failed: list[tuple[Lane, str]] = []
        for i, s in enumerate(flight.slices):
            lane = s.lane
            if lane.finish_reason is not None or lane not in self.lanes:
                continue
            try:  # a fault in this lane's sampling or detokenization fails it alone
                if result.errors[i] is not None:
                    raise RuntimeError(f"sampling failed: {result.errors[i]}")
                token = result.tokens[i]
                if token is not None:
                    if not lane.prefilling and not lane.prefill_done_t:
                        lane.prefill_done_t = now
                    self._append(lane, token, result.logprobs[i], now)
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
        for lane in [ln for ln in self.lanes if ln.finish_reason is not None]:
            self._finish(lane)
        for lane in self.lanes:
            if lane.job.stream:
                delta = outputs.stream_delta(lane)
                if delta is not None:
                    lane.job.sink.put(delta)

    def _append(self, lane: Lane, token: int, logprobs, now: float) -> None:
        if not lane.t_first:
            lane.t_first = now
        lane.tokens.append(token)
        if lane.logprobs is not None:
            lane.logprobs.append(logprobs or {})
        stopped = outputs.add_text(lane, token)
        reason = "stop" if stopped else None
        reason = reason or outputs.check_finish(lane, token, self.eos, self.cfg.max_model_len)
        lane.finish_reason = reason

    def _finish(self, lane: Lane) -> None:
        """Terminal settlement: publish (endpoint), release, answer. Idempotent per lane."""
        if lane not in self.lanes:
            return
        self.lanes.remove(lane)
        self.kv_state.release(lane)
        try:
            outputs.flush_text(lane)
            if lane.job.stream:
                delta = outputs.stream_delta(lane)
                if delta is not None:
                    lane.job.sink.put(delta)
            out = outputs.final_output(lane, time.perf_counter())
        except Exception as e:  # its detokenization failed: this request alone fails
            if faults.is_fatal(e):
                raise
            self.faults_contained += 1
            out = outputs.fault_output(lane, f"{type(e).__name__}: {e}", time.perf_counter())
        lane.job.sink.put(out)
