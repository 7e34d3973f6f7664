"""The ASGI app: the routes of both APIs over one engine, the gate, the metrics.

The routes live by protocol (`openai_routes`, `anthropic_routes`) and share one `Serving`
(the driver, the metrics, the served name, the limits, the worker threads: `context.py`)
through a FastAPI dependency. Health and metrics are here; `guard.Guard`, a pure ASGI
middleware, checks the `Host`, the `Origin`, the API key, the drain and the content type, and
counts requests by route and status. Every error, an unknown route or method included, is the
API's error JSON.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ninfer.server import anthropic_routes, openai_routes
from ninfer.server.context import DEFAULT_MAX_BODY_BYTES, Limits, Serving
from ninfer.server.driver import EngineDriver
from ninfer.server.errors import ApiError
from ninfer.server.guard import Guard, Policy, error_response
from ninfer.server.metrics import ServerMetrics

service = APIRouter()


@service.get("/health")
async def health(request: Request):
    alive = request.app.state.driver.running
    return JSONResponse({"status": "ok" if alive else "stopped"}, 200 if alive else 503)


@service.get("/metrics")
async def prometheus(request: Request):
    body = await asyncio.to_thread(request.app.state.metrics.render)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


async def _api_error(request: Request, err: ApiError) -> JSONResponse:
    return error_response(request.url.path, err)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (no such route, a method the route lacks) in the API's shape."""
    err = ApiError(f"{request.method} {request.url.path}: {exc.detail}", None, exc.status_code)
    response = error_response(request.url.path, err)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


def create_app(
    llm,
    model_name: str | Sequence[str],
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    *,
    host: str = "127.0.0.1",
    allowed_hosts: Iterable[str] = (),
    allowed_origins: Iterable[str] = (),
) -> FastAPI:
    """The ASGI app over one LLM (the caller owns the LLM and closes it). `host` is the bound
    address (its name is accepted in `Host`); `allowed_hosts` and `allowed_origins` as
    `guard.Policy` reads them ("*": any). `model_name`: the name clients send, or several
    (the first is the default in replies). On the demo model (no checkpoint) a chat answers
    in `content` unless a request turns thinking on."""
    names = (model_name,) if isinstance(model_name, str) else tuple(dict.fromkeys(model_name))
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"served model names must be non-empty strings, got {model_name!r}")
    model_name = names[0]
    demo = getattr(llm.engine_config, "model", "") is None
    metrics = ServerMetrics(llm.cache_stats, llm.speculation_stats)
    driver = EngineDriver(llm, model_name, on_final=metrics.observe)
    metrics.loop_stats = lambda: driver.loop_stats
    app = FastAPI(title="ninfer", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.driver = driver
    app.state.metrics = metrics
    app.state.serving = Serving(
        driver,
        metrics,
        model_name,
        Limits(max_body_bytes),
        model_names=names,
        thinking_default=False if demo else None,
    )
    app.state.draining = False
    policy = Policy.of(api_key, host, allowed_hosts, allowed_origins)
    app.add_middleware(Guard, policy=policy, metrics=metrics, state=app.state)
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    for router in (service, openai_routes.router, anthropic_routes.router):
        app.include_router(router)
    return app
