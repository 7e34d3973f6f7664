"""`ninfer generate -i in.jsonl -o out.jsonl`: batch generation with a progress bar.

Pending lines are submitted to the engine together, up to `--max-in-flight` at a time (one
`LLM.stream` per line, each read on its own worker thread; the engine's FIFO admits them in
input order and batches them, so concurrency and cache reuse apply). Output lines are appended
and flushed as requests complete, so they come in completion order. Line formats:
`ninfer.cli.jsonl`.

Re-running with the same output file keeps every finished record and skips its id; records that
failed (an `error`), were cut off or were torn by a killed run are removed first and their lines
run again, so a finished file holds one record per id. `-o -` writes to standard output (no
resume). The output's folder must exist. Exit status 1 when a line failed. Ctrl+C cancels
what is still running; what was written stays, and the count of lines written is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import tempfile
import threading
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ninfer.cli.args import positive_int, temperature, top_p
from ninfer.cli.jsonl import (
    LineJob,
    done_ids,
    error_record,
    id_key,
    is_done,
    output_record,
    read_jobs,
    read_output,
)
from ninfer.cli.main import open_llm, serving
from ninfer.cli.terminal import err_console


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--input", required=True, type=Path, help="input JSONL")
    p.add_argument("-o", "--output", required=True, metavar="OUTPUT",
                   help="output JSONL: finished lines are kept and skipped, failed ones run "
                   "again; - writes to standard output")  # fmt: skip
    sampling = p.add_argument_group("default sampling (a line's own fields win)")
    sampling.add_argument("--max-tokens", type=positive_int, default=argparse.SUPPRESS,
                          help="reply length cap (default 256)")  # fmt: skip
    sampling.add_argument("--temperature", type=temperature, default=argparse.SUPPRESS,
                          help="0 is greedy (default 1.0)")  # fmt: skip
    sampling.add_argument("--top-p", type=top_p, default=argparse.SUPPRESS,
                          help="nucleus sampling, in (0, 1] (default 1.0)")  # fmt: skip
    p.add_argument("--max-in-flight", type=positive_int, default=256,
                   help="lines submitted at a time (default 256)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    output = _output_path(args)
    jobs = _jobs(args)
    console = err_console()
    pending = _unfinished(jobs, output, console)
    skipped = len(jobs) - len(pending)
    sink = sys.stdout if output is None else open(output, "a", encoding="utf-8")  # noqa: SIM115
    where = "standard output" if output is None else str(output)
    writer = None
    try:
        with _progress(args.quiet) as bar:
            task = bar.add_task("generate", total=len(pending), tps="", hit="")
            writer = _Writer(sink, bar, task)
            for job in pending:
                if job.error:
                    writer.write(error_record(job, job.error))
            good = [j for j in pending if not j.error]
            if good:
                with serving(open_llm(args)) as llm:
                    _run_streams(llm, good, writer, args.max_in_flight)
    except KeyboardInterrupt:
        written = 0 if writer is None else writer.done
        resume = "" if output is None else "; a re-run with the same -o goes on from there"
        console.print(
            f"interrupted: running requests cancelled; {written} lines written to {where}{resume}",
            highlight=False,
        )
        return 130
    finally:
        if sink is not sys.stdout:
            sink.close()
    summary = f"{writer.done} lines written to {where}: {writer.done - writer.errors} finished"
    if writer.errors:
        summary += f', {writer.errors} failed (see their "error")'
        if output is not None:
            summary += "; a re-run retries them"
    if skipped:
        summary += f"; {skipped} skipped (already finished)"
    console.print(summary, highlight=False, style="red" if writer.errors else None)
    return 1 if writer.errors else 0


def _output_path(args: argparse.Namespace) -> Path | None:
    """-o as a path (None for standard output), refused before any work if it cannot be."""
    output = None if args.output == "-" else Path(args.output)
    if output is not None and output.is_dir():
        raise ValueError(f"-o {output}: is a directory; give a file path (or - for stdout)")
    if output is not None and not output.parent.is_dir():
        raise ValueError(f"-o {output}: directory {str(output.parent)!r} does not exist")
    return output


def _jobs(args: argparse.Namespace) -> list[LineJob]:
    """The input's lines, the command line's sampling as their defaults."""
    if args.input.is_dir():
        raise ValueError(f"-i {args.input}: is a directory; give a JSONL file")
    defaults = {k: getattr(args, k) for k in ("max_tokens", "temperature", "top_p") if k in args}
    jobs = read_jobs(args.input, defaults)
    if getattr(args, "model", None) is None:  # the demo model answers without thinking
        for job in jobs:
            if isinstance(job.request, list):  # a "messages" line
                job.chat_kwargs.setdefault("enable_thinking", False)
    return jobs


def _unfinished(jobs: list[LineJob], output: Path | None, console) -> list[LineJob]:
    """The jobs `output` does not hold finished; its failed or torn records are removed."""
    kept, dropped = read_output(output) if output is not None else ([], 0)
    done = done_ids(kept)
    pending = [j for j in jobs if j.duplicate or id_key(j.id) not in done]
    skipped = len(jobs) - len(pending)
    if skipped:
        console.print(f"skipping {skipped} lines already finished in {output}", highlight=False)
    if dropped:
        _rewrite(output, kept)
        console.print(f"retrying: removed {dropped} failed or unfinished records from {output}",
                      highlight=False)  # fmt: skip
    return pending


def _rewrite(path: Path, kept: list[str]) -> None:
    """Replaces `path` by its finished lines (atomically: a kill leaves the old or the new)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(kept)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _run_streams(llm, jobs: list[LineJob], writer: _Writer, max_in_flight: int) -> None:
    """One worker thread per line in flight; finished records reach the writer in this thread."""
    results: queue.Queue = queue.Queue()
    stop = threading.Event()
    slots = threading.Semaphore(max(1, max_in_flight))

    def worker(job: LineJob) -> None:
        try:
            stream = llm.stream(job.request, job.params, **job.chat_kwargs)
            final = None
            for event in stream:
                if stop.is_set():
                    stream.close()  # cancels the engine request
                    return
                final = event
            if final is None or not hasattr(final, "finish_reason"):
                results.put(error_record(job, f"line {job.lineno}: the stream ended early"))
            else:
                results.put(output_record(job.id, final))
        except Exception as exc:  # a request the engine refused: that line's error
            results.put(error_record(job, job.engine_error(exc)))
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
        stop.set()  # the workers cancel their requests; `run` says what was written
        raise


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
        self.errors += not is_done(rec)
        usage = rec.get("usage") or {}
        self.tokens += usage.get("completion_tokens", 0)
        self.prompt += usage.get("prompt_tokens", 0)
        self.cached += usage.get("cached_tokens", 0)
        elapsed = max(self.bar.get_time() - self.start, 1e-9)
        hit = f"cache hit {self.cached / self.prompt:.0%}" if self.prompt else ""
        self.bar.update(self.task, advance=1, tps=f"{self.tokens / elapsed:.1f} tok/s", hit=hit)


def _progress(quiet: bool) -> Progress:
    """On the shared stderr console, so the engine's log lines print above the bar."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tps]}"),
        TextColumn("{task.fields[hit]}"),
        TimeElapsedColumn(),
        console=err_console(),
        disable=quiet,
        redirect_stdout=False,  # stdout may be the output (-o -)
    )
