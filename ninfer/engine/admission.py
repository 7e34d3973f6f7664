"""Admission: the FIFO head becomes a running lane when `may_admit` allows and the KV state
gives it one (quote / stage / activate); a request admitted for the first time gets its
detokenizer, sampler, grammar matcher and logprobs list. Engine thread only."""

from __future__ import annotations

import time

import torch

from ninfer.config import MemoryGeometry, Scheduling
from ninfer.engine import faults, outputs
from ninfer.engine.kv.state import KVState
from ninfer.engine.request import Request
from ninfer.engine.roster import Roster
from ninfer.engine.scheduler import may_admit


class Admission:
    """Moves the roster's FIFO head into its lanes; `make_gen(seed, device)` builds a sampled
    request's generator (seeded from `Scheduling.seed` and a counter when the request names
    none)."""

    def __init__(
        self,
        memory: MemoryGeometry,
        scheduling: Scheduling,
        kv_state: KVState,
        roster: Roster,
        tokenizer,
        make_gen,
        device,
    ) -> None:
        self.memory, self.scheduling = memory, scheduling
        self.kv_state = kv_state
        self.roster = roster
        self.tokenizer = tokenizer
        self.make_gen = make_gen
        self.device = device
        self._gen_counter = 0

    def admit(self) -> None:
        waiting, lanes = self.roster.waiting, self.roster.lanes
        while waiting and may_admit(
            lanes, self.memory.max_concurrency, self.scheduling.concurrent_prefill
        ):
            req = waiting[0]
            now = time.perf_counter()
            verdict = self.kv_state.try_admit(req, lanes)
            if verdict.lane is None and verdict.error is None:
                return  # TemporarilyBlocked: the FIFO head is never overtaken
            waiting.popleft()
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
                self.roster.faults_contained += 1
                req.finish_reason = "error"
                self.kv_state.release(lane)
                text = outputs.engine_error_text(f"{type(e).__name__}: {e}")
                req.sink.put(outputs.error_output(req, text))
                continue
            lanes.append(lane)

    def _generator(self, job: Request) -> torch.Generator | None:
        if job.params.greedy:
            return None
        self._gen_counter += 1
        seed = job.params.seed
        if seed is None:
            seed = (self.scheduling.seed * 1_000_003 + self._gen_counter) & 0x7FFF_FFFF_FFFF_FFFF
        return self.make_gen(seed, self.device)
