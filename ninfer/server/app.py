"""The ASGI app: the routes of both APIs over one engine, the API key, the drain, the metrics.

The routes live by protocol (`openai_routes`, `anthropic_routes`) and share one `Serving`
(the driver, the metrics, the served name, the body limit: `context.py`) through a FastAPI
dependency. Health and metrics are here; `_Guard`, a pure ASGI middleware, checks the API key
and the drain on /v1/* and counts requests by route and status.
"""

from __future__ import annotations

import asyncio
import hmac

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ninfer.server import anthropic_routes, openai_routes
from ninfer.server.context import Serving
from ninfer.server.driver import EngineDriver
from ninfer.server.errors import ApiError, anthropic_body, openai_body
from ninfer.server.metrics import ServerMetrics

DEFAULT_MAX_BODY_BYTES = 32 << 20

service = APIRouter()


@service.get("/health")
async def health(request: Request):
    alive = request.app.state.driver.running
    return JSONResponse({"status": "ok" if alive else "stopped"}, 200 if alive else 503)


@service.get("/metrics")
async def prometheus(request: Request):
    body = await asyncio.to_thread(request.app.state.metrics.render)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


def _is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def _error_response(path: str, err: ApiError) -> JSONResponse:
    body = anthropic_body(err) if _is_anthropic(path) else openai_body(err)
    return JSONResponse(body, status_code=err.status)


async def _api_error(request: Request, err: ApiError) -> JSONResponse:
    return _error_response(request.url.path, err)


def create_app(
    llm,
    model_name: str,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The ASGI app over one LLM (the caller owns the LLM and closes it)."""
    metrics = ServerMetrics(llm.cache_stats)
    driver = EngineDriver(llm, model_name, on_final=metrics.observe)
    metrics.loop_stats = lambda: driver.loop_stats
    app = FastAPI(title="ninfer", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.driver = driver
    app.state.metrics = metrics
    app.state.serving = Serving(driver, metrics, model_name, max_body_bytes)
    app.state.draining = False
    app.add_middleware(_Guard, api_key=api_key, metrics=metrics, state=app.state)
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    for router in (service, openai_routes.router, anthropic_routes.router):
        app.include_router(router)
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
            else:
                self.metrics.stream_writes += 1
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
