"""The real server on a free localhost port (uvicorn in a thread) over one demo-model LLM.

Only 127.0.0.1 is ever contacted. `serve_app(app)` starts a further server (say, with an API
key) over the same LLM; every server is stopped at teardown.

The session server's cache holds whatever the tests before have left in it, so which snapshots
its small Host tier still has depends on the test order. A test whose claim needs a cache with
room (a superseded snapshot still there, spec §9.3) uses `fresh_served`: its own LLM with the
same options, empty at the start.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from server_helpers import BODY_LIMIT, LLM_OPTIONS, MODEL  # noqa: E402

from ninfer.llm import LLM  # noqa: E402
from ninfer.server.app import create_app  # noqa: E402
from ninfer.server.run import make_server  # noqa: E402


@dataclass
class Served:
    url: str  # http://127.0.0.1:PORT
    llm: LLM
    app: object

    @property
    def base(self) -> str:
        return self.url + "/v1"


def _start(app) -> tuple[str, object, threading.Thread]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = make_server(app, "127.0.0.1", port, drain_s=5)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        assert thread.is_alive(), "the server thread died"
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server, thread


@pytest.fixture(scope="session")
def server_llm():
    llm = LLM(**LLM_OPTIONS)
    yield llm
    llm.close()


@pytest.fixture(scope="session")
def serve_app(server_llm):
    running = []

    def start(app) -> str:
        url, server, thread = _start(app)
        running.append((server, thread))
        return url

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="session")
def served(server_llm, serve_app) -> Served:
    app = create_app(server_llm, MODEL, max_body_bytes=BODY_LIMIT)
    return Served(serve_app(app), server_llm, app)


@pytest.fixture
def fresh_served() -> Served:
    """A server over its own LLM (LLM_OPTIONS), with an empty cache; stopped, then closed."""
    llm = LLM(**LLM_OPTIONS)
    app = create_app(llm, MODEL, max_body_bytes=BODY_LIMIT)
    url, server, thread = _start(app)
    yield Served(url, llm, app)
    server.should_exit = True
    thread.join(10)
    llm.close()
