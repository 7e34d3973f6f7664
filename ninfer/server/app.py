"""The HTTP routes: OpenAI chat/completions/models, Anthropic messages, health and metrics.

Every request is parsed by hand (size-limited body, pydantic models) so every client mistake
becomes its API's error JSON naming the field, never a 500. A streamed request is cancelled on
the engine when its client disconnects (Starlette cancels the response's iterator); a
non-streamed one is watched for the disconnect while it waits.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from ninfer.engine.outputs import is_engine_error
from ninfer.request import RequestOutput, StreamDelta
from ninfer.server import anthropic_api as anth
from ninfer.server import openai_api as oai
from ninfer.server.common import check_n, new_id, now, sampling_params, siblings
from ninfer.server.driver import EngineDriver, Rendered
from ninfer.server.errors import ApiError, anthropic_body, from_value_error, openai_body
from ninfer.server.metrics import ServerMetrics
from ninfer.server.tool_calls import OutputParser, Text, parse_text, tool_schemas

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 32 << 20


def _is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def _error_response(path: str, err: ApiError) -> JSONResponse:
    body = anthropic_body(err) if _is_anthropic(path) else openai_body(err)
    return JSONResponse(body, status_code=err.status)


def _sse(data: dict | str, event: str | None = None) -> str:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return (f"event: {event}\n" if event else "") + f"data: {text}\n\n"


async def _read_json(request: Request, limit: int) -> dict:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(f"the request body is over {limit} bytes", "body", status=413)
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise ApiError(f"the request body is over {limit} bytes", "body", status=413)
    try:
        data = json.loads(body)
    except ValueError as e:
        raise ApiError(f"the request body is not valid JSON ({e})", "body") from None
    if not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object", "body")
    return data


def _model(cls, data: dict):
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(f"{where}: {first['msg']}", where) from None


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _or_disconnect(request: Request, work):
    """Await `work` (a coroutine); if the client disconnects first, cancel it (which cancels
    its engine jobs) and answer nothing."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        raise asyncio.CancelledError
    return task.result()


async def _merge(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """(choice index, event) from several runs; cancelling the consumer cancels them all."""
    if len(streams) == 1:
        async for event in streams[0]:
            yield 0, event
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(i: int, stream: AsyncIterator) -> None:
        try:
            async for event in stream:
                await queue.put((i, event))
        finally:
            await queue.put((i, end))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            i, event = await queue.get()
            if event is end:
                left -= 1
                continue
            yield i, event
    finally:
        for t in tasks:
            t.cancel()


def _failure(out: RequestOutput, field: str) -> ApiError:
    """A request the engine answered with an error: the engine's own fault is a 500, anything
    else (a prompt the cache cannot hold, ...) is the request's."""
    if is_engine_error(out):
        return ApiError(out.error or "engine failure", None, status=500, kind="api_error")
    return from_value_error(ValueError(out.error or "the request failed"), field)


def _check_final(out: RequestOutput) -> None:
    if out.finish_reason == "error":
        raise _failure(out, "messages")


def create_app(
    llm,
    model_name: str,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The ASGI app over one LLM (the caller owns the LLM and closes it)."""
    metrics = ServerMetrics(llm.cache_stats)
    driver = EngineDriver(llm, model_name, on_final=metrics.observe)
    eos = set(llm._engine.eos)
    app = FastAPI(title="ninfer", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.driver = driver
    app.state.metrics = metrics
    app.state.draining = False

    app.add_middleware(_Guard, api_key=api_key, metrics=metrics, state=app.state)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        return _error_response(request.url.path, err)

    @app.get("/health")
    async def health():
        alive = llm._engine._thread.is_alive()
        return JSONResponse({"status": "ok" if alive else "stopped"}, 200 if alive else 503)

    @app.get("/metrics")
    async def prometheus():
        body = await asyncio.to_thread(metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        card = {
            "id": model_name,
            "object": "model",
            "created": now(),
            "owned_by": "ninfer",
            "max_model_len": driver.max_model_len,
        }
        return {"object": "list", "data": [card]}

    def check_model(name: str) -> None:
        if name != model_name:
            raise ApiError(f"model {name!r} is not served here (serving {model_name!r})", "model")

    def validate(rendered: Rendered, params, field: str):
        try:
            return driver.validate(rendered, params)
        except ValueError as e:
            raise from_value_error(e, field) from None

    async def collect(rendered: Rendered, params) -> RequestOutput:
        out = None
        async for event in driver.run(rendered, params, stream=False):
            out = event
        assert isinstance(out, RequestOutput)
        return out

    async def run_all(rendered: Rendered, plist) -> list[RequestOutput]:
        metrics.in_flight.inc(len(plist))
        try:
            outs = await asyncio.gather(*(collect(rendered, p) for p in plist))
        finally:
            metrics.in_flight.dec(len(plist))
        for out in outs:
            _check_final(out)
        return list(outs)

    def runs(rendered: Rendered, plist) -> list[AsyncIterator]:
        return [driver.run(rendered, p, stream=True) for p in plist]

    # ---- OpenAI chat ------------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = _model(oai.ChatRequest, await _read_json(request, max_body_bytes))
        check_model(req.model)
        oai.check_penalties(req)
        n = check_n(req.n)
        messages = oai.convert_messages(req.messages)
        tools = oai.render_tools(req.tools, req.tool_choice)
        kwargs = dict(req.chat_template_kwargs or {})
        if not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
            raise ApiError("chat_template_kwargs keys must be names", "chat_template_kwargs")
        try:
            rendered = driver.render_chat(messages, tools, kwargs)
        except ValueError as e:
            raise from_value_error(e, "messages") from None
        k = oai.chat_logprobs_k(req)
        max_tokens = req.max_completion_tokens or req.max_tokens
        field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        params = sampling_params(
            max_tokens=max_tokens,
            max_tokens_field=field,
            remaining=driver.max_model_len - len(rendered.prompt.token_ids),
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            seed=req.seed,
            stop=req.stop,
            logprobs=k,
            ignore_eos=req.ignore_eos,
        )
        params = validate(rendered, params, "messages")
        plist = siblings(params, n)
        schemas = tool_schemas(tools) if tools else None
        rid, created = new_id("chatcmpl-"), now()

        def parser() -> OutputParser:
            return OutputParser(rendered.thinking, schemas, lambda: new_id("call_"))

        if not req.stream:
            outs = await _or_disconnect(request, run_all(rendered, plist))
            choices = []
            for i, out in enumerate(outs):
                reasoning, content, calls = parse_text(
                    out.text, rendered.thinking, schemas, lambda: new_id("call_")
                )
                choices.append(
                    {
                        "index": i,
                        "message": oai.chat_message(reasoning, content, calls),
                        "logprobs": oai.chat_logprobs(out, driver.tokenizer, k or 0),
                        "finish_reason": oai.finish_reason(out, calls),
                    }
                )
                if req.return_token_ids is True:
                    choices[-1]["token_ids"] = list(out.token_ids)
            return {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model_name,
                "choices": choices,
                "usage": oai.usage_of(outs),
            }

        include_usage = bool((req.stream_options or {}).get("include_usage"))
        return_ids = req.return_token_ids is True

        async def events() -> AsyncIterator[str]:
            parsers = [parser() for _ in plist]
            finals: list[RequestOutput | None] = [None] * len(plist)
            metrics.in_flight.inc(len(plist))
            try:
                for i in range(len(plist)):
                    delta = {"role": "assistant", "content": ""}
                    choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
                    yield _sse(oai.chunk(rid, created, model_name, [choice]))
                async for i, event in _merge(runs(rendered, plist)):
                    p = parsers[i]
                    if isinstance(event, StreamDelta):
                        evs = p.feed(event.text)
                    else:
                        finals[i] = event
                        if event.finish_reason == "error":
                            err = _failure(event, "messages")
                            yield _sse(openai_body(err))
                            continue
                        evs = p.finish()  # the deltas carried all the text
                    choices = [c for e in evs if (c := oai.delta_of(e, i)) is not None]
                    if return_ids and isinstance(event, StreamDelta) and event.token_ids:
                        if not choices:  # tokens without text yet (a partial character)
                            choices = [{"index": i, "delta": {}, "finish_reason": None}]
                        choices[0]["token_ids"] = list(event.token_ids)
                    if choices:
                        yield _sse(oai.chunk(rid, created, model_name, choices))
                    if isinstance(event, RequestOutput):
                        reason = oai.finish_reason(event, p.tool_calls)
                        choice = {"index": i, "delta": {}, "finish_reason": reason}
                        yield _sse(oai.chunk(rid, created, model_name, [choice]))
                done = [o for o in finals if o is not None]
                if include_usage and done:
                    yield _sse(oai.chunk(rid, created, model_name, [], oai.usage_of(done)))
                yield _sse("[DONE]")
            finally:
                metrics.in_flight.dec(len(plist))

        return StreamingResponse(events(), media_type="text/event-stream")

    # ---- OpenAI completions -----------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: Request):
        req = _model(oai.CompletionRequest, await _read_json(request, max_body_bytes))
        check_model(req.model)
        oai.check_penalties(req)
        n = check_n(req.n)
        prompt: object = req.prompt
        if req.cache_breakpoints:
            key = "prompt" if isinstance(req.prompt, str) else "prompt_token_ids"
            prompt = {key: req.prompt, "cache_breakpoints": req.cache_breakpoints}
        try:
            rendered = driver.render_prompt(prompt)  # type: ignore[arg-type]
        except ValueError as e:
            raise from_value_error(e, "prompt") from None
        rendered.text = req.prompt if isinstance(req.prompt, str) else ""
        k = req.logprobs
        if k is not None and not 0 <= k <= 20:
            raise ApiError("logprobs must be in [0, 20]", "logprobs")
        params = sampling_params(
            max_tokens=req.max_tokens if req.max_tokens is not None else 16,
            max_tokens_field="max_tokens",
            remaining=driver.max_model_len - len(rendered.prompt.token_ids),
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            seed=req.seed,
            stop=req.stop,
            logprobs=k,
            ignore_eos=req.ignore_eos,
        )
        params = validate(rendered, params, "prompt")
        plist = siblings(params, n)
        rid, created = new_id("cmpl-"), now()
        echo = rendered.text if req.echo else ""

        if not req.stream:
            outs = await _or_disconnect(request, run_all(rendered, plist))
            choices = [
                {
                    "index": i,
                    "text": echo + out.text,
                    "logprobs": oai.completion_logprobs(out, driver.tokenizer, k or 0),
                    "finish_reason": "length" if out.finish_reason == "length" else "stop",
                }
                for i, out in enumerate(outs)
            ]
            return {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model_name,
                "choices": choices,
                "usage": oai.usage_of(outs),
            }

        include_usage = bool((req.stream_options or {}).get("include_usage"))

        def body(choices, usage_=None) -> dict:
            b = {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model_name,
                "choices": choices,
            }
            if usage_ is not None:
                b["usage"] = usage_
            return b

        async def events() -> AsyncIterator[str]:
            finals = []
            metrics.in_flight.inc(len(plist))
            try:
                if echo:
                    for i in range(len(plist)):
                        choice = {"index": i, "text": echo, "logprobs": None, "finish_reason": None}
                        yield _sse(body([choice]))
                async for i, event in _merge(runs(rendered, plist)):
                    if isinstance(event, StreamDelta):
                        if event.text:
                            choice = {
                                "index": i,
                                "text": event.text,
                                "logprobs": None,
                                "finish_reason": None,
                            }
                            yield _sse(body([choice]))
                        continue
                    finals.append(event)
                    if event.finish_reason == "error":
                        err = _failure(event, "prompt")
                        yield _sse(openai_body(err))
                        continue
                    reason = "length" if event.finish_reason == "length" else "stop"
                    choice = {"index": i, "text": "", "logprobs": None, "finish_reason": reason}
                    yield _sse(body([choice]))
                if include_usage and finals:
                    yield _sse(body([], oai.usage_of(finals)))
                yield _sse("[DONE]")
            finally:
                metrics.in_flight.dec(len(plist))

        return StreamingResponse(events(), media_type="text/event-stream")

    # ---- Anthropic messages -----------------------------------------------------------------
    def render_messages(req: anth.MessagesRequest) -> tuple[Rendered, list[dict] | None]:
        check_model(req.model)
        msgs = anth.convert_messages(req)
        tools, tool_marked = anth.convert_tools(req)
        kwargs = dict(req.chat_template_kwargs or {})
        thinking = anth.enable_thinking(req)
        if thinking is not None:
            kwargs["enable_thinking"] = thinking
        try:
            rendered = driver.render_chat(msgs, tools, kwargs, tool_breakpoint=tool_marked)
        except ValueError as e:
            raise from_value_error(e, "messages") from None
        return rendered, tools

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        data = await _read_json(request, max_body_bytes)
        rendered, _ = render_messages(_model(anth.MessagesRequest, {"max_tokens": 1, **data}))
        return {"input_tokens": len(rendered.prompt.token_ids)}

    @app.post("/v1/messages")
    async def messages(request: Request):
        req = _model(anth.MessagesRequest, await _read_json(request, max_body_bytes))
        rendered, tools = render_messages(req)
        params = sampling_params(
            max_tokens=req.max_tokens,
            max_tokens_field="max_tokens",
            remaining=driver.max_model_len - len(rendered.prompt.token_ids),
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stop=req.stop_sequences,
        )
        params = validate(rendered, params, "messages")
        schemas = tool_schemas(tools) if tools else None
        mid = new_id("msg_")

        def new_tool_id() -> str:
            return new_id("toolu_")

        if not req.stream:
            (out,) = await _or_disconnect(request, run_all(rendered, [params]))
            reasoning, text, calls = parse_text(out.text, rendered.thinking, schemas, new_tool_id)
            blocks = anth.content_blocks(reasoning, text, calls)
            stop = anth.stop_reason(out, calls, eos)
            return anth.message(mid, model_name, blocks, stop, anth.usage(out))

        async def events() -> AsyncIterator[str]:
            p = OutputParser(rendered.thinking, schemas, new_tool_id)
            blocks = anth.BlockStream()
            n_prompt = len(rendered.prompt.token_ids)
            start_usage = {
                "input_tokens": n_prompt,
                "output_tokens": 0,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            }
            start = anth.message(mid, model_name, [], None, start_usage)
            metrics.in_flight.inc()
            try:
                yield _sse({"type": "message_start", "message": start}, "message_start")
                async for _, event in _merge(runs(rendered, [params])):
                    if isinstance(event, StreamDelta):
                        evs = p.feed(event.text)
                        if not evs:
                            continue
                    else:
                        if event.finish_reason == "error":
                            err = _failure(event, "messages")
                            yield _sse(anthropic_body(err), "error")
                            return
                        evs = p.finish()
                    out_events = [e for ev in evs for e in blocks.feed(ev)]
                    if isinstance(event, RequestOutput):
                        if blocks.index < 0:  # an empty reply still has one text block
                            out_events += blocks.feed(Text("content", ""))
                        out_events += blocks.close()
                    for name, data in out_events:
                        yield _sse({"type": name, **data}, name)
                    if isinstance(event, RequestOutput):
                        stop = anth.stop_reason(event, p.tool_calls, eos)
                        delta = {"stop_reason": stop, "stop_sequence": None}
                        final = {
                            "type": "message_delta",
                            "delta": delta,
                            "usage": anth.usage(event),
                        }
                        yield _sse(final, "message_delta")
                        yield _sse({"type": "message_stop"}, "message_stop")
            finally:
                metrics.in_flight.dec()

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


_ROUTES = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/health",
    "/metrics",
}


class _Guard:
    """Pure ASGI (streams and disconnects pass through untouched): the API key and the drain
    on /v1/*, and the request counter by route and status."""

    def __init__(self, app, api_key: str | None, metrics: ServerMetrics, state) -> None:
        self.app = app
        self.api_key = api_key
        self.metrics = metrics
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in _ROUTES else "other"
        status = {"code": 499}  # no response started: the client went away

        async def counted(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            err = None
            if path.startswith("/v1/"):
                if self.api_key is not None and not _authorized(scope, self.api_key):
                    err = ApiError("invalid or missing API key", None, status=401)
                elif self.state.draining:
                    err = ApiError("the server is stopping", None, status=503)
            if err is not None:
                await _error_response(path, err)(scope, receive, counted)
            else:
                await self.app(scope, receive, counted)
        finally:
            self.metrics.requests.labels(route, str(status["code"])).inc()


def _authorized(scope, api_key: str) -> bool:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    given = headers.get("x-api-key")
    auth = headers.get("authorization", "")
    if given is None and auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return given is not None and hmac.compare_digest(given.encode(), api_key.encode())
