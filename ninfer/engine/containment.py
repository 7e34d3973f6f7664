"""Fault containment at the loop (the rule: `faults.py`): a step that raised fails the lanes it
hit and the engine goes on serving, unless the fault is fatal, recurs `MAX_FAULT_STREAK` steps
in a row, or leaves the cache inconsistent; then the engine ends and `abandon` answers every
request with the failure. Engine thread only."""

from __future__ import annotations

import logging
import time

import torch

from ninfer.engine import faults, outputs
from ninfer.engine.faults import StepFault
from ninfer.engine.roster import Roster
from ninfer.engine.stepper import Stepper

# Steps in a row that raise before the engine stops containing them: a fault that recurs
# whatever is scheduled is not transient, and the engine ends with it.
MAX_FAULT_STREAK = 16

logger = logging.getLogger(__name__)


def failure_text(exc: BaseException) -> str:
    """What every caller is told once `exc` has ended the engine."""
    cause = exc.cause if isinstance(exc, StepFault) else exc
    return outputs.engine_error_text(f"the engine failed: {type(cause).__name__}: {cause}")


class Containment:
    """Contains a step's fault over the roster and the stepper's step in flight; counts the
    steps in a row that raised (`streak`, reset by the loop after a step that did not)."""

    def __init__(self, roster: Roster, stepper: Stepper, device: torch.device) -> None:
        self.roster = roster
        self.stepper = stepper
        self.device = device
        self.streak = 0  # steps in a row that raised (MAX_FAULT_STREAK ends the engine)

    def contain(self, exc: Exception) -> None:
        """A step raised: fail the lanes it hit (a StepFault names them; any other fault hits
        every lane), release their pins and pages, and go on serving. Re-raises (the engine
        ends) when the fault is fatal or the cache is not consistent afterwards."""
        cause = exc.cause if isinstance(exc, StepFault) else exc
        self.streak += 1
        if faults.is_fatal(cause) or self.streak >= MAX_FAULT_STREAK:
            raise exc
        roster = self.roster
        victims = list(roster.lanes) if not isinstance(exc, StepFault) else exc.lanes
        if not victims and roster.waiting:  # no lane to blame: the queue's head (its admission)
            job = roster.waiting.popleft()  # fails, so that a recurring fault cannot stall it
            job.sink.put(outputs.error_output(job, outputs.engine_error_text(str(cause))))
        logger.warning("ninfer: a step failed (%r): failing %d request(s)", cause, len(victims))
        self._quiesce()  # the failed step's queued work may still write the victims' memory
        flight, self.stepper.inflight = self.stepper.inflight, None
        if flight is not None and any(s.lane not in victims for s in flight.slices):
            self.stepper.settle(flight)  # its other lanes keep their tokens
        message = f"{type(cause).__name__}: {cause}"
        for lane in victims:
            roster.fail(lane, message)
        roster.vouch(exc)

    def _quiesce(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def abandon(self, text: str) -> None:
        """The engine has failed: answer every waiting and running request with `text`. Nothing
        is released: the device state is not trusted."""
        roster = self.roster
        for job in roster.waiting:
            job.sink.put(outputs.error_output(job, text))
        for lane in roster.lanes:
            req = lane.request
            req.sink.put(outputs.fault_output(req, text, time.perf_counter()))
        roster.waiting.clear()
        roster.lanes.clear()
