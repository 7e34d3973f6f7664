"""Serving one app with uvicorn until SIGTERM / SIGINT: drain, then close the engine.

On the first SIGTERM or SIGINT the server stops accepting connections, new requests on open
connections get 503, and requests in flight run to their end for at most `drain_s` seconds
(then they are cancelled: the engine publishes what they computed; a second signal while
draining cancels them at once). Then the engine closes, which saves the prefix cache file when
one is set, and `serve` returns 0 (uvicorn's habit of re-raising the signal after its shutdown
is not kept: a drained stop is a clean exit).

The handlers stay installed until the engine has closed, as `ninfer chat`'s do
(`cli/main.serving`): a SIGTERM during the close (a process manager repeating its stop, `kill`
twice) is ignored and the save runs to its end; a Ctrl+C abandons the save (the previous file
stays, the temporary one is deleted), waits up to 2 s for the engine and exits 130.

Before serving, everything built at start-up (the model, torch's and the app's objects) is
moved out of the garbage collector's reach (`gc.freeze`): a full collection would otherwise
walk that whole heap, a pause of every thread (event loop and engine alike) long enough to
show as a stall in every stream, triggered by the many small objects a reply with logprobs
allocates.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading

import uvicorn

DEFAULT_DRAIN_S = 30.0


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app) -> None:
        super().__init__(config)
        self._app = app
        self.closing = None  # the LLM once the server has stopped and it closes
        self._held = False  # `holding_signals` is in force

    def handle_exit(self, sig, frame) -> None:
        llm = self.closing
        if llm is None:
            self._app.state.draining = True
            super().handle_exit(sig, frame)
        elif sig == signal.SIGINT:  # a SIGTERM while closing is ignored: the save runs on
            llm.abandon_save(wait_s=2.0)
            os._exit(130)

    @contextlib.contextmanager
    def capture_signals(self):
        if self._held:  # `serve` holds them from before the run until the engine has closed
            yield
            return
        with self.holding_signals():
            yield

    @contextlib.contextmanager
    def holding_signals(self):
        """`handle_exit` for SIGINT and SIGTERM (main thread only); the previous handlers
        come back on leaving."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        stops = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in stops}
        self._held = True
        try:
            yield
        finally:
            self._held = False
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def make_server(
    app, host: str, port: int, drain_s: float = DEFAULT_DRAIN_S, log_level: str = "warning"
) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=max(int(drain_s), 1),
        lifespan="off",
        access_log=False,
    )
    return _Server(config, app)


def serve(llm, app, host: str, port: int, drain_s: float = DEFAULT_DRAIN_S, announce=None) -> int:
    """Run until a stop signal; then drain, close `llm` (saving its cache file) and return 0."""
    server = make_server(app, host, port, drain_s)
    if announce is not None:
        original = server.startup

        async def startup(sockets=None) -> None:
            await original(sockets)
            if server.started:
                announce()

        server.startup = startup  # type: ignore[method-assign]
    gc.collect()
    gc.freeze()
    with server.holding_signals():
        try:
            server.run()
        finally:
            server.closing = llm
            _close(llm)
    return 0 if server.started else 1


def _close(llm) -> None:
    """`llm.close()` on a helper thread while the main thread waits in short ticks. The kernel
    may hand a signal to any thread that does not block it (asyncio's executor threads, say),
    and Python runs the handler on the main thread only when it next runs code: blocked in one
    long join, that would be after the save."""
    failed: list[BaseException] = []

    def close() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            llm.close()
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            failed.append(e)

    closer = threading.Thread(target=close, name="ninfer-close")
    closer.start()
    while closer.is_alive():
        closer.join(0.1)
    if failed:
        raise failed[0]
