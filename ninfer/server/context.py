"""What every route shares: the served model, the driver, the metrics, the limits and the
worker threads (one `Serving` per app, the routes' FastAPI dependency), and the request
plumbing: size-limited JSON bodies, pydantic errors as API errors naming the field, disconnect
watching, sibling runs, SSE framing.

Every request is parsed by hand (size-limited body, strict JSON of bounded depth, pydantic
models) so every client mistake becomes its API's error JSON naming the field, never a 500.

The event loop serves every stream and /health, so work whose cost grows with what a client
sends runs on `Serving.offload`'s worker threads: parsing the body, rendering and tokenizing
the prompt, building a non-streamed response. A worker holds the GIL only in short slices: a
body larger than `_C_PARSE_BYTES` is parsed by the json module's pure-Python scanner (one C
call over a large body would hold the GIL, and stall the loop, for all of its length).

A streamed request is cancelled on the engine when its client disconnects (Starlette cancels
the response's iterator); a non-streamed one is watched for the disconnect while it waits.
"""

from __future__ import annotations

import asyncio
import json
import json.scanner
import math
import re
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from fastapi import Request
from pydantic import ValidationError

from ninfer.engine.outputs import is_engine_error
from ninfer.request import RequestOutput, SamplingParams, StreamDelta
from ninfer.server.driver import EngineDriver, Rendered
from ninfer.server.errors import ApiError, from_value_error
from ninfer.server.metrics import ServerMetrics

Batch = list[StreamDelta | RequestOutput]  # one `EngineDriver.run` batch

DEFAULT_MAX_BODY_BYTES = 8 << 20
MAX_JSON_DEPTH = 64  # arrays and objects inside each other; tool schemas need a dozen or so
WORKER_THREADS = 4
_C_PARSE_BYTES = 1 << 20  # bodies up to this size are parsed by one call of the C scanner


@dataclass(frozen=True, slots=True)
class Limits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = MAX_JSON_DEPTH


@dataclass(slots=True)
class Serving:
    driver: EngineDriver
    metrics: ServerMetrics
    model_name: str  # the first served name (the default in replies)
    limits: Limits = field(default_factory=Limits)
    # every name a client may send (`--served-model-name a b ...`); empty: `model_name` only
    model_names: tuple[str, ...] = ()
    # Qwen's thinking when a request does not say (None: the template's default). The demo
    # model's random weights think forever: it answers in `content` unless asked to think.
    thinking_default: bool | None = None
    workers: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="ninfer-http")
    )

    async def offload(self, fn: Callable, *args):
        """`fn(*args)` on a worker thread (its exceptions, ApiError included, raise here)."""
        return await asyncio.get_running_loop().run_in_executor(self.workers, partial(fn, *args))

    async def parse(self, request: Request, cls, defaults: dict | None = None):
        """The request body as the pydantic model `cls` (`defaults` fill absent fields)."""
        raw = await read_body(request, self.limits.max_body_bytes)
        return await self.offload(parse_body, raw, cls, self.limits.max_json_depth, defaults)

    @property
    def names(self) -> tuple[str, ...]:
        return self.model_names or (self.model_name,)

    def check_model(self, name: str) -> str:
        """The name the reply carries; 404 `model_not_found` for a model not served here."""
        if name not in self.names:
            served = ", ".join(repr(n) for n in self.names)
            raise ApiError(
                f"The model {name!r} does not exist (this server serves {served})",
                "model",
                status=404,
                code="model_not_found",
            )
        return name

    def template_kwargs(self, kwargs: dict) -> dict:
        """`chat_template_kwargs` with the server's thinking default where a request is silent."""
        if self.thinking_default is not None and "enable_thinking" not in kwargs:
            kwargs = {**kwargs, "enable_thinking": self.thinking_default}
        return kwargs

    def validate(
        self, rendered: Rendered, params: SamplingParams, field: str, structured: str | None = None
    ) -> SamplingParams:
        """The engine's checked copy of `params`; an ApiError naming the field otherwise (a
        structured output's compile error names `structured`, the wire field it came from)."""
        try:
            return self.driver.validate(rendered, params)
        except ValueError as e:
            text = str(e)
            if structured is not None and text.startswith("structured_outputs"):
                head, _, rest = text.partition(": ")
                raise ApiError(f"{structured}: {rest}", structured) from None
            raise from_value_error(e, field) from None

    async def _collect(self, rendered: Rendered, params: SamplingParams) -> RequestOutput:
        out = None
        async for batch in self.driver.run(rendered, params, stream=False):
            out = batch[-1]
        assert isinstance(out, RequestOutput)
        return out

    async def run_all(self, rendered: Rendered, plist: list[SamplingParams]) -> list:
        """Every sibling's final output (non-streamed); an ApiError if the engine failed one."""
        self.metrics.in_flight.inc(len(plist))
        try:
            outs = await asyncio.gather(*(self._collect(rendered, p) for p in plist))
        finally:
            self.metrics.in_flight.dec(len(plist))
        for out in outs:
            if out.finish_reason == "error":
                raise failure(out, "messages")
        return list(outs)

    def stream(
        self, rendered: Rendered, plist: list[SamplingParams]
    ) -> AsyncIterator[tuple[int, Batch]]:
        """(sibling index, batch) of every sibling, streamed."""
        return merge([self.driver.run(rendered, p, stream=True) for p in plist])


# ---- fields we do not implement ---------------------------------------------------------------
# A request field no route implements is accepted and ignored when it cannot change the output
# (as the APIs themselves ignore unknown fields: `user`, `store`, `metadata`, `service_tier`,
# ...). The fields below change the output; a request that sets one to anything but its no-op
# value is refused with a 400 naming it, never served as if it were absent. The one table: the
# route's kind -> {field: (its no-op values, why)}. (Structured outputs: `wire.py`.)
_NO = "not supported by this server"
_SAMPLING_EXTRAS: dict[str, tuple[tuple, str]] = {  # vLLM's extensions over both OpenAI routes
    "logit_bias": ((None, {}), _NO),
    "best_of": ((None, 1), _NO),
    "use_beam_search": ((None, False), _NO),
    "length_penalty": ((None, 1, 1.0), _NO),
    "repetition_penalty": ((None, 1, 1.0), _NO),
    "min_tokens": ((None, 0), _NO),
    "bad_words": ((None, []), _NO),
    "allowed_token_ids": ((None, []), _NO),
    "prompt_logprobs": ((None,), _NO),
    "return_tokens_as_token_ids": ((None, False), _NO),
    "truncate_prompt_tokens": ((None,), _NO),
    "include_stop_str_in_output": ((None, False), _NO),
    "skip_special_tokens": ((None, True), _NO),
    "spaces_between_special_tokens": ((None, True), _NO),
    "logits_processors": ((None, []), _NO),
    "guided_whitespace_pattern": ((None,), _NO + " (JSON is written without free whitespace)"),
}
REFUSED_FIELDS: dict[str, dict[str, tuple[tuple, str]]] = {
    "chat": {
        **_SAMPLING_EXTRAS,
        "functions": ((None, []), _NO + " (use tools)"),
        "function_call": ((None, "none", "auto"), _NO + " (use tool_choice)"),
        "audio": ((None,), _NO),
        "modalities": ((None, ["text"]), _NO),
        "prediction": ((None,), _NO),
        "web_search_options": ((None,), _NO),
        "verbosity": ((None,), _NO),
        "moderation": ((None,), _NO),
        "echo": ((None, False), _NO),
        "add_generation_prompt": ((None, True), _NO),
        "continue_final_message": ((None, False), _NO),
        "chat_template": ((None,), _NO),
        "documents": ((None, []), _NO),
    },
    "completions": {
        **_SAMPLING_EXTRAS,
        "suffix": ((None, ""), _NO),
        "prompt_embeds": ((None,), _NO),
    },
    "messages": {
        "mcp_servers": ((None, []), _NO),
        "container": ((None,), _NO),
        "context_management": ((None,), _NO),
    },
}


def refuse_unimplemented(req, kind: str) -> None:
    """A 400 naming the first field of `REFUSED_FIELDS[kind]` that `req` sets to a value that
    would change the output (`req`: a parsed request, its unknown fields in `model_extra`)."""
    fields = {**(req.model_extra or {}), **{k: getattr(req, k) for k in type(req).model_fields}}
    for name, (noops, why) in REFUSED_FIELDS[kind].items():
        value = fields.get(name)
        if not any(_same(value, v) for v in noops):
            raise ApiError(f"{name}: {why}", name)


def _same(value, noop) -> bool:
    """`value` is the no-op value `noop` (1 and 1.0 alike; False is not 0, nor 1 True)."""
    number = (int, float)
    if isinstance(value, number) and isinstance(noop, number):
        return isinstance(value, bool) == isinstance(noop, bool) and value == noop
    return type(value) is type(noop) and value == noop


def serving(request: Request) -> Serving:
    """The routes' dependency: the app's `Serving`."""
    return request.app.state.serving


def sse(data: dict | str, event: str | None = None) -> str:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return (f"event: {event}\n" if event else "") + f"data: {text}\n\n"


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to pass `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(f"the request body is over {limit} bytes", "body", status=413)
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise ApiError(f"the request body is over {limit} bytes", "body", status=413)
    return bytes(body)


def parse_body(raw: bytes, cls, max_depth: int, defaults: dict | None = None):
    """A JSON object body as the pydantic model `cls` (a worker's job: see the docstring)."""
    data = decode_json(raw, max_depth)
    return parse_model(cls, {**defaults, **data} if defaults else data)


def _not_json(name: str):
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} is out of range")
    return value


# A lone surrogate can only come from an escape (the body is decoded strictly): a body without
# one needs no look at its strings.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_C_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)
_PY_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)
_PY_DECODER.scan_once = json.scanner.py_make_scanner(_PY_DECODER)  # type: ignore[attr-defined]


def decode_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict:
    """Strict JSON (no NaN or Infinity, no number beyond a float) of one object, nested at
    most `max_depth` deep; ApiError naming the body otherwise."""
    try:
        text = raw.decode(json.detect_encoding(raw))
        decoder = _C_DECODER if len(raw) <= _C_PARSE_BYTES else _PY_DECODER
        data = decoder.decode(text)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError included
        raise ApiError(f"the request body is not valid JSON ({e})", "body") from None
    if not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object", "body")
    if not _within_depth(data, max_depth):
        raise _too_deep(max_depth)
    if _SURROGATE_ESCAPE.search(text) and not _all_unicode(data):
        raise ApiError("the request body has a lone surrogate escape: not Unicode text", "body")
    return data


def _all_unicode(data) -> bool:
    """Every string and key encodes as UTF-8 (no half of a surrogate pair)."""
    stack = [data]
    while stack:
        node = stack.pop()
        items = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        for item in items:
            if isinstance(item, str):
                try:
                    item.encode()
                except UnicodeEncodeError:
                    return False
            elif isinstance(item, (dict, list)):
                stack.append(item)
    return True


def _too_deep(max_depth: int) -> ApiError:
    return ApiError(f"the request body nests arrays and objects over {max_depth} deep", "body")


def parse_model(cls, data: dict):
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(f"{where}: {first['msg']}", where) from None


def _within_depth(data, limit: int) -> bool:
    level = [data]
    for _ in range(limit):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))
        ]
        if not level:
            return True
    return False


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def or_disconnect(request: Request, work):
    """Await `work` (a coroutine); if the client disconnects first, cancel it (which cancels
    its engine jobs) and answer nothing."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()  # it ends at its next step; the client is gone, nobody reads it
    if not task.done() or task.cancelled():
        raise asyncio.CancelledError
    return task.result()


async def merge(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """(choice index, item) from several runs; cancelling the consumer cancels them all."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(i: int, stream: AsyncIterator) -> None:
        try:
            async for item in stream:
                await queue.put((i, item))
        finally:
            await queue.put((i, end))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            i, item = await queue.get()
            if item is end:
                left -= 1
                continue
            yield i, item
    finally:
        for t in tasks:
            t.cancel()


def failure(out: RequestOutput, field: str) -> ApiError:
    """A request the engine answered with an error: the engine's own fault is a 500, anything
    else (a prompt the cache cannot hold, ...) is the request's."""
    if is_engine_error(out):
        return ApiError(out.error or "engine failure", None, status=500, kind="api_error")
    return from_value_error(ValueError(out.error or "the request failed"), field)
