"""`ninfer` command line: sub-commands and the engine flags they share.

Every engine option of `LLM(...)` is a flag; `engine_kwargs` is the one place that maps flags to
keyword arguments. A flag left out is not passed, so `LLM`'s own defaults (and the values it
derives from the model and the device) stay the single source of truth. The sub-command modules
import torch and the engine lazily, so `ninfer --help` stays fast. Text a user reads (help,
errors) explains itself: it cites no document outside the package.
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

# (flag, LLM keyword, argparse options); store_false flags map `--no-x` to `x=False`.
ENGINE_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--model", "model", dict(metavar="PATH", help="Hugging Face-format Qwen3.5 checkpoint "
                              "folder (default: the embedded demo model, random weights)")),
    ("--device", "device", dict(help='"auto" (default: CUDA if present), "cuda", "cuda:N" or '
                                '"cpu"')),
    ("--dtype", "dtype", dict(help='weights and activations: "auto" (bfloat16 on CUDA, float32 '
                              'on the CPU), "bfloat16", "float16" or "float32"')),
    ("--kv-dtype", "kv_dtype", dict(help='KV cache: "auto" (= --dtype), "bfloat16", "float16", '
                                    '"float32" or "fp8_e4m3"')),
    ("--max-concurrency", "max_concurrency", dict(type=int, metavar="N",
     help="requests decoded together, 1..8 (default 8)")),
    ("--prefill-chunk", "prefill_chunk", dict(type=int, metavar="TOKENS",
     help="tokens per prefill pass while other requests decode (default: derived from the "
     "model and device)")),
    ("--solo-prefill-chunk", "solo_prefill_chunk", dict(type=int, metavar="TOKENS",
     help="tokens per prefill pass while no request decodes (default: derived)")),
    ("--max-model-len", "max_model_len", dict(type=int, metavar="TOKENS",
     help="longest prompt + reply (default: the model's)")),
    ("--kv-capacity", "kv_capacity", dict(metavar="TOKENS",
     help='KV pool size in tokens, or "auto" (default: what free memory allows)')),
    ("--host-cache-mib", "host_cache_mib", dict(type=int, metavar="MIB",
     help="Host (CPU memory) tier of the prefix cache in MiB; 0: Device tier only "
     "(default 8192)")),
    ("--device-snapshot-slots", "device_snapshot_slots", dict(type=int, metavar="N",
     help="recurrent-state snapshots kept on the Device (default: derived)")),
    ("--cache-taps-per-request", "cache_taps_per_request", dict(type=int, metavar="N",
     help="most mid-prompt snapshots a request takes (default: derived)")),
    ("--cache-tap-ladder", "cache_tap_ladder", dict(type=int, metavar="TOKENS",
     help="spacing of the ladder of mid-prompt snapshots in a long prompt (default: derived)")),
    ("--cache-tap-min-gap", "cache_tap_min_gap", dict(type=int, metavar="TOKENS",
     help="least distance between two snapshots of a prompt (default: derived)")),
    ("--prefix-cache-file", "prefix_cache_file", dict(metavar="PATH",
     help="keep the Host tier across runs in this file: saved at exit, loaded at start")),
    ("--no-prefix-reuse", "prefix_reuse", dict(action="store_false",
     help="turn the prefix cache off (every prompt is computed in full)")),
    ("--concurrent-prefill", "concurrent_prefill", dict(action="store_true",
     help="admit a request while another is still prefilling (default: one prefill at "
     "a time)")),
    ("--no-compile", "compile", dict(action="store_false",
     help="do not torch.compile the model (faster start, slower steps)")),
    ("--no-cuda-graphs", "cuda_graphs", dict(action="store_false",
     help="run every step eagerly, without captured CUDA graphs")),
    ("--no-overlap-decode", "overlap_decode", dict(action="store_false",
     help="read each decode step's tokens before launching the next")),
    ("--prefill-graph-tokens", "prefill_graph_tokens", dict(type=int, metavar="TOKENS",
     help="prefill passes up to TOKENS replay a CUDA graph; 0: eager (default 2048)")),
    ("--seed", "seed", dict(type=int, help="seed of the sampling RNG (default 0)")),
    ("--pending-timeout-s", "pending_timeout_s", dict(type=float, metavar="S",
     help="how long a queued request may wait for another one prefilling the same prefix; "
     "0: never wait (default 60)")),
]  # fmt: skip

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
    """Runs a sub-command on `llm`, then stops it in order.

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
    from ninfer import __version__

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

    args = build_parser().parse_args(argv)
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
