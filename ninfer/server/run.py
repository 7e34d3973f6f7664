"""Serving one app with uvicorn until SIGTERM / SIGINT: drain, then close the engine.

On the first SIGTERM or SIGINT the server stops accepting connections, new requests on open
connections get 503, and requests in flight run to their end for at most `drain_s` seconds
(then they are cancelled: the engine publishes what they computed). Then the engine closes,
which saves the prefix cache file when one is set, and `serve` returns 0 (uvicorn's habit of
re-raising the signal after its shutdown is not kept: a drained stop is a clean exit).
"""

from __future__ import annotations

import contextlib
import signal
import threading

import uvicorn

DEFAULT_DRAIN_S = 30.0


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig, frame) -> None:
        self._app.state.draining = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        stops = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in stops}
        try:
            yield
        finally:
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
    try:
        server.run()
    finally:
        llm.close()
    return 0 if server.started else 1
