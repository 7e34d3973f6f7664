"""The OpenAI routes: /v1/chat/completions, /v1/completions, /v1/models.

A request is prepared (rendered, tokenized, checked) and a non-streamed reply built on
`Serving.offload`'s worker threads, never on the event loop. A stream writes once per batch
of engine events (`EngineDriver.run`): one chunk per choice carrying every token that arrived
since the previous write (clients accept multi-token deltas), the finish chunk, and after the
last choice's finish the usage chunk and `data: [DONE]`, all in that one write.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from ninfer.request import RequestOutput, SamplingParams, StreamDelta
from ninfer.server import openai_api as oai
from ninfer.server.context import (
    Serving,
    failure,
    merge,
    or_disconnect,
    refuse_unimplemented,
    serving,
    sse,
)
from ninfer.server.driver import Rendered
from ninfer.server.errors import ApiError, from_value_error, openai_body
from ninfer.server.jsontext import json_bytes
from ninfer.server.tool_calls import OutputParser, parse_text, tool_schemas
from ninfer.server.wire import (
    Structured,
    check_max_tokens,
    check_n,
    check_room,
    new_id,
    now,
    one_structured,
    openai_structured,
    sampling_params,
    siblings,
    tool_structured,
)

router = APIRouter()
Srv = Annotated[Serving, Depends(serving)]


@dataclass(slots=True)
class _Prepared:
    """A checked request: its prompt, each choice's sampling parameters, the top-k logprobs,
    the tools and how many calls a reply may make (None: any; 1 with `parallel_tool_calls`
    false, the calls after the first dropped when the reply is not constrained to one)."""

    rendered: Rendered
    plist: list[SamplingParams]
    k: int | None
    tools: list[dict] | None = None
    max_calls: int | None = None


def _json(body: bytes) -> Response:
    return Response(body, media_type="application/json")


@router.get("/v1/models")
async def models(srv: Srv):
    created = now()
    cards = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "ninfer",
            "max_model_len": srv.driver.max_model_len,
        }
        for name in srv.names
    ]
    return {"object": "list", "data": cards}


# ---- chat -------------------------------------------------------------------------------------
def _chat_render(srv: Serving, req: oai.ChatRequest) -> tuple[Rendered, list[dict] | None, int]:
    """The checked request's prompt, its tools and its choice count (`n`)."""
    srv.check_model(req.model)
    refuse_unimplemented(req, "chat")
    oai.check_penalties(req)
    n = check_n(req.n)
    messages = oai.convert_messages(req.messages, srv.driver.supports_images)
    tools = oai.render_tools(req.tools, req.tool_choice)
    kwargs = dict(req.chat_template_kwargs or {})
    if not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise ApiError("chat_template_kwargs keys must be names", "chat_template_kwargs")
    thinking = oai.thinking_of(req.reasoning_effort)
    if thinking is not None:
        kwargs.setdefault("enable_thinking", thinking)
    kwargs = srv.template_kwargs(kwargs)
    try:
        return srv.driver.render_chat(messages, tools, kwargs), tools, n
    except ValueError as e:
        raise from_value_error(e, "messages") from None


def _chat_prepare(srv: Serving, req: oai.ChatRequest) -> _Prepared:
    rendered, tools, n = _chat_render(srv, req)
    k = oai.chat_logprobs_k(req)
    max_tokens = req.max_completion_tokens or req.max_tokens
    field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    parallel = req.parallel_tool_calls is not False
    structured = one_structured(
        openai_structured(_fields(req)), tool_structured(tools, req.tool_choice, parallel)
    )
    params = _params(srv, req, rendered, max_tokens, field, k, n, structured)
    plist = _siblings(srv, rendered, params, n, field, "messages", structured)
    return _Prepared(rendered, plist, k, tools, None if parallel else 1)


def _fields(req) -> dict:
    """A request's fields by name, the undeclared (vLLM's extensions) included."""
    return {**(req.model_extra or {}), **{k: getattr(req, k) for k in type(req).model_fields}}


def _chat_body(srv: Serving, req: oai.ChatRequest, prep: _Prepared, outs: list) -> bytes:
    schemas = tool_schemas(prep.tools) if prep.tools else None
    choices, seen = [], {}  # the token texts of the logprobs, encoded once per reply
    for i, out in enumerate(outs):
        reasoning, content, calls = parse_text(
            out.text, prep.rendered.thinking, schemas, lambda: new_id("call_"), prep.max_calls
        )
        choices.append(
            {
                "index": i,
                "message": oai.chat_message(reasoning, content, calls),
                "logprobs": oai.chat_logprobs(out, srv.driver.tokenizer, prep.k or 0, seen),
                "finish_reason": oai.finish_reason(out, calls),
            }
        )
        if req.return_token_ids is True:
            choices[-1]["token_ids"] = list(out.token_ids)
    body = {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": now(),
        "model": req.model,
        "choices": choices,
        "usage": oai.usage_of(outs),
    }
    return json_bytes(body)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, srv: Srv):
    req = await srv.parse(request, oai.ChatRequest)
    prep = await srv.offload(_chat_prepare, srv, req)
    rendered, plist = prep.rendered, prep.plist
    if not req.stream:
        outs = await or_disconnect(request, srv.run_all(rendered, plist))
        return _json(await srv.offload(_chat_body, srv, req, prep, outs))
    schemas = tool_schemas(prep.tools) if prep.tools else None
    fmt = oai.ChunkFormat(new_id("chatcmpl-"), now(), req.model, "chat.completion.chunk")
    events = _chat_events(
        srv,
        rendered,
        plist,
        fmt,
        [
            OutputParser(rendered.thinking, schemas, lambda: new_id("call_"), prep.max_calls)
            for _ in plist
        ],
        include_usage=bool((req.stream_options or {}).get("include_usage")),
        return_ids=req.return_token_ids is True,
    )
    return StreamingResponse(events, media_type="text/event-stream")


async def _chat_events(
    srv: Serving,
    rendered: Rendered,
    plist: list[SamplingParams],
    fmt: oai.ChunkFormat,
    parsers: list[OutputParser],
    include_usage: bool,
    return_ids: bool,
) -> AsyncIterator[str]:
    finals: list[RequestOutput | None] = [None] * len(plist)
    srv.metrics.in_flight.inc(len(plist))
    try:
        role = {"role": "assistant", "content": ""}
        yield "".join(
            fmt.sse([{"index": i, "delta": role, "logprobs": None, "finish_reason": None}])
            for i in range(len(plist))
        )
        async for i, batch in srv.stream(rendered, plist):
            parts: list[str] = []
            p = parsers[i]
            for event in batch:
                if isinstance(event, StreamDelta):
                    choice = oai.delta_choice(p.feed(event.text), i)
                    if return_ids and event.token_ids:
                        if choice is None:  # tokens without text yet (a partial character)
                            choice = {"index": i, "delta": {}, "finish_reason": None}
                        choice["token_ids"] = list(event.token_ids)
                    if choice is not None:
                        parts.append(fmt.sse([choice]))
                    continue
                finals[i] = event
                if event.finish_reason == "error":
                    parts.append(sse(openai_body(failure(event, "messages"))))
                    continue
                choice = oai.delta_choice(p.finish(), i)  # the deltas carried all the text
                if choice is not None:
                    parts.append(fmt.sse([choice]))
                reason = oai.finish_reason(event, p.tool_calls)
                parts.append(fmt.sse([{"index": i, "delta": {}, "finish_reason": reason}]))
            if all(f is not None for f in finals):  # the last choice finished: the tail
                if include_usage:
                    parts.append(fmt.sse([], oai.usage_of(finals)))  # type: ignore[arg-type]
                parts.append(sse("[DONE]"))
            if parts:
                yield "".join(parts)
    finally:
        srv.metrics.in_flight.dec(len(plist))


# ---- completions ------------------------------------------------------------------------------
@dataclass(slots=True)
class _Batch:
    """A checked completions request: each prompt's `_Prepared`, the choices per prompt."""

    prompts: list[_Prepared]
    n: int
    model: str

    def runs(self) -> list[tuple[Rendered, SamplingParams]]:
        """(prompt, parameters) of every choice, choice `i * n + j` at that index."""
        return [(p.rendered, params) for p in self.prompts for params in p.plist]


def _completion_prepare(srv: Serving, req: oai.CompletionRequest) -> _Batch:
    model = srv.check_model(req.model)
    refuse_unimplemented(req, "completions")
    oai.check_penalties(req)
    n = check_n(req.n)
    prompts = req.prompts()
    if len(prompts) * n > oai.MAX_BATCH_CHOICES:
        raise ApiError(
            f"prompt: {len(prompts)} prompts x n={n} is more than "
            f"{oai.MAX_BATCH_CHOICES} choices in one request",
            "prompt",
        )
    if req.cache_breakpoints and len(prompts) > 1:
        raise ApiError("cache_breakpoints needs a single prompt", "cache_breakpoints")
    k = req.logprobs
    if k is not None and not 0 <= k <= 20:
        raise ApiError("logprobs must be in [0, 20]", "logprobs")
    if req.echo and k is not None:  # OpenAI's reply would carry the prompt's logprobs too
        raise ApiError("echo with logprobs (the prompt's logprobs) is not supported", "echo")
    max_tokens = req.max_tokens if req.max_tokens is not None else 16
    batch = []
    for i, one in enumerate(prompts):
        try:
            batch.append(_completion_one(srv, req, one, max_tokens, k, n))
        except ApiError as err:
            if len(prompts) > 1 and err.param in ("prompt", "prompt_token_ids"):
                text = err.message  # the batch's prompt i, named once
                for name in ("prompt: ", "prompt_token_ids: "):
                    text = text.removeprefix(name)
                raise ApiError(f"prompt[{i}]: {text}", f"prompt[{i}]") from None
            raise
    return _Batch(batch, n, model)


def _completion_one(srv: Serving, req: oai.CompletionRequest, one, max_tokens, k, n) -> _Prepared:
    """One prompt of the batch, checked (ApiError naming `prompt`)."""
    prompt: object = one
    if req.cache_breakpoints:
        key = "prompt" if isinstance(one, str) else "prompt_token_ids"
        prompt = {key: one, "cache_breakpoints": req.cache_breakpoints}
    try:
        rendered = srv.driver.render_prompt(prompt)  # type: ignore[arg-type]
    except ValueError as e:
        raise from_value_error(e, "prompt") from None
    tok = srv.driver.tokenizer
    rendered.text = one if isinstance(one, str) else tok.decode(one) if tok is not None else ""
    structured = openai_structured(_fields(req))
    params = _params(srv, req, rendered, max_tokens, "max_tokens", k, n, structured)
    plist = _siblings(srv, rendered, params, n, "max_tokens", "prompt", structured)
    return _Prepared(rendered, plist, k)


def _completion_body(srv: Serving, req: oai.CompletionRequest, batch: _Batch, outs) -> bytes:
    choices = []
    for i, out in enumerate(outs):
        prep = batch.prompts[i // batch.n]
        echo = prep.rendered.text if req.echo else ""
        choice = {
            "index": i,
            "text": echo + out.text,
            "logprobs": oai.completion_logprobs(out, srv.driver.tokenizer, prep.k or 0),
            "finish_reason": "length" if out.finish_reason == "length" else "stop",
        }
        if req.return_token_ids is True:
            choice["prompt_token_ids"] = list(out.prompt_token_ids)
            choice["token_ids"] = list(out.token_ids)
        choices.append(choice)
    body = {
        "id": new_id("cmpl-"),
        "object": "text_completion",
        "created": now(),
        "model": batch.model,
        "choices": choices,
        "usage": oai.usage_of(outs, batch.n),
    }
    return json_bytes(body)


async def _run_batch(srv: Serving, batch: _Batch) -> list:
    """Every choice of every prompt, submitted together: one batch on the engine."""
    tasks = [asyncio.ensure_future(srv.run_all(p.rendered, p.plist)) for p in batch.prompts]
    try:
        per_prompt = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:  # one prompt failed, or the client left: the rest stop too
            task.cancel()
        raise
    return [out for outs in per_prompt for out in outs]


@router.post("/v1/completions")
async def completions(request: Request, srv: Srv):
    req = await srv.parse(request, oai.CompletionRequest)
    batch = await srv.offload(_completion_prepare, srv, req)
    if not req.stream:
        outs = await or_disconnect(request, _run_batch(srv, batch))
        return _json(await srv.offload(_completion_body, srv, req, batch, outs))
    fmt = oai.ChunkFormat(new_id("cmpl-"), now(), batch.model, "text_completion")
    include_usage = bool((req.stream_options or {}).get("include_usage"))
    events = _completion_events(
        srv, batch, fmt, req.echo, include_usage, return_ids=req.return_token_ids is True
    )
    return StreamingResponse(events, media_type="text/event-stream")


async def _completion_events(
    srv: Serving,
    batch: _Batch,
    fmt: oai.ChunkFormat,
    echo: bool,
    include_usage: bool,
    return_ids: bool,
) -> AsyncIterator[str]:
    runs = batch.runs()
    finals: list[RequestOutput | None] = [None] * len(runs)
    srv.metrics.in_flight.inc(len(runs))
    try:
        if echo:
            yield "".join(
                fmt.sse([{"index": i, "text": r.text, "logprobs": None, "finish_reason": None}])
                for i, (r, _) in enumerate(runs)
            )
        streams = [srv.driver.run(r, p, stream=True) for r, p in runs]
        async for i, events in merge(streams):
            parts: list[str] = []
            for event in events:  # type: ignore[attr-defined]
                if isinstance(event, StreamDelta):
                    if event.text or (return_ids and event.token_ids):
                        choice = {"index": i, "text": event.text, "logprobs": None}
                        if return_ids:
                            choice["token_ids"] = list(event.token_ids)
                        parts.append(fmt.sse([{**choice, "finish_reason": None}]))
                    continue
                finals[i] = event
                if event.finish_reason == "error":
                    parts.append(sse(openai_body(failure(event, "prompt"))))
                    continue
                reason = "length" if event.finish_reason == "length" else "stop"
                choice = {"index": i, "text": "", "logprobs": None, "finish_reason": reason}
                parts.append(fmt.sse([choice]))
            if all(f is not None for f in finals):  # the last choice finished: the tail
                if include_usage:
                    parts.append(fmt.sse([], oai.usage_of(finals, batch.n)))  # type: ignore[arg-type]
                parts.append(sse("[DONE]"))
            if parts:
                yield "".join(parts)
    finally:
        srv.metrics.in_flight.dec(len(runs))


def _siblings(
    srv: Serving, rendered: Rendered, params: SamplingParams, n: int, field: str, prompt_field: str,
    structured: Structured | None = None,
) -> list[SamplingParams]:  # fmt: skip
    """The n choices' parameters, once the engine has checked the prompt and `params` (its
    structured output compiled) and the choices' replies fit in the KV pages beside the
    prompt."""
    sfield = structured.field if structured is not None else None
    checked = srv.validate(rendered, params, prompt_field, sfield)
    check_room(n, checked.max_tokens, field, _room(srv, rendered))
    return siblings(checked, n)


def _room(srv: Serving, rendered: Rendered) -> int:
    """KV tokens left beside the prompt for every choice's reply together."""
    return srv.driver.kv_capacity_tokens - len(rendered.prompt.token_ids)


def _params(srv, req, rendered, max_tokens, field: str, k, n: int, structured=None):
    """The sampling parameters both OpenAI endpoints read from their request, checked by the
    wire rules (`sampling_params`) against the room left after the rendered prompt (with n
    choices, a reply's default length is its share of the KV pages)."""
    limit = srv.driver.max_model_len
    check_max_tokens(max_tokens, field, limit)
    context_left = limit - len(rendered.prompt.token_ids)
    return sampling_params(
        max_tokens=max_tokens,
        max_tokens_field=field,
        remaining=min(context_left, _room(srv, rendered) // n),
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        seed=req.seed,
        stop=req.stop,
        stop_token_ids=_fields(req).get("stop_token_ids"),
        logprobs=k,
        ignore_eos=req.ignore_eos,
        structured=None if structured is None else structured.spec,
        thinking_token_budget=req.thinking_token_budget,
    )
