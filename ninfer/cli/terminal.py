"""Keyboard handling for `ninfer chat`: multi-line input and Ctrl+C during a reply."""

from __future__ import annotations

import contextlib
import signal

from rich.console import Console

with contextlib.suppress(ImportError):  # gives input() line editing and history where present
    import readline  # noqa: F401


class StopOnInterrupt:
    """While active, the first Ctrl+C sets `hit`; a second one raises KeyboardInterrupt."""

    def __enter__(self) -> StopOnInterrupt:
        self.hit = False
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, *_: object) -> None:
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __exit__(self, *_: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


def read_message(console: Console) -> str:
    """One user message; raises EOFError / KeyboardInterrupt from the prompt."""
    line = console.input("[bold green]>>> [/]")
    if line.strip() == '"""':
        lines = []
        while (line := console.input("[dim]... [/]")).strip() != '"""':
            lines.append(line)
        return "\n".join(lines)
    lines = []
    while line.endswith("\\"):
        lines.append(line[:-1])
        line = console.input("[dim]... [/]")
    return "\n".join([*lines, line])
