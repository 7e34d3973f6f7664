"""`ninfer serve`: the OpenAI- and Anthropic-compatible HTTP server (ninfer/server/)."""

from __future__ import annotations

import argparse
import sys

DEFAULT_MAX_BODY_BYTES = 8 << 20  # ninfer.server.context's (the server extra may be absent)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument(
        "--api-key", default=None, help="require this key (Bearer or x-api-key) on /v1/*"
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        nargs="+",
        metavar="NAME",
        help="the model name clients send, or several (clients that send their own model "
        "names can be pointed here); default: the checkpoint folder's name, or 'demo'",
    )
    parser.add_argument(
        "--preset",
        choices=("0.8B", "2B", "4B", "9B", "27B", "35B-A3B"),
        help="a released shape with random weights and the demo tokenizer (benchmarks)",
    )
    parser.add_argument(
        "--allowed-hosts",
        default="",
        metavar="NAMES",
        help="comma-separated host names accepted in the Host header besides IP addresses, "
        "localhost and --host ('*': any; with --api-key any is accepted)",
    )
    parser.add_argument(
        "--allowed-origins",
        default="",
        metavar="ORIGINS",
        help="comma-separated browser origins (e.g. http://localhost:3000) answered with CORS "
        "('*': any); a request from any other origin is refused",
    )
    parser.add_argument(
        "--max-body-mib",
        type=float,
        default=DEFAULT_MAX_BODY_BYTES / (1 << 20),
        metavar="MIB",
        help="largest request body accepted (default %(default)g MiB)",
    )
    parser.add_argument(
        "--drain-s",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, wait up to S seconds for requests in flight (default 30)",
    )


def check_port(host: str, port: int) -> None:
    """ValueError (one line naming the port) when `host:port` cannot be bound now, say because
    another server listens there. Bound as uvicorn binds it (SO_REUSEADDR), then let go."""
    import errno
    import socket

    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ValueError(f"--host {host!r}: not an address of this machine ({e})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ValueError(
                    f"port {port} on {host} is already in use (another server?); "
                    "choose another with --port"
                ) from None
            raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def model_names(args: argparse.Namespace) -> list[str]:
    """The names clients may send (`--served-model-name` takes several; the first is the one
    replies default to)."""
    given = args.served_model_name
    if isinstance(given, str):
        given = [given]
    names = [n for part in given or [] for n in part.split(",") if n.strip()]
    return [n.strip() for n in names] or [model_name(args)]


def model_name(args: argparse.Namespace) -> str:
    """The default name: the checkpoint folder's, the preset's or "demo"."""
    if getattr(args, "preset", None):
        return f"preset-{args.preset}"
    model = getattr(args, "model", None)
    if model is None:
        return "demo"
    from pathlib import Path

    return Path(model).resolve().name


def run(args: argparse.Namespace) -> int:
    if not args.max_body_mib > 0:
        raise ValueError(f"--max-body-mib must be > 0, got {args.max_body_mib}")
    check_port(args.host, args.port)  # in a moment: before the server's imports (torch) too
    try:
        from ninfer.server.app import create_app
        from ninfer.server.run import serve
    except ImportError as e:
        hint = "the server needs the serve extra: pip install 'ninfer[serve]'"
        raise ValueError(f"{hint} ({e})") from None
    from ninfer.cli.main import open_llm

    names = model_names(args)
    name = names[0]
    llm = _preset_llm(args) if args.preset else open_llm(args)
    app = create_app(
        llm,
        names,
        api_key=args.api_key,
        max_body_bytes=int(args.max_body_mib * (1 << 20)),
        host=args.host,
        allowed_hosts=_names(args.allowed_hosts),
        allowed_origins=_names(args.allowed_origins),
    )
    host = f"[{args.host}]" if ":" in args.host else args.host

    def announce() -> None:
        print(
            f"ninfer serve: {name!r} on http://{host}:{args.port}/v1 "
            f"(OpenAI /v1/chat/completions, Anthropic /v1/messages; Ctrl+C or SIGTERM stops)",
            file=sys.stderr,
            flush=True,
        )

    return serve(llm, app, args.host, args.port, args.drain_s, announce)


def _names(flag: str) -> list[str]:
    return [n.strip() for n in flag.split(",") if n.strip()]


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
