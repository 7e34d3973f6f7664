"""The JSONL formats of `ninfer generate`: input lines to requests, outputs to lines.

Input line: an object with exactly one of `prompt` (str), `prompt_token_ids` (list of int) or
`messages` (list of {"role", "content", ...}); optional `id` (a string or an integer; default:
the 1-based line number), `cache_breakpoints` (prompts), `tools` and `enable_thinking`
(messages), and any SamplingParams field (max_tokens, temperature, top_p, top_k, min_p, seed,
stop, stop_token_ids, ignore_eos, logprobs, thinking_token_budget, structured_outputs as
vLLM's object: {"json": schema} | {"regex": ...} | {"choice": [...]} | {"grammar": ...} |
{"json_object": true}), or OpenAI's `response_format` ({"type": "json_schema", "json_schema":
{"schema": ...}} | {"type": "json_object"}). A key outside these is an error on that line (a
misspelled field must not be ignored), and so is a value of the wrong type, named with the type
it needs. A line that cannot become a request gets an `error` instead of a request; nothing
here raises on bad input.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ninfer.request import MAX_SEED, RequestOutput, SamplingParams, StructuredOutputsParams

SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))
INPUT_KINDS = ("prompt", "prompt_token_ids", "messages")
OTHER_FIELDS = ("id", "cache_breakpoints", "tools", "enable_thinking", "response_format")
KNOWN_FIELDS = (*INPUT_KINDS, *OTHER_FIELDS, *SAMPLING_FIELDS)


def _int(v: Any) -> bool:
    return type(v) is int  # JSON true/false are bools, not counts


def _number(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(_int(x) for x in v)


# field -> (accepts the JSON value, what it must be); range checks are SamplingParams.validate's
FIELD_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "id": (lambda v: isinstance(v, str) or _int(v), "a string or an integer"),
    "cache_breakpoints": (_ints, "a list of integers"),
    "tools": (
        lambda v: isinstance(v, list) and all(isinstance(t, dict) for t in v),
        "a list of objects",
    ),  # fmt: skip
    "enable_thinking": (lambda v: isinstance(v, bool), "true or false"),
    "max_tokens": (_int, "an integer"),
    "temperature": (_number, "a finite number"),
    "top_p": (_number, "a finite number"),
    "top_k": (_int, "an integer"),
    "min_p": (_number, "a finite number"),
    "seed": (
        lambda v: v is None or (_int(v) and 0 <= v <= MAX_SEED),
        "an integer from 0 to 2**64-1, or null",
    ),  # fmt: skip
    "stop": (
        lambda v: (
            v is None
            or isinstance(v, str)
            or (isinstance(v, list) and all(isinstance(s, str) for s in v))
        ),
        "a string or a list of strings",
    ),  # fmt: skip
    "stop_token_ids": (lambda v: v is None or _ints(v), "a list of integers"),
    "ignore_eos": (lambda v: isinstance(v, bool), "true or false"),
    "logprobs": (lambda v: v is None or _int(v), "an integer (top-k per token) or null"),
    "thinking_token_budget": (lambda v: v is None or _int(v), "an integer or null"),
}


@dataclass(slots=True)
class LineJob:
    id: Any
    lineno: int = 0
    request: Any = None  # a prompt dict for LLM.stream, or a list of messages
    params: SamplingParams | None = None
    chat_kwargs: dict = field(default_factory=dict)
    error: str | None = None
    duplicate: bool = False  # a repeated id: its error record carries no id (see read_jobs)
    structured_field: str | None = None  # the line's field a structured output came from

    def engine_error(self, exc: Exception) -> str:
        """The error text of a request the engine refused, naming the line's own field where
        the engine names `structured_outputs` for a `response_format` line."""
        text = str(exc)
        if self.structured_field and text.startswith("structured_outputs"):
            text = f"{self.structured_field}: {text.partition(': ')[2]}"
        return f"line {self.lineno}: {text}"


def id_key(job_id: Any) -> str:
    """Ids compare by their JSON text, so 7 and "7" stay distinct."""
    return json.dumps(job_id, sort_keys=True)


def _json_type(v: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}  # fmt: skip
    return names.get(type(v), type(v).__name__)


def _short(v: Any) -> str:
    text = json.dumps(v, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def unknown_field_error(name: str) -> str:
    close = difflib.get_close_matches(name, KNOWN_FIELDS, n=1)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    return f'unknown field "{name}"{hint}; known fields: {", ".join(KNOWN_FIELDS)}'


def check_types(obj: dict) -> str | None:
    """The first unknown key or ill-typed value of an input object, as an error message."""
    for name in obj:
        if name not in KNOWN_FIELDS:
            return unknown_field_error(name)
    for name, value in obj.items():
        accepts, expected = FIELD_TYPES.get(name, (None, ""))
        if accepts is not None and not accepts(value):
            return f'"{name}" must be {expected}, got {_short(value)} ({_json_type(value)})'
    return None


def parse_line(lineno: int, text: str, defaults: dict[str, Any]) -> LineJob:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return LineJob(lineno, lineno, error=f"line {lineno}: invalid JSON: {exc.msg}")
    if not isinstance(obj, dict):
        return LineJob(lineno, lineno, error=f"line {lineno}: expected a JSON object")
    job_id = obj.get("id", lineno)
    if not FIELD_TYPES["id"][0](job_id):
        job_id = lineno  # the record of a bad id is keyed by its line
    job = LineJob(job_id, lineno)
    job.error = check_types(obj) or _fill(job, obj, defaults)
    if job.error:
        job.error = f"line {lineno}: {job.error}"
    return job


def _fill(job: LineJob, obj: dict, defaults: dict[str, Any]) -> str | None:
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
        for name in ("tools", "enable_thinking"):
            if name in obj:
                return f'"{name}" applies to "messages" lines only'
        job.request = {kind: value}
        if "cache_breakpoints" in obj:
            job.request["cache_breakpoints"] = obj["cache_breakpoints"]
    if kind == "messages" and "cache_breakpoints" in obj:
        return '"cache_breakpoints" applies to "prompt" and "prompt_token_ids" lines only'
    sampling = {**defaults, **{k: v for k, v in obj.items() if k in SAMPLING_FIELDS}}
    try:
        if "response_format" in obj and "structured_outputs" in obj:
            return 'set "response_format" or "structured_outputs", not both'
        if "response_format" in obj:
            spec = StructuredOutputsParams.from_response_format(obj["response_format"])
            sampling["structured_outputs"] = spec
            if spec is not None:
                schema = "" if spec.json_object else ".json_schema.schema"
                job.structured_field = "response_format" + schema
        elif sampling.get("structured_outputs") is not None:
            so = StructuredOutputsParams.from_dict(sampling["structured_outputs"])
            sampling["structured_outputs"] = so
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


def error_record(job: LineJob, message: str) -> dict:
    """The record of a line that failed. A repeated id's record has `"id": null` and the line
    number, so the output never holds two records under one id."""
    return {"id": None if job.duplicate else job.id, "line": job.lineno,
            "finish_reason": "error", "error": message}  # fmt: skip


def is_done(rec: Any) -> bool:
    """An output record that a re-run keeps: finished without an error."""
    return (
        isinstance(rec, dict)
        and "id" in rec
        and rec["id"] is not None
        and "error" not in rec
        and rec.get("finish_reason") in ("stop", "length")
    )


def read_output(path: Path) -> tuple[list[str], int]:
    """The finished lines of an existing output file (kept verbatim) and how many other lines
    it has (errors, aborts, a torn last line): a re-run drops those and retries their ids."""
    if not path.exists():
        return [], 0
    kept, dropped = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                rec = None
            if is_done(rec):
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                dropped += 1
    return kept, dropped


def done_ids(lines: list[str]) -> set[str]:
    """Ids (as id_key) of finished output lines (from read_output)."""
    return {id_key(json.loads(line)["id"]) for line in lines}


def read_jobs(path: Path, defaults: dict[str, Any]) -> list[LineJob]:
    """Every non-blank input line as a LineJob; a repeated id becomes an error on the repeat."""
    jobs, first_line = [], {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                job = parse_line(lineno, raw.decode("utf-8"), defaults)
            except UnicodeDecodeError as exc:
                job = LineJob(lineno, lineno, error=f"line {lineno}: not UTF-8 text ({exc.reason})")
            key = id_key(job.id)
            if key in first_line:
                job.duplicate = True
                job.error = (
                    f"line {lineno}: duplicate id {_short(job.id)} (first on line "
                    f"{first_line[key]}); this line was not run"
                )
            else:
                first_line[key] = lineno
            jobs.append(job)
    return jobs
