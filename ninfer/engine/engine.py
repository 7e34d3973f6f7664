"""The engine: one loop, on one background thread, owns every cache and memory object.

Other threads only `submit` requests, flag cancellations and read each request's sink queue;
`call` runs a function on the loop (for stats and ledgers); all of it goes through the `Inbox`
(engine/inbox.py). A queued `Request` (engine/request.py) runs once admission
(engine/admission.py) gives it a `KVLane` (engine/kv/lane.py); the `Roster` (engine/roster.py)
keeps the queue and the lanes, in admission order, each naming its request. One step is

    reap cancelled -> admit (FIFO, quote/stage/activate) -> plan rows -> launch forward + sample
    -> read the sampled tokens -> append them, advance frontiers (commit blocks, taps,
    publication) -> emit deltas / finish lanes

the launch and what follows being the `Stepper`'s (engine/stepper.py, with overlapped decode:
a decode step left in flight while the next is launched). A step that raises is contained by
`Containment` (engine/containment.py; the rule: engine/faults.py).

`Engine` is the composition root (it builds the parts, each given only what it uses, calls
flowing Engine -> Containment -> Stepper -> Roster), the loop and the thread-safe surface.
The engine knows nothing about text beyond feeding generated ids to each request's
Detokenizer.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import torch

from ninfer.cache.keys import prepare_prompt
from ninfer.config import EngineConfig
from ninfer.engine import outputs
from ninfer.engine.admission import Admission
from ninfer.engine.containment import Containment, failure_text
from ninfer.engine.executor import warmup
from ninfer.engine.executor.runner import Runner
from ninfer.engine.images import media_items
from ninfer.engine.inbox import Inbox
from ninfer.engine.kv.lane import KVLane
from ninfer.engine.kv.state import KVState, engine_cost_model
from ninfer.engine.request import Request
from ninfer.engine.roster import Roster
from ninfer.engine.scheduler import InPass, plan_step
from ninfer.engine.speculative import Speculator, draft_vocab
from ninfer.engine.stepper import InFlight, Stepper
from ninfer.forward import ModelCache
from ninfer.request import EngineError

BLOCKED_RETRY_S = 0.001

logger = logging.getLogger(__name__)


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
        self.vocab_size = model_config.vocab_size  # the logits' width (structured outputs' masks)
        self.device = torch.device(cfg.memory.device)
        cost = engine_cost_model(cfg.cache, cfg.scheduling.prefill_chunk, model_config)
        self.kv_state = KVState(cfg.memory, cfg.cache, model_config, self.device, cost)
        mem = self.kv_state
        cache = ModelCache(kv=mem.kv.kv, conv=mem.states.conv, ssm=mem.states.ssm)
        self.runner = Runner(model, ops, cache, self.device, sampler)
        self.speculator: Speculator | None = None
        if cfg.speculation.speculative == "mtp":
            spec = cfg.speculation
            added = getattr(tokenizer, "added_ids", frozenset())
            vocab = draft_vocab(spec.draft_vocab, model_config.vocab_size, added)
            k = spec.num_speculative_tokens
            self.speculator = Speculator(
                self.runner, mem.states, k, mem.spec_slots, vocab, mem.trash_page
            )
        self.startup = warmup.prepare_runner(  # CUDA only
            self.runner, cfg.ops, cfg.memory, cfg.scheduling.solo_prefill_chunk, mem.kv,
            mem.states, self.speculator,
        )  # fmt: skip
        self._roster = Roster(mem)
        self._admission = Admission(
            cfg.memory, cfg.scheduling, mem, self._roster, tokenizer, make_gen, self.device
        )
        self._stepper = Stepper(
            cfg.memory, cfg.scheduling, self.runner, mem, self._roster, self.eos, self.vocab_size,
            self.speculator,
        )  # fmt: skip
        self._containment = Containment(self._roster, self._stepper, self.device)
        # rows that snapshot inside their pass: those no prefill graph replays, on the ops' grid
        self.in_pass: InPass | None = InPass(cfg.ops.prefill_graph_tokens, ops.tap_stride)
        self.steps = 0
        self.on_step = None  # test hook: called with the engine at the start of every step
        self._inbox = Inbox()
        self._failure: BaseException | None = None
        self._failure_text = ""  # what every caller is told once the engine has failed
        # design §5.5: the Host tier is restored before any request and saved at the orderly stop
        self.persistence = persistence  # persist/cache_file.PrefixCacheFile or None
        self._stopping = False  # close() was called: the loop is ending
        if persistence is not None:
            persistence.load(self.kv_state)
        self._thread = threading.Thread(target=self._loop, name="ninfer-engine", daemon=True)
        self._thread.start()

    # ---- the parts' state, read through the engine (the inspection seam) ----------------------
    @property
    def waiting(self) -> deque[Request]:
        """The FIFO queue of requests not running (engine thread only)."""
        return self._roster.waiting

    @property
    def lanes(self) -> list[KVLane]:
        """The running requests' lanes, in admission order (engine thread only)."""
        return self._roster.lanes

    @property
    def faults_contained(self) -> int:
        """Request and step faults survived (Host faults: CacheStats)."""
        return self._roster.faults_contained

    @property
    def inflight(self) -> InFlight | None:
        """A decode step launched, its tokens not yet read."""
        return self._stepper.inflight

    @property
    def overlapped_steps(self) -> int:
        """Steps launched before the previous one's tokens were read."""
        return self._stepper.overlapped_steps

    @property
    def make_gen(self):
        """`make_gen(seed, device)`: a sampled request's generator (settable)."""
        return self._admission.make_gen

    @make_gen.setter
    def make_gen(self, make_gen) -> None:
        self._admission.make_gen = make_gen

    # ---- the thread-safe surface --------------------------------------------------------------
    def submit(self, job: Request) -> None:
        """Queue `job`. Its prompt's block keys (`cache/keys.prepare_prompt`) are built here,
        on the caller's thread, when the prefix cache is on and the job carries no error."""
        if self._failure is not None:
            raise EngineError(self._failure_text) from self._failure
        if not self._thread.is_alive():
            raise RuntimeError("the engine is closed")
        reuse = job.error is None and self.prefix_reuse
        job.blocks = prepare_prompt(job.prompt, media_items(job)) if reuse else None
        job.t_submit = time.perf_counter()
        self._inbox.put("job", job)

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
        self._inbox.put("wake")

    def call(self, fn):
        """Run fn() on the engine thread and return its result (re-raising its exception)."""
        fut: Future = Future()
        self._inbox.put("call", (fn, fut))
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

    def speculation_stats(self):
        """A copy of the speculator's SpeculationStats (None with speculation off), read on
        the engine thread."""
        spec = self.speculator
        return None if spec is None else self.call(lambda: dataclasses.replace(spec.stats))

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
        lane runs and the KV state is back at its baseline (`KVState.check_idle`). Host copies
        still in flight land first: a write-through the last step queued is not a leak (an idle
        loop waits for work, not for copies, so it may report them only at its next step)."""

        def check() -> None:
            if self.lanes or self.waiting:
                raise AssertionError(
                    f"{len(self.lanes)} lane(s) running, {len(self.waiting)} job(s) waiting"
                )
            self.kv_state.poll(wait=True)
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
            self._inbox.put("stop", save)
            self._thread.join()
        # the pools, graphs and model go with the loop, so the process can build another engine
        # in the freed device memory (later calls raise "the engine is closed")
        self.runner = self.kv_state = None
        self._stepper.runner = None
        for part in (self._roster, self._admission, self._stepper):
            part.kv_state = None
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
            while self._inbox.drain(self.waiting, block=block, timeout=timeout):
                had_lanes = bool(self.lanes)
                if self.lanes or self.waiting:
                    try:
                        self.step()
                        self._containment.streak = 0
                    except Exception as e:  # contained unless fatal (engine/containment.py)
                        self._containment.contain(e)
                stalled = not had_lanes and not self.lanes and bool(self.waiting)
                block = stalled or (not self.lanes and not self.waiting)
                timeout = BLOCKED_RETRY_S if stalled else None
            self._stepper.settle_inflight()
        except BaseException as e:  # engine-wide failure: answer everyone, then stop
            self._failure_text = failure_text(e)
            self._failure = e
            self._containment.abandon(self._failure_text)
            self._inbox.answer(self._failure_text, reason="error")
            logger.exception("ninfer engine failed; every request was answered with an error")
            return
        self._roster.abort_all()  # the orderly stop: every request ends as "abort"
        self.kv_state.poll(wait=True)
        self._inbox.answer("engine closed")
        if self.persistence is not None and self._inbox.save_on_stop:
            self.persistence.save(self.kv_state)  # after every answer: no request waits for it

    def step(self) -> None:
        self.steps += 1
        if self.on_step is not None:
            self.on_step(self)
        if self._stepper.overlap_next():
            if self.waiting:  # the head waits for a free lane: prefetch its Host-only path
                self.kv_state.prefetch_head(self.waiting[0])
        else:
            self._stepper.settle_inflight()
            self._roster.reap_cancelled()
            self._admission.admit()
            if self.waiting:  # the FIFO head stays blocked: prefetch its Host-only path (§6.6)
                self.kv_state.prefetch_head(self.waiting[0])
            if self.lanes:
                chunks = (self.scheduling.prefill_chunk, self.scheduling.solo_prefill_chunk)
                self._stepper.run(plan_step(self.lanes, *chunks, self.in_pass))
        if self.inflight is not None and not any(
            s.lane.request.finish_reason is None and s.lane in self.lanes
            for s in self.inflight.slices
        ):
            self._stepper.settle_inflight()  # every lane of it has finished: nothing to wait for
        self.kv_state.poll()
        if self.scheduling.check_invariants:
            self.kv_state.check_invariants(self.lanes)
