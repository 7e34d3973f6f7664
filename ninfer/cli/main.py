"""`ninfer` command line: sub-commands and the engine flags they share.

Every engine option of `LLM(...)` is a flag, generated from its declaration
(`ninfer.config.EngineOptions` and its `Option` metadata: name, help, type); `engine_kwargs` maps
flags back to keyword arguments. A flag left out is not passed, so `LLM`'s own defaults (and the
values it derives from the model and the device) stay the single source of truth. The
sub-command modules import torch and the engine lazily, so `ninfer --help` stays fast. Text a
user reads (help, errors) explains itself: it cites no document outside the package.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from ninfer.version import __version__


def _engine_flags() -> list[tuple[str, str, dict[str, Any]]]:
    """(flag, LLM keyword, argparse options) of every engine option, from its `Option` metadata
    (`ninfer.config.EngineOptions`): a switch is `--no-NAME` (store_false) when it defaults to
    True, else `--NAME` (store_true); a number option parses its text with its kind, except
    one that also takes "auto" (`engine_kwargs` converts it)."""
    from ninfer.config import option_fields

    flags = []
    for f, option in option_fields():
        if not option.flag:
            continue
        name = f.name.replace("_", "-")
        opts: dict[str, Any] = {"help": option.help}
        if isinstance(f.default, bool):
            opts["action"] = "store_false" if f.default else "store_true"
            name = f"no-{name}" if f.default else name
        else:
            if option.kind is not None and not option.auto:
                opts["type"] = option.kind
            if option.metavar is not None:
                opts["metavar"] = option.metavar
        flags.append((f"--{name}", f.name, opts))
    return flags


ENGINE_FLAGS = _engine_flags()

COMMANDS = {
    "chat": ("ninfer.cli.chat", "interactive terminal chat"),
    "generate": ("ninfer.cli.generate", "batch generation from a JSONL file"),
    "bench": ("ninfer.cli.bench", "benchmarks: prefill, decode, TTFT, restore, cache"),
    "info": ("ninfer.cli.info", "resolved configuration and memory ledger"),
    "serve": ("ninfer.cli.serve", "OpenAI- and Anthropic-compatible HTTP server"),
}


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine options (left out: LLM's default)")
    for flag, dest, opts in ENGINE_FLAGS:
        group.add_argument(flag, dest=dest, default=argparse.SUPPRESS, **opts)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The `LLM(...)` keyword arguments of the engine flags given on the command line."""
    from ninfer.config import option_fields

    kwargs = {dest: getattr(args, dest) for _, dest, _ in ENGINE_FLAGS if hasattr(args, dest)}
    for f, option in option_fields():
        text = kwargs.get(f.name, "auto")
        if option.auto and option.kind is int and text != "auto":
            if not text.isdigit():
                flag, unit = "--" + f.name.replace("_", "-"), (option.metavar or "").lower()
                raise ValueError(f'{flag} must be "auto" or a number of {unit}, got {text!r}')
            kwargs[f.name] = int(text)
    return kwargs


def open_llm(args: argparse.Namespace, **overrides: Any):
    """Build the engine from the command line (flags first, then the sub-command's overrides)."""
    # A thread starts with the signal mask of the thread that starts it. Building the engine (its
    # loop, torch's worker pools) with SIGINT and SIGTERM blocked makes the kernel deliver them to
    # the main thread alone: delivered to a worker, they would leave the main thread asleep in
    # the line editor until the next key press.
    stopping = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
    try:
        from ninfer.llm import LLM  # importing torch may start its first worker threads

        return LLM(**{**engine_kwargs(args), **overrides})
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _TermRedelivery:
    """Makes a SIGTERM reach the main thread's Python handler even while it sleeps in readline.

    Python runs a signal's handler when the main thread next checks for signals. readline's
    input loop checks only when its select() is interrupted, so a SIGTERM that lands just before
    that select() is noticed at the next key press: the chat would hang at its prompt. Here the
    C-level handler also writes the signal number to a wakeup pipe; a watcher thread reads it
    and re-sends SIGTERM to the main thread every 0.2 s until the body that `serving` runs has
    left (`done`): a delivery whose exit Python dropped is followed by another.
    """

    def __init__(self) -> None:
        import threading

        self.done = threading.Event()
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        self._write = write
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._watch, name="ninfer-sigterm", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return  # closed
            if not data:
                return
            if signal.SIGTERM in data:
                while not self.done.wait(0.2):
                    signal.pthread_kill(self._main, signal.SIGTERM)

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        self.done.set()
        os.close(self._write)  # the watcher's read returns b"" and it ends


@contextlib.contextmanager
def serving(llm) -> Iterator:
    """Runs a sub-command on `llm`, then stops it in order.

    SIGTERM leaves the body like an exception, so the stop below runs and, with
    --prefix-cache-file, saves the Host tier. The handler raises each time the SIGTERM is
    delivered until the body has left: an exit raised where Python drops exceptions (a finalizer
    the garbage collector runs, say an asyncio event loop's) is raised again at the next
    re-delivery. A SIGTERM during the stop is ignored. A Ctrl+C while that stop is saving abandons
    the save (the previous file stays), waits up to 2 s for the engine, and exits at once.
    """
    redelivery = _TermRedelivery()

    def on_term(signum: int, _frame: object) -> None:
        if redelivery.done.is_set():
            return  # the body has left: the stop runs to its end
        raise SystemExit(128 + signum)

    def on_second_interrupt(_signum: int, _frame: object) -> None:
        llm.abandon_save(wait_s=2.0)
        os._exit(130)

    previous_term = signal.signal(signal.SIGTERM, on_term)
    try:
        yield llm
    finally:
        redelivery.done.set()  # no more re-deliveries, and no exit raised inside the stop
        previous_int = signal.signal(signal.SIGINT, on_second_interrupt)
        try:
            llm.close()
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous_term)
            redelivery.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ninfer", description="Qwen3.5 inference with a hybrid prefix cache."
    )
    parser.add_argument("--version", action="version", version=f"ninfer {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(sub)
        add_engine_flags(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from ninfer.cli.terminal import err_console, setup_logging

    parser = build_parser()
    if not (sys.argv[1:] if argv is None else list(argv)):  # no command: list them
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    setup_logging()
    module = importlib.import_module(COMMANDS[args.command][0])

    def fail(message: str) -> int:
        err_console().print(f"ninfer {args.command}: error: {message}", markup=False,
                            highlight=False, soft_wrap=True)  # fmt: skip
        return 2

    try:
        engine_kwargs(args)  # a malformed flag fails before anything is built
        return int(module.run(args) or 0)
    except BrokenPipeError:
        return 1
    except ValueError as exc:  # bad configuration or input: one line, no traceback
        return fail(str(exc))
    except OSError as exc:  # a file that cannot be read or written: name it
        if exc.filename is not None:
            return fail(f"{exc.filename}: {exc.strerror or exc}")
        return fail(str(exc))
    except Exception as exc:  # anything else (say, a tokenizer file its library rejects)
        if os.environ.get("NINFER_TRACEBACK"):
            raise
        return fail(f"{type(exc).__name__}: {exc} (NINFER_TRACEBACK=1 shows where)")


if __name__ == "__main__":
    sys.exit(main())
