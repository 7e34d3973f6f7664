"""`ninfer chat`: an interactive terminal chat over `LLM.stream`.

Ctrl+C during a reply stops it: the stream is closed (which cancels the engine request) and the
partial reply is kept as the assistant message, so the history shows what was seen; a reply
stopped before its first token is dropped together with its user message. Ctrl+C twice at the
prompt, Ctrl+D or /exit leaves. Input lines are kept across runs (`terminal.history_file`).
"""

from __future__ import annotations

import argparse
import contextlib
import time

from rich.console import Console
from rich.markup import escape

from ninfer.cli.args import positive_int, temperature, top_p
from ninfer.cli.chat_view import ReasoningSplitter, reuse_note, stats_table, stopped_line, turn_line
from ninfer.cli.main import open_llm, serving
from ninfer.cli.terminal import LineEditor, StopOnInterrupt, err_console, history_file

HELP = """\
/help           this text
/reset          forget the conversation (the system prompt stays)
/system TEXT    set the system prompt and start over (/system alone clears it)
/stats          prefix cache: a summary line, then the figures of each tier
/image PATH     attach an image to your next message (a model with a vision tower)
/exit           leave (also Ctrl+D, or Ctrl+C twice at the prompt)
Up / Down recall earlier messages (kept across runs), Ctrl+R searches them.
Multi-line input: end a line with \\ to continue it, or put \"\"\" alone on a line to open and
close a block (Alt+Enter also starts a new line). Ctrl+C during a reply stops it; the partial
reply is kept in the history."""

DEMO_BANNER = (
    "[bold yellow]Demo model:[/] random weights, so its text is noise. "
    "It exercises the engine and the cache; pass [bold]--model PATH[/] for a real checkpoint."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=temperature, default=0.7, help="0 is greedy (default 0.7)")
    p.add_argument("--top-p", type=top_p, default=0.95, help="nucleus sampling (default 0.95)")
    p.add_argument("--max-tokens", type=positive_int, default=None,
                   help="reply length cap (default 512; 128 on the demo model)")  # fmt: skip
    p.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=None,
                   help="the reasoning block (default: on; off on the demo model, whose "
                   "reasoning would be noise the template drops)")  # fmt: skip
    p.add_argument(
        "--system",
        default=None,
        help='system prompt (default: none; the demo model has its own; "" for none)',
    )


def settings(args: argparse.Namespace) -> tuple[bool, int, str | None]:
    """(thinking, max_tokens, system prompt) with the demo model's defaults where not given."""
    demo = getattr(args, "model", None) is None
    from ninfer.demo import DEMO_MAX_TOKENS, DEMO_SYSTEM_PROMPT

    thinking = args.thinking if args.thinking is not None else not demo
    max_tokens = args.max_tokens or (DEMO_MAX_TOKENS if demo else 512)
    system = args.system if args.system is not None else (DEMO_SYSTEM_PROMPT if demo else None)
    return thinking, max_tokens, system or None


class Chat:
    def __init__(self, console: Console, llm, args: argparse.Namespace) -> None:
        self.console, self.llm, self.args = console, llm, args
        self.thinking, self.max_tokens, self.system = settings(args)
        self.cache_on = llm.engine_config.cache.prefix_reuse
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.previous: list[int] | None = None  # the previous turn's prompt and reply tokens
        self.attached: list = []  # decoded images for the next user message (/image)

    def attach(self, path: str) -> str:
        """`/image PATH`: decode the image now (so a bad file is said at once) and keep it for
        the next user message; the line to print (markup), also when nothing was attached."""
        from ninfer.vision.media import decode_image

        if not self.llm.supports_images:
            return (
                "[yellow]this model takes no images (it has no vision tower); "
                "the conversation goes on without it[/]"
            )
        path = path.strip().strip("'\"")
        if not path:
            return "[red]/image needs a path[/] (/image PATH)"
        try:
            image = decode_image(path, "/image", local_files=True)
        except ValueError as exc:
            return f"[red]{escape(str(exc))}[/]"
        self.attached.append(image)
        n = len(self.attached)
        return (
            f"[dim]image attached ({image.width}x{image.height}); "
            f"{n} will go with your next message[/]"
        )

    def add_user(self, text: str) -> None:
        """The user message: `text` after the attached images, which it takes."""
        if not self.attached:
            self.messages.append({"role": "user", "content": text})
            return
        parts = [{"type": "image", "image": image} for image in self.attached]
        self.messages.append({"role": "user", "content": [*parts, {"type": "text", "text": text}]})
        self.attached = []

    def reply(self) -> None:
        """Streams one reply into the console and appends it to `messages` (see module doc)."""
        from ninfer.request import SamplingParams

        params = SamplingParams(
            max_tokens=self.max_tokens, temperature=self.args.temperature, top_p=self.args.top_p
        )
        console, split = self.console, ReasoningSplitter(thinking=self.thinking)
        before = self.llm.speculation_stats()
        start, ttft, n_tokens, final = time.perf_counter(), None, 0, None
        try:
            stream = self.llm.stream(self.messages, params, enable_thinking=self.thinking)
            with StopOnInterrupt() as interrupt, contextlib.closing(stream):
                for event in stream:
                    if interrupt.hit and not interrupt.acted:
                        # cancel, then read on to the final "abort" output (prompt and cache
                        # figures); nothing more is drawn
                        self.llm.cancel(stream.request_id)
                        interrupt.acted = True
                    if not hasattr(event, "finish_reason"):  # a StreamDelta
                        if interrupt.hit:
                            continue
                        ttft = ttft if ttft is not None else time.perf_counter() - start
                        n_tokens += len(event.token_ids)
                        draw(console, split.feed(event.text))
                    else:
                        final = event
        except KeyboardInterrupt:  # a second Ctrl+C before the engine answered: stop anyway
            pass
        except (ValueError, RuntimeError) as exc:  # refused (too long) or failed by the engine
            console.print(f"\n[red]error: {escape(str(exc))}[/]")
            self.messages.pop()
            return
        draw(console, split.flush())
        console.print()
        stopped = final is None or final.finish_reason == "abort"
        if not stopped:
            note = reuse_note(final, self.previous, self.cache_on)
            spec = None if before is None else self.llm.speculation_stats().since(before)
            line = turn_line(final, note, spec)
            console.print(line, style="cyan", highlight=False, soft_wrap=True)
        else:
            line = stopped_line(n_tokens, ttft, final)
            console.print(line, style="yellow", highlight=False, soft_wrap=True)
        if not stopped or n_tokens:  # a stopped reply is kept as far as it was seen
            self.messages.append(split.message())
            self.previous = [] if final is None else [*final.prompt_token_ids, *final.token_ids]
        else:
            self.messages.pop()


def draw(console: Console, segments: list[tuple[str, bool]]) -> None:
    for text, reasoning in segments:
        console.print(text, end="", style="dim" if reasoning else None, markup=False,
                      highlight=False, soft_wrap=True)  # fmt: skip
    console.file.flush()


def run(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    editor = LineEditor(history_file())
    with err_console().status("loading the model..."):  # the log lines print above it
        llm = open_llm(args)
    chat = Chat(console, llm, args)
    cfg = llm.engine_config.memory
    if getattr(args, "model", None) is None:
        console.print(DEMO_BANNER)
    else:
        console.print(f"[bold]{escape(args.model)}[/]")
    console.print(
        f"[dim]{cfg.device}, {cfg.dtype}, up to {cfg.max_model_len} tokens, "
        f"prefix cache {'on' if chat.cache_on else 'off'}, "
        f"thinking {'on' if chat.thinking else 'off'}, replies up to {chat.max_tokens} tokens"
        f"{', system prompt set (/system to change)' if chat.system else ''}[/]"
    )
    console.print("[dim]Type a message; /help lists the commands.[/]")
    interrupted = False
    with serving(llm):
        while True:
            try:
                text = editor.read()
            except (EOFError, KeyboardInterrupt) as exc:
                if isinstance(exc, EOFError) or interrupted:
                    console.print()
                    break
                interrupted = True
                console.print("[dim](Ctrl+C again or Ctrl+D to leave)[/]")
                continue
            interrupted = False
            command, _, rest = text.strip().partition(" ")
            if command in ("/exit", "/quit"):
                break
            if command == "/help":
                console.print(HELP, markup=False)
            elif command in ("/reset", "/system"):
                if command == "/system":
                    chat.system = rest.strip() or None
                chat.reset()
                what = "system prompt " + ("set" if chat.system else "cleared")
                what = "conversation reset" if command == "/reset" else what + "; new conversation"
                console.print(f"[dim]{what}[/]")
            elif command == "/stats":
                console.print(stats_table(llm.cache_stats(), cfg))
            elif command == "/image":
                console.print(chat.attach(rest))
            elif command.startswith("/") and "/" not in command[1:]:  # not a path
                console.print(f"[red]unknown command {escape(command)}[/] (/help lists them)")
            elif text.strip():
                chat.add_user(text)
                chat.reply()
    console.print("[dim]bye[/]")
    return 0
