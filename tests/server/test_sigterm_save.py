"""`ninfer serve` signalled again while it saves the prefix cache file (a process manager repeating
its stop, `kill` twice, Ctrl+C twice): a second SIGTERM is ignored and the session's cache is
saved; a second Ctrl+C abandons the save, keeping the previous file. Either way no temporary
file is left. The save is held open by `save_hold_script.py` so that the signal lands in it."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from server_helpers import MODEL

from ninfer.persist.tables import MAGIC

pytest.importorskip("uvicorn")

START_TIMEOUT_S = 120
SCRIPT = Path(__file__).with_name("save_hold_script.py")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """`ninfer serve` with a held save, its stderr read line by line on a thread."""

    def __init__(self, cache_file: Path) -> None:
        self.port = _free_port()
        cmd = [sys.executable, str(SCRIPT), "serve", "--device", "cpu", "--port", str(self.port)]
        cmd += ["--max-model-len", "2048", "--host-cache-mib", "16", "--drain-s", "5"]
        cmd += ["--prefix-cache-file", str(cache_file)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.getcwd()}
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        self.seen = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)

    def expect(self, text: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            assert self.proc.poll() is None, f"exited before {text!r}: {self.seen}"
            try:
                self.seen += self.lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                pytest.fail(f"no {text!r} within {timeout} s: {self.seen}")

    def started(self) -> str:
        url = f"http://127.0.0.1:{self.port}/v1"
        self.expect(url)
        return url

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def serve():
    started: list[Serve] = []

    def start(cache_file: Path) -> Serve:
        started.append(Serve(cache_file))
        return started[-1]

    yield start
    for s in started:
        s.stop()


@pytest.mark.slow
def test_a_second_sigterm_during_the_save_is_ignored_and_the_cache_saved(tmp_path, serve):
    cache_file = tmp_path / "prefix.cache"
    server = serve(cache_file)
    url = server.started()
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "keep me " * 40}],
        "max_tokens": 4,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    reply = httpx.post(f"{url}/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200
    server.proc.send_signal(signal.SIGTERM)
    server.expect("save holding", timeout=60)
    server.proc.send_signal(signal.SIGTERM)  # during the save
    assert server.proc.wait(60) == 0
    data = cache_file.read_bytes()
    assert data.startswith(MAGIC) and len(data) > 4096  # the session's blocks are in it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prefix.cache"]  # no temporary


@pytest.mark.slow
def test_a_second_ctrl_c_during_the_save_abandons_it_and_keeps_the_file(tmp_path, serve):
    cache_file = tmp_path / "prefix.cache"
    previous = MAGIC + b"\x07" * 100  # a damaged cache file: loaded as nothing, kept
    cache_file.write_bytes(previous)
    server = serve(cache_file)
    server.started()
    server.proc.send_signal(signal.SIGINT)
    server.expect("save holding", timeout=60)
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(60) == 130, server.seen
    assert cache_file.read_bytes() == previous, server.seen
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]  # (the lock may stay)
