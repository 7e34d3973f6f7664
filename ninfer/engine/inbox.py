"""The one way into the engine thread from others: a queue of ("job", Request), ("wake", None),
("call", (fn, Future)) and ("stop", save) messages, drained by the loop between steps."""

from __future__ import annotations

import queue
from collections import deque

from ninfer.engine import outputs
from ninfer.engine.request import Request
from ninfer.request import EngineError


class Inbox:
    """Thread-safe `put`; `drain` and `answer` on the engine thread. `save_on_stop`: the stop
    message's `save` (True until one arrives)."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self.save_on_stop = True

    def put(self, kind: str, item=None) -> None:
        self._queue.put((kind, item))

    def drain(self, waiting: deque[Request], block: bool, timeout: float | None = None) -> bool:
        """Move submitted jobs onto `waiting` and run calls; False once asked to stop. `block`:
        wait for the first item (at most `timeout` seconds when given)."""
        while True:
            try:
                kind, item = self._queue.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                return True
            block = False
            if kind == "stop":
                self.save_on_stop = bool(item)
                return False
            if kind == "job":
                if item.error is not None:
                    item.sink.put(outputs.error_output(item, item.error))
                else:
                    waiting.append(item)
            elif kind == "call":
                fn, fut = item
                try:
                    fut.set_result(fn())
                except BaseException as e:  # handed to the caller
                    fut.set_exception(e)

    def answer(self, message: str, reason: str = "abort") -> None:
        """After the loop ends: answer whatever is still queued so no caller waits forever."""
        while True:
            try:
                kind, item = self._queue.get_nowait()
            except queue.Empty:
                return
            if kind == "job":
                item.sink.put(outputs.error_output(item, message, reason=reason))
            elif kind == "call":
                item[1].set_exception(
                    EngineError(message) if reason == "error" else RuntimeError(message)
                )
