"""Helpers for the command-line tests: run `python -m ninfer` in a subprocess or a pseudo-terminal.

Everything runs the real engine on the embedded demo model (CPU, tiny), with a small Host tier.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

_FLAGS = "--device cpu --host-cache-mib 64 --max-concurrency 4 --kv-capacity 8192"
ENGINE_FLAGS = _FLAGS.split()
CPR = b"\x1b[6n"  # cursor position request
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\r")


def ninfer(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "ninfer", *args],
        capture_output=True, text=True, timeout=timeout, env=env, **kw,
    )  # fmt: skip


class Terminal:
    """A child process on a pseudo-terminal; `expect` waits for a regex in its (ANSI-stripped)
    output after what earlier `expect` calls consumed."""

    def __init__(
        self, argv: list[str], rows: int = 50, cols: int = 120, env: dict | None = None
    ) -> None:
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), **(env or {})}
        self.raw = b""  # every byte the child wrote, escape sequences included
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its controlling terminal
            os.execvpe(argv[0], argv, env)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.text, self.pos, self.status = "", 0, None

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # the child closed the terminal
            return False
        if not data:
            return False
        if CPR in data:  # the line editor asks where the cursor is, as a terminal would answer
            os.write(self.fd, b"\x1b[1;1R")
        self.raw += data
        self.text += ANSI.sub("", data.decode("utf-8", "replace"))
        return True

    def expect(self, pattern: str, timeout: float = 60) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            m = re.compile(pattern).search(self.text, self.pos)
            if m:
                self.pos = m.end()
                return m
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.2)) and not self._alive():
                raise AssertionError(f"no {pattern!r} in output:\n{self.text[self.pos :]}")

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def line(self, text: str) -> None:
        self.send(text + "\r")

    def key_at_prompt(self, key: str, timeout: float = 10) -> None:
        """Sends a control key once the prompt's line editor owns the terminal.

        The line editor switches the terminal out of canonical mode when it starts reading; a Ctrl+D
        typed before that is consumed by the canonical line discipline and lost (a race no
        person at a keyboard can hit), so wait for ICANON to go off first."""
        deadline = time.monotonic() + timeout
        while termios.tcgetattr(self.fd)[3] & termios.ICANON and time.monotonic() < deadline:
            time.sleep(0.02)
        self.send(key)

    def _alive(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status is None

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while self._alive():
            if time.monotonic() > deadline:
                raise AssertionError(f"still running; output:\n{self.text[self.pos :]}")
            self._read(0.1)
        return self.status

    def close(self) -> None:
        if self._alive():
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


class Screen:
    """A child process in a detached tmux session: `screen()` is what a person would see (tmux
    is the terminal emulator), so redraws that erase text show as erased."""

    def __init__(self, argv: list[str], env: dict, cols: int = 120, rows: int = 40) -> None:
        import shlex
        import shutil
        import uuid

        self.tmux = shutil.which("tmux")
        self.socket = f"ninfer-test-{uuid.uuid4().hex[:8]}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        command = f"env {exports} {shlex.join(argv)}; echo EXIT=$?; sleep 30"
        started = self._run("new-session", "-d", "-x", str(cols), "-y", str(rows), command)
        if started.returncode:
            raise AssertionError(f"tmux did not start: {started.stderr.strip()}")

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.tmux, "-L", self.socket, *args], capture_output=True,
                              text=True, timeout=10)  # fmt: skip

    def _tmux(self, *args: str) -> str:
        return self._run(*args).stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-J", "-S", "-200")

    def keys(self, *keys: str) -> None:
        """tmux key names ("C-u", "Up", "Enter", "Escape") or literal text (-l)."""
        for key in keys:
            if key in ("C-u", "C-c", "C-d", "Up", "Down", "Enter", "Escape", "BSpace"):
                self._tmux("send-keys", key)
            else:
                self._tmux("send-keys", "-l", key)

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.screen())
            if m:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} on the screen:\n{self.screen()}")
            time.sleep(0.2)

    def close(self) -> None:
        self._tmux("kill-server")
        for suffix in ("", ".lock"):  # the server's socket file stays behind otherwise
            with contextlib.suppress(OSError):
                os.unlink(f"/tmp/tmux-{os.getuid()}/{self.socket}{suffix}")
