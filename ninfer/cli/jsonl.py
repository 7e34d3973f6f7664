"""The JSONL formats of `ninfer generate`: input lines to requests, outputs to lines.

Input line: an object with exactly one of `prompt` (str), `prompt_token_ids` (list of int) or
`messages` (list of {"role", "content", ...}); optional `id` (default: the 1-based line
number), `cache_breakpoints` (prompts), `tools` and `enable_thinking` (messages), and any
SamplingParams field (max_tokens, temperature, top_p, top_k, min_p, seed, stop, stop_token_ids,
ignore_eos, logprobs). Other keys are ignored. A line that cannot become a request gets an
`error` instead of a request; nothing here raises on bad input.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ninfer.request import RequestOutput, SamplingParams

SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))
INPUT_KINDS = ("prompt", "prompt_token_ids", "messages")


@dataclass(slots=True)
class Job:
    id: Any
    lineno: int = 0
    request: Any = None  # a prompt dict for LLM.stream, or a list of messages
    params: SamplingParams | None = None
    chat_kwargs: dict = field(default_factory=dict)
    error: str | None = None


def id_key(job_id: Any) -> str:
    """Ids compare by their JSON text, so 7 and "7" stay distinct."""
    return json.dumps(job_id, sort_keys=True)


def parse_line(lineno: int, text: str, defaults: dict[str, Any]) -> Job:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return Job(lineno, lineno, error=f"line {lineno}: invalid JSON: {exc.msg}")
    if not isinstance(obj, dict):
        return Job(lineno, lineno, error=f"line {lineno}: expected a JSON object")
    job = Job(obj.get("id", lineno), lineno)
    job.error = _fill(job, obj, defaults)
    if job.error:
        job.error = f"line {lineno}: {job.error}"
    return job


def _fill(job: Job, obj: dict, defaults: dict[str, Any]) -> str | None:
    """Sets job.request / params / chat_kwargs; returns an error message or None."""
    kinds = [k for k in INPUT_KINDS if k in obj]
    if len(kinds) != 1:
        return f"needs exactly one of {', '.join(INPUT_KINDS)} (got {kinds or 'none'})"
    kind, value = kinds[0], obj[kinds[0]]
    if kind == "prompt" and not (isinstance(value, str) and value):
        return "prompt must be a non-empty string"
    if kind == "prompt_token_ids" and not (
        isinstance(value, list) and value and all(type(t) is int for t in value)
    ):
        return "prompt_token_ids must be a non-empty list of integers"
    if kind == "messages":
        if not (isinstance(value, list) and value and all(_is_message(m) for m in value)):
            return 'messages must be a non-empty list of {"role": str, "content": ...} objects'
        job.request = value
        job.chat_kwargs = {k: obj[k] for k in ("tools", "enable_thinking") if k in obj}
    else:
        job.request = {kind: value}
        if "cache_breakpoints" in obj:
            job.request["cache_breakpoints"] = obj["cache_breakpoints"]
    sampling = {**defaults, **{k: v for k, v in obj.items() if k in SAMPLING_FIELDS}}
    try:
        job.params = SamplingParams(**sampling)
        job.params.validate()
    except (TypeError, ValueError) as exc:
        return f"bad sampling parameters: {exc}"
    return None


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m


def output_record(job_id: Any, out: RequestOutput) -> dict:
    rec = {
        "id": job_id,
        "text": out.text,
        "token_ids": list(out.token_ids),
        "finish_reason": out.finish_reason,
        "usage": dataclasses.asdict(out.usage),
        "metrics": dataclasses.asdict(out.metrics),
    }
    if out.error:
        rec["error"] = out.error
    if out.logprobs is not None:
        rec["logprobs"] = out.logprobs
    return rec


def error_record(job_id: Any, message: str) -> dict:
    return {"id": job_id, "finish_reason": "error", "error": message}


def done_ids(path: Path) -> set[str]:
    """Ids (as id_key) of the lines already in an output file; a torn last line is ignored."""
    if not path.exists():
        return set()
    done = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "id" in rec:
                done.add(id_key(rec["id"]))
    return done


def read_jobs(path: Path, defaults: dict[str, Any]) -> list[Job]:
    """Every non-blank input line as a Job; a repeated id becomes an error."""
    jobs, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            job = parse_line(lineno, line, defaults)
            key = id_key(job.id)
            if key in seen and job.error is None:
                job.error = f"line {lineno}: duplicate id {job.id!r}"
            seen.add(key)
            jobs.append(job)
    return jobs
