"""The loop's requests: the FIFO queue of those waiting, the lanes of those running (in admission
order, each naming its request), and how a lane ends outside a step's tokens: finished
(published, released, answered), failed (released without an endpoint snapshot, answered with
the fault), cancelled or aborted. Engine thread only."""

from __future__ import annotations

import time
from collections import deque

from ninfer.engine import faults, outputs
from ninfer.engine.kv.lane import KVLane
from ninfer.engine.kv.state import KVState
from ninfer.engine.request import Request


class Roster:
    """`waiting` (the FIFO queue), `lanes` (the running requests' lanes) and the count of request
    and step faults contained (`faults_contained`; Host faults: CacheStats)."""

    def __init__(self, kv_state: KVState) -> None:
        self.kv_state = kv_state
        self.waiting: deque[Request] = deque()
        self.lanes: list[KVLane] = []  # the running requests' lanes, in admission order
        self.faults_contained = 0

    def abort_all(self) -> None:
        """The orderly stop: queued requests and running lanes end as "abort"."""
        for job in self.waiting:
            job.sink.put(outputs.error_output(job, "engine closed", reason="abort"))
        self.waiting.clear()
        for lane in list(self.lanes):
            lane.request.finish_reason = "abort"
            self.finish(lane)

    def reap_cancelled(self) -> None:
        for req in [r for r in self.waiting if r.cancelled.is_set()]:
            self.waiting.remove(req)
            if req.suspensions:  # suspended: it ends with what it generated
                req.sink.put(outputs.suspended_output(req, "abort", time.perf_counter()))
            else:
                req.sink.put(outputs.error_output(req, "cancelled", reason="abort"))
        for lane in [ln for ln in self.lanes if ln.request.cancelled.is_set()]:
            lane.request.finish_reason = "abort"
            self.finish(lane)

    def finish(self, lane: KVLane) -> None:
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

    def fail(self, lane: KVLane, message: str) -> None:
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

    def vouch(self, exc: BaseException) -> None:
        """After a contained fault the cache must be consistent; if not, the engine cannot
        vouch for its state and ends with the original fault."""
        try:
            self.kv_state.check_invariants(self.lanes)
        except AssertionError as broken:
            raise RuntimeError(f"{exc!r} left the cache inconsistent: {broken}") from exc
