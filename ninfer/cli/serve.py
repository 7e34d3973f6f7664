"""`ninfer serve`: the OpenAI- and Anthropic-compatible HTTP server (ninfer/server/)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument(
        "--api-key", default=None, help="require this key (Bearer or x-api-key) on /v1/*"
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model name clients send (default: the checkpoint folder's name, or 'demo')",
    )
    parser.add_argument(
        "--preset",
        choices=("0.8B", "2B", "4B", "9B", "27B", "35B-A3B"),
        help="a released shape with random weights and the demo tokenizer (benchmarks)",
    )
    parser.add_argument(
        "--drain-s",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, wait up to S seconds for requests in flight (default 30)",
    )


def model_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return args.served_model_name
    if getattr(args, "preset", None):
        return f"preset-{args.preset}"
    model = getattr(args, "model", None)
    if model is None:
        return "demo"
    from pathlib import Path

    return Path(model).resolve().name


def run(args: argparse.Namespace) -> int:
    try:
        from ninfer.server.app import create_app
        from ninfer.server.run import serve
    except ImportError as e:
        hint = "the server needs the serve extra: pip install 'ninfer[serve]'"
        raise ValueError(f"{hint} ({e})") from None
    from ninfer.cli.main import open_llm

    name = model_name(args)
    llm = _preset_llm(args) if args.preset else open_llm(args)
    app = create_app(llm, name, api_key=args.api_key)
    host = f"[{args.host}]" if ":" in args.host else args.host

    def announce() -> None:
        print(
            f"ninfer serve: {name!r} on http://{host}:{args.port}/v1 "
            f"(OpenAI /v1/chat/completions, Anthropic /v1/messages; Ctrl+C or SIGTERM stops)",
            file=sys.stderr,
            flush=True,
        )

    return serve(llm, app, args.host, args.port, args.drain_s, announce)


def _preset_llm(args: argparse.Namespace):
    """An LLM over a preset's random weights (as `ninfer bench --preset`), built with SIGINT
    and SIGTERM blocked like `open_llm`, so only the main thread receives them."""
    import signal

    from ninfer.bench.suite import BenchSpec, load
    from ninfer.cli.main import engine_kwargs

    engine = engine_kwargs(args)
    if "model" in engine:
        raise ValueError("give --preset or --model, not both")
    stopping = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
    try:
        loaded = load(BenchSpec(parts=[], preset=args.preset, engine=engine))
        return loaded.make_llm(engine)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
