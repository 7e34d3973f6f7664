"""The Anthropic routes: /v1/messages (stream and not) and /v1/messages/count_tokens.

A stream writes once per batch of engine events (`EngineDriver.run`): the content-block events
of every token that arrived since the previous write, and with the final output the closing
`message_delta` (stop reason and sequence, usage with the cache figures) and `message_stop`.
Its `message_start` goes out with the first batch: the first token's delta carries the
request's usage, fixed by then (the cached tokens at admission, the cache-created ones once the
prompt's blocks are committed), so `message_start` reports the same split as the end. A request
that ends before a token (an error) still opens with `message_start`, from its final output.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from ninfer.request import RequestOutput, SamplingParams, StreamDelta, Usage
from ninfer.server import anthropic_api as anth
from ninfer.server.cache_control import check_cache_control
from ninfer.server.context import (
    Serving,
    failure,
    or_disconnect,
    refuse_unimplemented,
    serving,
    sse,
)
from ninfer.server.driver import Rendered
from ninfer.server.errors import ApiError, anthropic_body, from_value_error
from ninfer.server.tool_calls import OutputParser, Text, parse_text, tool_schemas
from ninfer.server.wire import new_id, one_structured, sampling_params

router = APIRouter()
Srv = Annotated[Serving, Depends(serving)]


def _render(srv: Serving, req: anth.MessagesRequest) -> tuple[Rendered, list[dict] | None]:
    srv.check_model(req.model)
    refuse_unimplemented(req, "messages")
    anth.check_sampling(req, srv.driver.max_model_len)
    check_cache_control(req.tools, req.system, req.messages, req.cache_control)
    msgs = anth.convert_messages(req, srv.driver.supports_images)
    tools, tool_marked = anth.convert_tools(req)
    kwargs = dict(req.chat_template_kwargs or {})
    thinking = anth.enable_thinking(req)
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    kwargs = srv.template_kwargs(kwargs)
    try:
        rendered = srv.driver.render_chat(msgs, tools, kwargs, tool_breakpoint=tool_marked)
    except ValueError as e:
        raise from_value_error(e, "messages") from None
    return rendered, tools


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request, srv: Srv):
    req = await srv.parse(request, anth.MessagesRequest, defaults={"max_tokens": 1})
    rendered, _ = await srv.offload(_render, srv, req)
    return {"input_tokens": len(rendered.prompt.token_ids)}


@router.post("/v1/messages")
async def messages(request: Request, srv: Srv):
    req = await srv.parse(request, anth.MessagesRequest)
    rendered, tools = await srv.offload(_render, srv, req)
    structured = one_structured(anth.output_structured(req), anth.forced_tool(req, tools))
    params = sampling_params(
        max_tokens=req.max_tokens,
        max_tokens_field="max_tokens",
        remaining=srv.driver.max_model_len - len(rendered.prompt.token_ids),
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stop=req.stop_sequences,
        structured=None if structured is None else structured.spec,
        thinking_token_budget=anth.thinking_budget(req),
    )
    sfield = None if structured is None else structured.field
    params = await srv.offload(srv.validate, rendered, params, "messages", sfield)
    schemas = tool_schemas(tools) if tools else None
    max_calls = 1 if (req.tool_choice or {}).get("disable_parallel_tool_use") else None
    mid = new_id("msg_")

    def new_tool_id() -> str:
        return new_id("toolu_")

    if not req.stream:
        (out,) = await or_disconnect(request, srv.run_all(rendered, [params]))
        reasoning, text, calls = parse_text(
            out.text, rendered.thinking, schemas, new_tool_id, max_calls
        )
        blocks = anth.content_blocks(reasoning, text, calls)
        stop = anth.stop_reason(out, calls)
        return anth.message(mid, req.model, blocks, stop, anth.usage(out.usage))
    parser = OutputParser(rendered.thinking, schemas, new_tool_id, max_calls)
    events = _events(srv, rendered, params, mid, parser, req.model)
    return StreamingResponse(events, media_type="text/event-stream")


async def _events(
    srv: Serving,
    rendered: Rendered,
    params: SamplingParams,
    mid: str,
    p: OutputParser,
    model: str,
) -> AsyncIterator[str]:
    blocks = anth.BlockStream()
    started = False

    def message_start(first: StreamDelta | RequestOutput | None) -> str:
        u = first.usage if first is not None else None
        u = u or Usage(prompt_tokens=len(rendered.prompt.token_ids))
        start = anth.message(mid, model, [], None, anth.usage(u, output_tokens=0))
        return sse({"type": "message_start", "message": start}, "message_start")

    srv.metrics.in_flight.inc()
    try:
        async for _, batch in srv.stream(rendered, [params]):
            parts: list[str] = []
            if not started:
                started = True
                parts.append(message_start(batch[0]))
            for event in batch:
                if isinstance(event, StreamDelta):
                    for ev in p.feed(event.text):
                        parts += (sse({"type": n, **d}, n) for n, d in blocks.feed(ev))
                    continue
                if event.finish_reason == "error":
                    parts.append(sse(anthropic_body(failure(event, "messages")), "error"))
                    yield "".join(parts)
                    return
                out_events = [e for ev in p.finish() for e in blocks.feed(ev)]
                if blocks.index < 0:  # an empty reply still has one text block
                    out_events += blocks.feed(Text("content", ""))
                out_events += blocks.close()
                parts += (sse({"type": n, **d}, n) for n, d in out_events)
                reason, sequence = anth.stop_reason(event, p.tool_calls)
                delta = {"stop_reason": reason, "stop_sequence": sequence}
                final = {"type": "message_delta", "delta": delta, "usage": anth.usage(event.usage)}
                parts.append(sse(final, "message_delta"))
                parts.append(sse({"type": "message_stop"}, "message_stop"))
            if parts:
                yield "".join(parts)
    except Exception as e:  # noqa: BLE001 - the stream is open: end it with an error event
        err = ApiError(f"{type(e).__name__}: {e}", None, status=500, kind="api_error")
        yield (message_start(None) if not started else "") + sse(anthropic_body(err), "error")
    finally:
        srv.metrics.in_flight.dec()
