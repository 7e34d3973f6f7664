"""`serve` takes the start-up heap out of the garbage collector's reach before it serves: a
full collection walking the model's and torch's objects pauses every thread, the event loop
and the engine's among them (measured by `python -m ninfer.bench.bystander --stall-trace`)."""

from __future__ import annotations

import contextlib
import gc

from ninfer.server import run


class _FakeServer:
    started = False
    frozen_at_run = -1

    def __init__(self) -> None:
        self.closing = None

    @contextlib.contextmanager
    def holding_signals(self):
        yield

    def run(self) -> None:
        self.frozen_at_run = gc.get_freeze_count()
        self.started = True


class _FakeLLM:
    closed = False

    def close(self) -> None:
        self.closed = True


def test_serve_freezes_the_start_up_heap_before_serving(monkeypatch):
    server, llm = _FakeServer(), _FakeLLM()
    monkeypatch.setattr(run, "make_server", lambda *a, **k: server)
    gc.unfreeze()
    try:
        assert run.serve(llm, app=None, host="127.0.0.1", port=0) == 0
        assert server.frozen_at_run > 1000  # the interpreter's, pytest's and torch's objects
        assert llm.closed
    finally:
        gc.unfreeze()
