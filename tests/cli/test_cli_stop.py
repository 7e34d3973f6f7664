"""The orderly stop of a sub-command (`ninfer.cli.main.serving`): a SIGTERM leaves the body once,
whatever Python code it lands in, and the engine is closed (which saves the Host tier)."""

from __future__ import annotations

import gc
import signal
import time

import pytest

from ninfer.cli.main import serving


class FakeLLM:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1

    def abandon_save(self, wait_s: float) -> None:  # pragma: no cover - Ctrl+C during the stop
        raise AssertionError("not reached")


class SignalledInFinalizer:
    """An object whose finalizer takes a SIGTERM: Python runs the handler there, and an exception
    raised in a finalizer is printed and dropped ("Exception ignored in ..."), as happens when a
    SIGTERM lands while the garbage collector finalizes an asyncio event loop."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGTERM)


def _idle(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)


def test_sigterm_leaves_the_body_and_closes_the_engine():
    llm = FakeLLM()
    with pytest.raises(SystemExit) as stop, serving(llm):
        signal.raise_signal(signal.SIGTERM)
        _idle(5.0)
    assert stop.value.code == 128 + signal.SIGTERM and llm.closed == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_sigterm_swallowed_by_a_finalizer_still_stops_the_body():
    llm = FakeLLM()
    started = time.monotonic()
    with pytest.raises(SystemExit) as stop, serving(llm):
        SignalledInFinalizer()  # dropped at once: its finalizer takes the SIGTERM
        gc.collect()
        _idle(5.0)  # the SIGTERM is sent again until the body has left
    assert stop.value.code == 128 + signal.SIGTERM and llm.closed == 1
    assert time.monotonic() - started < 4.0


def test_a_sigterm_during_the_stop_does_not_abandon_it():
    class SlowClose(FakeLLM):
        def close(self) -> None:
            signal.raise_signal(signal.SIGTERM)  # a second stop request while saving
            _idle(0.5)
            super().close()

    llm = SlowClose()
    with serving(llm):
        pass
    assert llm.closed == 1
