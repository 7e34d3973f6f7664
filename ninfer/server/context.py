"""What every route shares: the served model, the driver and the metrics (one `Serving` per
app, the routes' FastAPI dependency), and the request plumbing: size-limited JSON bodies,
pydantic errors as API errors naming the field, disconnect watching, sibling runs, SSE framing.

Every request is parsed by hand (size-limited body, pydantic models) so every client mistake
becomes its API's error JSON naming the field, never a 500. A streamed request is cancelled on
the engine when its client disconnects (Starlette cancels the response's iterator); a
non-streamed one is watched for the disconnect while it waits.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from pydantic import ValidationError

from ninfer.engine.outputs import is_engine_error
from ninfer.request import RequestOutput, SamplingParams, StreamDelta
from ninfer.server.driver import EngineDriver, Rendered
from ninfer.server.errors import ApiError, from_value_error
from ninfer.server.metrics import ServerMetrics

Batch = list[StreamDelta | RequestOutput]  # one `EngineDriver.run` batch


@dataclass(slots=True)
class Serving:
    driver: EngineDriver
    metrics: ServerMetrics
    model_name: str
    max_body_bytes: int

    async def parse(self, request: Request, cls, defaults: dict | None = None):
        """The request body as the pydantic model `cls` (`defaults` fill absent fields)."""
        data = await read_json(request, self.max_body_bytes)
        return parse_model(cls, {**defaults, **data} if defaults else data)

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(
                f"model {name!r} is not served here (serving {self.model_name!r})", "model"
            )

    def validate(self, rendered: Rendered, params: SamplingParams, field: str) -> SamplingParams:
        try:
            return self.driver.validate(rendered, params)
        except ValueError as e:
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


def serving(request: Request) -> Serving:
    """The routes' dependency: the app's `Serving`."""
    return request.app.state.serving


def sse(data: dict | str, event: str | None = None) -> str:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return (f"event: {event}\n" if event else "") + f"data: {text}\n\n"


async def read_json(request: Request, limit: int) -> dict:
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


def parse_model(cls, data: dict):
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
            task.cancel()
    if task.cancelled():
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
