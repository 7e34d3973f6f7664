"""The gate in front of every route (pure ASGI: streams and disconnects pass through untouched).

In order: the `Host` header, the `Origin` header (answering CORS preflights), the API key and
the drain on /v1/*, then a JSON `Content-Type` on POST /v1/*; every refusal is the API's error
JSON. It counts every request by route and status, and an exception that escapes the app is
answered (when no response has started) and counted as a 500, never as a client that went away.

Why the browser rules (a server without `--api-key` is open to whatever can reach it):
- A web page may POST a "simple" request (text/plain, form or no `Content-Type`) to any address
  without asking first; requiring a JSON type makes the browser ask (a CORS preflight), and
  the answer is no unless `allowed_origins` names the page's origin. A request that carries an
  `Origin` not named there is refused outright.
- A DNS-rebinding page reaches the server under the attacker's host name, so the page could
  read the answers; the `Host` must be an IP address (no rebinding can produce one: the page's
  origin would be the server itself), `localhost`, the bound name or one of `allowed_hosts`.
  With an API key any `Host` is accepted: /v1/* needs the key, a page cannot know it.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from fastapi.responses import JSONResponse

from ninfer.server.errors import ApiError, anthropic_body, openai_body
from ninfer.server.metrics import ServerMetrics

log = logging.getLogger("ninfer.server")

ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/health",
        "/metrics",
    }
)
_PREFLIGHT_MAX_AGE_S = "600"


def is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_response(path: str, err: ApiError) -> JSONResponse:
    body = anthropic_body(err) if is_anthropic(path) else openai_body(err)
    return JSONResponse(body, status_code=err.status)


@dataclass(frozen=True, slots=True)
class Policy:
    """Who may call: the API key (None: anyone), the `Host` names accepted besides IP
    addresses and `localhost` ("*": any), the browser origins answered with CORS ("*": any)."""

    api_key: str | None = None
    allowed_hosts: frozenset[str] = frozenset()
    allowed_origins: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        api_key: str | None,
        bound_host: str,
        hosts: Iterable[str] = (),
        origins: Iterable[str] = (),
    ) -> Policy:
        names = {_host_name(h) for h in (*hosts, bound_host) if h.strip()}
        return cls(api_key, frozenset(names), frozenset(o.strip().rstrip("/") for o in origins))

    def host_allowed(self, host: str | None) -> bool:
        if host is None or self.api_key is not None or "*" in self.allowed_hosts:
            return True  # no Host: not a browser (browsers always send one)
        name = _host_name(host)
        if name == "localhost" or name.endswith(".localhost") or name in self.allowed_hosts:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.allowed_origins or origin.rstrip("/") in self.allowed_origins


def _host_name(host: str) -> str:
    """`Host` header value -> the bare lowercase name or address (port and brackets off)."""
    host = host.strip().lower()
    if host.startswith("["):  # [v6]:port
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def json_media_type(content_type: str | None) -> bool:
    """application/json or any +json type, with or without parameters."""
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


class Guard:
    """The ASGI middleware (see the module docstring); `state.draining` is read per request."""

    def __init__(self, app, policy: Policy, metrics: ServerMetrics, state) -> None:
        self.app = app
        self.policy = policy
        self.metrics = metrics
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in ROUTES else "other"
        status = {"code": 499}  # no response started: the client went away
        headers = _headers(scope)
        origin = headers.get("origin")
        cors = origin is not None and self.policy.origin_allowed(origin)

        async def counted(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                if cors:
                    message = _with_cors(message, origin)
            else:
                self.metrics.stream_writes += 1
            await send(message)

        try:
            err = self._browser_refusal(headers, origin)
            if err is None and cors and scope["method"] == "OPTIONS":
                await counted(_preflight(headers))
                await counted({"type": "http.response.body", "body": b""})
                return
            if err is None and path.startswith("/v1/"):
                err = self._api_refusal(scope["method"], headers)
            if err is not None:
                await error_response(path, err)(scope, receive, counted)
            else:
                await self.app(scope, receive, counted)
        except Exception:
            log.exception("request %s %s failed", scope["method"], path)
            started = status["code"] != 499
            status["code"] = 500
            if started:
                raise
            fault = ApiError("internal server error", None, status=500, kind="api_error")
            await error_response(path, fault)(scope, receive, counted)
        finally:
            self.metrics.requests.labels(route, str(status["code"])).inc()

    def _browser_refusal(self, headers: dict[str, str], origin: str | None) -> ApiError | None:
        p = self.policy
        host = headers.get("host")
        if not p.host_allowed(host):
            return ApiError(
                f"Host {host!r} is not served here (add it to --allowed-hosts)",
                "Host",
                status=403,
                kind="permission_error",
            )
        if origin is not None and not p.origin_allowed(origin):
            return ApiError(
                f"Origin {origin!r} is not allowed (add it to --allowed-origins)",
                "Origin",
                status=403,
                kind="permission_error",
            )
        return None

    def _api_refusal(self, method: str, headers: dict[str, str]) -> ApiError | None:
        p = self.policy
        if p.api_key is not None and not _authorized(headers, p.api_key):
            return ApiError("invalid or missing API key", None, status=401)
        if self.state.draining:
            return ApiError("the server is stopping", None, status=503)
        content_type = headers.get("content-type")
        if method == "POST" and not json_media_type(content_type):
            return ApiError(
                f"Content-Type must be application/json, got {content_type!r}",
                "Content-Type",
                status=415,
            )
        return None


def _headers(scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _with_cors(message: dict, origin: str) -> dict:
    extra = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
    return {**message, "headers": [*message.get("headers", []), *extra]}


def _preflight(headers: dict[str, str]) -> dict:
    asked = headers.get("access-control-request-headers", "")
    allow = [
        (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
        (b"access-control-allow-headers", asked.encode("latin-1")),
        (b"access-control-max-age", _PREFLIGHT_MAX_AGE_S.encode()),
        (b"content-length", b"0"),
    ]
    return {"type": "http.response.start", "status": 204, "headers": allow}


def _authorized(headers: dict[str, str], api_key: str) -> bool:
    given = headers.get("x-api-key")
    auth = headers.get("authorization", "")
    if given is None and auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return given is not None and hmac.compare_digest(given.encode(), api_key.encode())
