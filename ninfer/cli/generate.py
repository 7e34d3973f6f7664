"""`ninfer generate -i in.jsonl -o out.jsonl`: batch generation with a progress bar.

Pending lines are submitted to the engine together, up to `--max-in-flight` at a time (one
`LLM.stream` per line, each read on its own worker thread; the engine's FIFO admits them in
input order and batches them, so concurrency and cache reuse apply). Output lines are appended
and flushed as requests complete, so they come in completion order. Line formats:
`ninfer.cli.jsonl`. Re-running with the same output file skips every id already there (errors
included: delete a line to retry it). Ctrl+C cancels what is still running; what was written
stays.
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ninfer.cli.jsonl import Job, done_ids, error_record, id_key, output_record, read_jobs
from ninfer.cli.main import open_llm, serving


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--input", required=True, type=Path, help="input JSONL")
    p.add_argument("-o", "--output", required=True, type=Path, help="output JSONL (appended)")
    sampling = p.add_argument_group("default sampling (a line's own fields win)")
    sampling.add_argument("--max-tokens", type=int, default=argparse.SUPPRESS)
    sampling.add_argument("--temperature", type=float, default=argparse.SUPPRESS)
    sampling.add_argument("--top-p", type=float, default=argparse.SUPPRESS)
    p.add_argument("--max-in-flight", type=int, default=256,
                   help="lines submitted at a time (default 256)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    defaults = {k: getattr(args, k) for k in ("max_tokens", "temperature", "top_p") if k in args}
    jobs = read_jobs(args.input, defaults)
    done = done_ids(args.output)
    pending = [j for j in jobs if id_key(j.id) not in done]
    console = Console(stderr=True)
    if len(pending) < len(jobs):
        console.print(f"skipping {len(jobs) - len(pending)} ids already in {args.output}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    _end_torn_line(args.output)
    with open(args.output, "a", encoding="utf-8") as sink, _progress(console, args.quiet) as bar:
        task = bar.add_task("generate", total=len(pending), tps="", hit="")
        writer = _Writer(sink, bar, task)
        bad = [j for j in pending if j.error]
        for job in bad:
            writer.write(error_record(job.id, job.error))
        good = [j for j in pending if not j.error]
        if good:
            with serving(open_llm(args)) as llm:
                _run_streams(llm, good, writer, args.max_in_flight)
    console.print(
        f"{writer.done} lines written to {args.output} ({writer.errors} errors, "
        f"{len(jobs) - len(pending)} skipped)"
    )
    return 0


def _run_streams(llm, jobs: list[Job], writer: _Writer, max_in_flight: int) -> None:
    """One worker thread per line in flight; finished records reach the writer in this thread."""
    results: queue.Queue = queue.Queue()
    stop = threading.Event()
    slots = threading.Semaphore(max(1, max_in_flight))

    def worker(job: Job) -> None:
        try:
            stream = llm.stream(job.request, job.params, **job.chat_kwargs)
            final = None
            for event in stream:
                if stop.is_set():
                    stream.close()  # cancels the engine request
                    return
                final = event
            results.put(output_record(job.id, final))
        except Exception as exc:  # a request the engine refused: that line's error
            results.put(error_record(job.id, f"line {job.lineno}: {exc}"))
        finally:
            slots.release()

    def feeder() -> None:
        for job in jobs:
            slots.acquire()
            if stop.is_set():
                return
            threading.Thread(target=worker, args=(job,), daemon=True).start()

    threading.Thread(target=feeder, daemon=True).start()
    try:
        for _ in jobs:
            writer.write(results.get())
    except KeyboardInterrupt:
        stop.set()
        writer.bar.console.print("interrupted: running requests cancelled")
        raise SystemExit(130) from None


class _Writer:
    """Appends records, flushes each, and keeps the progress bar's figures."""

    def __init__(self, sink, bar: Progress, task) -> None:
        self.sink, self.bar, self.task = sink, bar, task
        self.done = self.errors = self.tokens = self.prompt = self.cached = 0
        self.start = bar.get_time()

    def write(self, rec: dict) -> None:
        self.sink.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self.sink.flush()
        self.done += 1
        self.errors += "error" in rec
        usage = rec.get("usage") or {}
        self.tokens += usage.get("completion_tokens", 0)
        self.prompt += usage.get("prompt_tokens", 0)
        self.cached += usage.get("cached_tokens", 0)
        elapsed = max(self.bar.get_time() - self.start, 1e-9)
        hit = f"cache hit {self.cached / self.prompt:.0%}" if self.prompt else ""
        self.bar.update(self.task, advance=1, tps=f"{self.tokens / elapsed:.1f} tok/s", hit=hit)


def _progress(console: Console, quiet: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tps]}"),
        TextColumn("{task.fields[hit]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
    )


def _end_torn_line(path: Path) -> None:
    """A run killed mid-write leaves a partial last line; start the next record on a new one."""
    if path.exists() and path.stat().st_size:
        with open(path, "rb+") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.write(b"\n")
