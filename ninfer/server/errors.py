"""Client errors and their wire forms (OpenAI's and Anthropic's error JSON).

Every client mistake is an `ApiError` with a 4xx status and the offending field (`param`);
the routes never let a client's input reach a 500.
"""

from __future__ import annotations

import re

_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")
_SAMPLING = re.compile(r"^(max_tokens|temperature|top_p|top_k|min_p|logprobs|stop\w*) ")


class ApiError(Exception):
    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        kind: str | None = None,
        code: str | None = None,
    ) -> None:
        message, param = _printable(message), None if param is None else _printable(param)
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.kind = kind or _default_kind(status)
        self.code = code  # OpenAI's `error.code` (e.g. "model_not_found")


def _printable(text: str) -> str:
    """`text` as valid UTF-8: a lone surrogate (JSON's `"\\udc80"` parses to one) is written as
    its escape, so the error body always encodes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _default_kind(status: int) -> str:
    return {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        500: "api_error",
        503: "overloaded_error",
    }.get(status, "invalid_request_error")


def from_value_error(e: ValueError, default_param: str | None = None) -> ApiError:
    """The engine's ValueErrors name their field first ("prompt: ...", "top_p must ...")."""
    text = str(e)
    m = _FIELD.match(text) or _SAMPLING.match(text)
    param = m.group(1) if m else default_param
    if param in ("prompt", "prompt_token_ids") and default_param is not None:
        param = default_param  # the request's own field (messages / prompt)
    return ApiError(text, param)


def openai_body(err: ApiError) -> dict:
    kind = "invalid_request_error" if err.status < 500 and err.status != 401 else err.kind
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


def anthropic_body(err: ApiError) -> dict:
    message = (
        f"{err.param}: {err.message}"
        if err.param and err.param not in err.message
        else (err.message)
    )
    return {"type": "error", "error": {"type": err.kind, "message": message}}
