"""`ninfer serve` as a process: the start-up line with the URL; SIGTERM lets the request in
flight finish, saves the prefix cache file and exits 0."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from server_helpers import MODEL

pytest.importorskip("uvicorn")

START_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_sigterm_drains_saves_and_exits_0(tmp_path):
    port = _free_port()
    cache_file = tmp_path / "prefix.cache"
    cmd = [sys.executable, "-m", "ninfer", "serve", "--device", "cpu", "--port", str(port)]
    cmd += ["--max-model-len", "2048", "--host-cache-mib", "16", "--drain-s", "60"]
    cmd += ["--prefix-cache-file", str(cache_file)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True).start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        banner = ""
        while f"http://127.0.0.1:{port}/v1" not in banner:
            assert proc.poll() is None, f"the server exited: {banner}"
            try:
                banner += lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                pytest.fail(f"no start-up line within {START_TIMEOUT_S} s: {banner}")
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "drain me " * 30}],
            "max_tokens": 48,
            "ignore_eos": True,
            "stream": True,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        chunks: list[dict] = []
        first = threading.Event()

        def consume() -> None:
            with httpx.stream("POST", url, json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunks.append(json.loads(line[6:]))
                        first.set()
                    elif line == "data: [DONE]":
                        chunks.append({"done": True})

        reader = threading.Thread(target=consume)
        reader.start()
        assert first.wait(60)
        proc.send_signal(signal.SIGTERM)
        reader.join(60)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert chunks[-1] == {"done": True}  # the request in flight ran to its end
    finishes = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"]]
    assert finishes[-1] == "length"
    assert cache_file.is_file() and cache_file.stat().st_size > 0
