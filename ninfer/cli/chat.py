"""`ninfer chat`: an interactive terminal chat over `LLM.stream`.

Ctrl+C during a reply stops it: the stream is closed (which cancels the engine request) and the
partial reply is kept as the assistant message, so the history shows what was seen; a reply
stopped before its first token is dropped together with its user message. Ctrl+C twice at the
prompt, Ctrl+D or /exit leaves.
"""

from __future__ import annotations

import argparse
import contextlib
import time

from rich.console import Console
from rich.markup import escape

from ninfer.cli.chat_view import ReasoningSplitter, stats_table, stopped_line, turn_line
from ninfer.cli.main import open_llm, serving
from ninfer.cli.terminal import StopOnInterrupt, read_message

HELP = """\
/help           this text
/reset          forget the conversation (the system prompt stays)
/system TEXT    set the system prompt and start over (/system alone clears it)
/stats          prefix cache table (blocks, snapshots, hits, bytes per tier)
/exit           leave (also Ctrl+D, or Ctrl+C twice at the prompt)
Multi-line input: end a line with \\ to continue it, or put \"\"\" alone on a line to open and
close a block. Ctrl+C during a reply stops it; the partial reply is kept in the history."""

DEMO_BANNER = (
    "[bold yellow]Demo model:[/] random weights, so its text is noise. "
    "It exercises the engine and the cache; pass [bold]--model PATH[/] for a real checkpoint."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--no-thinking", action="store_true", help="disable the reasoning block")
    p.add_argument("--system", default=None, help="system prompt")


def reply(console: Console, llm, messages: list[dict], args: argparse.Namespace) -> None:
    """Streams one reply into the console and appends it to `messages` (see module doc)."""
    from ninfer import SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p
    )
    split = ReasoningSplitter(thinking=not args.no_thinking)
    start, ttft, n_tokens, final = time.perf_counter(), None, 0, None
    try:
        stream = llm.stream(messages, params, enable_thinking=not args.no_thinking)
        with StopOnInterrupt() as interrupt, contextlib.closing(stream):
            for event in stream:
                if interrupt.hit:
                    break
                if not hasattr(event, "finish_reason"):  # a StreamDelta
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    n_tokens += len(event.token_ids)
                    draw(console, split.feed(event.text))
                else:
                    final = event
    except KeyboardInterrupt:  # a second Ctrl+C before the engine answered: stop all the same
        pass
    except ValueError as exc:  # the engine refused the request (e.g. longer than max_model_len)
        console.print(f"\n[red]error: {escape(str(exc))}[/]")
        messages.pop()
        return
    draw(console, split.flush())
    console.print()
    if final is not None:
        console.print(turn_line(final), style="cyan", highlight=False)
    else:
        console.print(stopped_line(n_tokens, ttft), style="yellow", highlight=False)
    if final is not None or n_tokens:
        messages.append(split.message())
    else:
        messages.pop()


def draw(console: Console, segments: list[tuple[str, bool]]) -> None:
    for text, reasoning in segments:
        console.print(text, end="", style="dim" if reasoning else None, markup=False,
                      highlight=False, soft_wrap=True)  # fmt: skip
    console.file.flush()


def run(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    with console.status("loading the model..."):
        llm = open_llm(args)
    cfg = llm.engine_config
    if getattr(args, "model", None) is None:
        console.print(DEMO_BANNER)
    else:
        console.print(f"[bold]{escape(args.model)}[/]")
    console.print(
        f"[dim]{cfg.device}, {cfg.dtype}, up to {cfg.max_model_len} tokens, "
        f"prefix cache {'on' if cfg.prefix_reuse else 'off'}[/]"
    )
    console.print("[dim]Type a message; /help lists the commands.[/]")
    system, messages, interrupted = args.system, _fresh(args.system), False
    with serving(llm):
        while True:
            try:
                text = read_message(console)
            except (EOFError, KeyboardInterrupt) as exc:
                if isinstance(exc, EOFError) or interrupted:
                    console.print()
                    break
                interrupted = True
                console.print("\n[dim](Ctrl+C again or Ctrl+D to leave)[/]")
                continue
            interrupted = False
            command, _, rest = text.strip().partition(" ")
            if command in ("/exit", "/quit"):
                break
            if command == "/help":
                console.print(HELP, markup=False)
            elif command in ("/reset", "/system"):
                system = (rest.strip() or None) if command == "/system" else system
                messages = _fresh(system)
                what = "system prompt " + ("set" if system else "cleared") + "; new conversation"
                console.print(f"[dim]{'conversation reset' if command == '/reset' else what}[/]")
            elif command == "/stats":
                console.print(stats_table(llm.cache_stats()))
            elif command.startswith("/") and "/" not in command[1:]:  # not a path
                console.print(f"[red]unknown command {escape(command)}[/] (/help lists them)")
            elif text.strip():
                messages.append({"role": "user", "content": text})
                reply(console, llm, messages, args)
    console.print("[dim]bye[/]")
    return 0


def _fresh(system: str | None) -> list[dict]:
    return [{"role": "system", "content": system}] if system else []
