"""The terminal side of the sub-commands: the chat's line editor, Ctrl+C during a reply, and one
stderr console that log lines, spinners and progress bars share.

A log line printed on a stream a live spinner or bar does not own lands in the middle of its
line; printed through the console that owns the live display, it goes above it. So every
`ninfer` logger writes through `err_console()`, and the spinners and bars run on it too.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
from pathlib import Path

from rich.console import Console

_ERR: Console | None = None


def err_console() -> Console:
    """The process's stderr console (created on first use; it follows `sys.stderr`)."""
    global _ERR
    if _ERR is None:
        _ERR = Console(stderr=True, highlight=False)
    return _ERR


def output_console() -> Console:
    """A stdout console; to a file or a pipe, tables keep their full width (a reader or a
    script wants every digit, not a table cut to 80 columns)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=1000)
    return console


class ConsoleLogHandler(logging.Handler):
    """Log records as plain lines on `err_console()` (above any live spinner or bar)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            err_console().print(self.format(record), markup=False, highlight=False,
                                soft_wrap=True)  # fmt: skip
        except Exception:
            self.handleError(record)


def setup_logging() -> None:
    """The engine's own progress lines (startup, prefix cache load and save) on stderr."""
    logger = logging.getLogger("ninfer")
    if not any(isinstance(h, ConsoleLogHandler) for h in logger.handlers):
        handler = ConsoleLogHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # not twice through a root handler


class StopOnInterrupt:
    """While active, the first Ctrl+C sets `hit`; a second one raises KeyboardInterrupt."""

    def __enter__(self) -> StopOnInterrupt:
        self.hit = False
        self.acted = False  # for the caller: the first Ctrl+C has been acted on
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, *_: object) -> None:
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __exit__(self, *_: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


# ---- the chat's input ---------------------------------------------------------------------
BLOCK = '"""'
PROMPT, CONTINUATION = ">>> ", "... "


def history_file() -> Path:
    """Where the chat keeps its input history across runs (the XDG data directory)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local/share")
    return Path(base) / "ninfer" / "chat_history"


def needs_more(text: str) -> bool:
    """True while the typed text is an unfinished message: an open \"\"\" block, or a last
    line ending with a backslash."""
    lines = text.split("\n")
    if lines[0].strip() == BLOCK:
        return len(lines) == 1 or lines[-1].strip() != BLOCK
    return text.endswith("\\")


def message_text(text: str) -> str:
    """The message the typed text stands for: a block's inside, or lines joined at their
    trailing backslashes."""
    lines = text.split("\n")
    if lines[0].strip() == BLOCK:
        end = len(lines) - 1 if len(lines) > 1 and lines[-1].strip() == BLOCK else len(lines)
        return "\n".join(lines[1:end])
    return re.sub(r"\\\n", "\n", text).removesuffix("\\")


class LineEditor:
    """Reads one message at a time; raises EOFError (Ctrl+D) / KeyboardInterrupt (Ctrl+C).

    On a terminal: prompt_toolkit, with the history of earlier runs (Up, Ctrl+R), Emacs keys
    (Ctrl+U, Ctrl+A, ...), and multi-line messages edited as one (Enter inside an open block or
    after a trailing backslash adds a line; Alt+Enter always does). Elsewhere (a pipe), plain
    lines with the same continuation rules.
    """

    def __init__(self, history: Path | None = None) -> None:
        self._session = None
        if sys.stdin.isatty() and sys.stdout.isatty():
            self._session = self._make_session(history)

    @staticmethod
    def _make_session(history: Path | None):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        keys = KeyBindings()

        @keys.add("enter")
        def _enter(event) -> None:
            buffer = event.current_buffer
            if needs_more(buffer.text) and buffer.document.is_cursor_at_the_end:
                buffer.insert_text("\n")
            else:
                buffer.validate_and_handle()

        @keys.add("escape", "enter")
        def _newline(event) -> None:
            event.current_buffer.insert_text("\n")

        store = InMemoryHistory()
        if history is not None:
            try:
                history.parent.mkdir(parents=True, exist_ok=True)
                history.touch()
                store = FileHistory(str(history))
            except OSError:
                pass  # an unwritable data directory: history for this run only
        return PromptSession(
            history=store,
            key_bindings=keys,
            multiline=True,  # Enter is bound above: it submits a finished message
            prompt_continuation=lambda width, *_: CONTINUATION.rjust(width),
            enable_history_search=False,
        )

    def read(self) -> str:
        if self._session is None:
            return self._read_plain()
        text = self._session.prompt(
            [("ansigreen bold", PROMPT)],
            handle_sigint=False,  # Ctrl+C is a key here; no SIGINT handler of the event loop
            set_exception_handler=False,
        )
        return message_text(text)

    @staticmethod
    def _read_plain() -> str:
        # Input from a pipe or a file is not echoed: prompts there would only pile up.
        shown = sys.stdin.isatty()
        text = input(PROMPT if shown else "")
        while needs_more(text):
            text += "\n" + input(CONTINUATION if shown else "")
        return message_text(text)
