"""`ninfer` command line: sub-commands and the engine flags they share.

Every engine option of `LLM(...)` (spec/API.md) is a flag; `engine_kwargs` is the one place that
maps flags to keyword arguments. A flag left out is not passed, so `LLM`'s own defaults (and the
derived values of spec §14.2) stay the single source of truth. The sub-command modules import
torch and the engine lazily, so `ninfer --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

# (flag, LLM keyword, argparse options); store_false flags map `--no-x` to `x=False`.
ENGINE_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--model", "model", dict(metavar="PATH", help="checkpoint folder (default: the demo)")),
    ("--device", "device", dict(help='"auto" (default), "cuda", "cuda:N" or "cpu"')),
    ("--dtype", "dtype", dict(help='"auto", "bfloat16", "float16" or "float32"')),
    ("--kv-dtype", "kv_dtype", dict(help='"auto" (= dtype), "bfloat16" or "fp8_e4m3"')),
    ("--max-concurrency", "max_concurrency", dict(type=int, metavar="N", help="lanes, 1..8")),
    ("--prefill-chunk", "prefill_chunk", dict(type=int, metavar="TOKENS")),
    (
        "--solo-prefill-chunk",
        "solo_prefill_chunk",
        dict(type=int, metavar="TOKENS", help="tokens per prefill pass while no lane decodes"),
    ),
    ("--max-model-len", "max_model_len", dict(type=int, metavar="TOKENS")),
    ("--kv-capacity", "kv_capacity", dict(metavar="TOKENS", help='or "auto" (free memory)')),
    ("--host-cache-mib", "host_cache_mib", dict(type=int, metavar="MIB", help="0: Device only")),
    ("--device-snapshot-slots", "device_snapshot_slots", dict(type=int, metavar="N")),
    ("--cache-taps-per-request", "cache_taps_per_request", dict(type=int, metavar="N")),
    ("--cache-tap-ladder", "cache_tap_ladder", dict(type=int, metavar="TOKENS")),
    ("--cache-tap-min-gap", "cache_tap_min_gap", dict(type=int, metavar="TOKENS")),
    ("--prefix-cache-file", "prefix_cache_file", dict(metavar="PATH", help="persist the cache")),
    ("--no-prefix-reuse", "prefix_reuse", dict(action="store_false", help="disable the cache")),
    ("--concurrent-prefill", "concurrent_prefill", dict(action="store_true")),
    ("--no-compile", "compile", dict(action="store_false", help="no torch.compile")),
    ("--no-cuda-graphs", "cuda_graphs", dict(action="store_false")),
    (
        "--no-overlap-decode",
        "overlap_decode",
        dict(action="store_false", help="read each decode step's tokens before the next"),
    ),
    (
        "--prefill-graph-tokens",
        "prefill_graph_tokens",
        dict(type=int, metavar="TOKENS", help="CUDA-graph prefill up to TOKENS; 0: off"),
    ),
    ("--seed", "seed", dict(type=int)),
    (
        "--pending-timeout-s",
        "pending_timeout_s",
        dict(type=float, metavar="S", help="queue timeout bounding coalescing waits"),
    ),
]

COMMANDS = {
    "chat": ("ninfer.cli.chat", "interactive terminal chat"),
    "generate": ("ninfer.cli.generate", "batch generation from a JSONL file"),
    "bench": ("ninfer.cli.bench", "benchmarks: prefill, decode, TTFT, restore, cache"),
    "info": ("ninfer.cli.info", "resolved configuration and memory ledger"),
    "serve": ("ninfer.cli.serve", "OpenAI- and Anthropic-compatible HTTP server"),
}


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine (spec/API.md; left out = LLM's default)")
    for flag, dest, opts in ENGINE_FLAGS:
        group.add_argument(flag, dest=dest, default=argparse.SUPPRESS, **opts)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The `LLM(...)` keyword arguments of the engine flags given on the command line."""
    kwargs = {dest: getattr(args, dest) for _, dest, _ in ENGINE_FLAGS if hasattr(args, dest)}
    capacity = kwargs.get("kv_capacity", "auto")
    if capacity != "auto":
        if not capacity.isdigit():
            raise ValueError(
                f'--kv-capacity must be "auto" or a number of tokens, got {capacity!r}'
            )
        kwargs["kv_capacity"] = int(capacity)
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
        from ninfer import LLM  # importing torch may start its first worker threads

        return LLM(**{**engine_kwargs(args), **overrides})
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _TermRedelivery:
    """Makes a SIGTERM reach the main thread's Python handler even while it sleeps in readline.

    Python runs a signal's handler when the main thread next checks for signals. readline's
    input loop checks only when its select() is interrupted, so a SIGTERM that lands just before
    that select() is noticed at the next key press: the chat would hang at its prompt. Here the
    C-level handler also writes the signal number to a wakeup pipe; a watcher thread reads it
    and re-sends SIGTERM to the main thread every 0.2 s until the handler has run (`done`).
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
    """Runs a sub-command on `llm`, then stops it in order (spec §5.5).

    SIGTERM leaves the body like an exception (once: a re-sent one during the stop is ignored),
    so the stop below runs and, with --prefix-cache-file, saves the Host tier. A Ctrl+C while
    that stop is saving abandons the save (the previous file stays), waits up to 2 s for the
    engine, and exits at once.
    """
    redelivery = _TermRedelivery()

    def on_term(signum: int, _frame: object) -> None:
        if redelivery.done.is_set():
            return  # already leaving
        redelivery.done.set()
        raise SystemExit(128 + signum)

    def on_second_interrupt(_signum: int, _frame: object) -> None:
        llm.abandon_save(wait_s=2.0)
        os._exit(130)

    previous_term = signal.signal(signal.SIGTERM, on_term)
    try:
        yield llm
    finally:
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
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(sub)
        add_engine_flags(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # the engine's own progress lines (startup time, prefix cache load and save) on stderr
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("ninfer").setLevel(logging.INFO)
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        engine_kwargs(args)  # a malformed flag fails before anything is built
        return int(module.run(args) or 0)
    except (ValueError, FileNotFoundError) as exc:  # bad configuration or input: no traceback
        print(f"ninfer {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
