"""Turning a request's progress into public events: stream deltas, stop checks, final outputs.

Knows the detokenizer and the stop rules of SamplingParams; knows nothing about the cache (its
figures are the request's `usage`). Mutates only the request's text / stream bookkeeping and
finish_reason.
"""

from __future__ import annotations

import time

from ninfer.detokenizer import Detokenizer
from ninfer.engine.request import Request
from ninfer.request import Metrics, RequestOutput, StreamDelta, Usage


def new_detokenizer(tokenizer, req: Request):
    """The request's incremental detokenizer (None without a tokenizer: ids only, no text)."""
    if tokenizer is None:
        return None
    return Detokenizer(tokenizer, req.prompt, req.params.stop)


def add_text(req: Request, token: int) -> bool:
    """Detokenize a new token into the request's unstreamed text; True when a stop string hit."""
    if req.detok is None:
        return False
    piece, stopped = req.detok.feed([token])
    req.text += piece
    return stopped


def flush_text(req: Request) -> None:
    """At finish: release text held back for stop-string matching."""
    if req.detok is not None:
        req.text += req.detok.flush()


def check_finish(req: Request, token: int, eos: tuple[int, ...], max_model_len: int) -> str | None:
    """The finish reason after `token` was appended to the request (text already checked)."""
    p = req.params
    if not p.ignore_eos and token in eos:
        return "stop"
    if p.stop_token_ids and token in p.stop_token_ids:
        return "stop"
    if req.length_reached(max_model_len):
        return "length"
    return None


def stream_delta(req: Request) -> StreamDelta | None:
    """New tokens and text since the previous delta, or None if nothing is new."""
    n = len(req.tokens) - req.gen_start  # generated so far (no copy: this runs every step)
    if n == req.streamed_tokens and not req.text:
        return None
    new = req.tokens[req.gen_start + req.streamed_tokens :]
    delta = StreamDelta(request_id=req.request_id, token_ids=new, text=req.text)
    if req.streamed_tokens == 0:
        # the first token: the prompt's blocks are committed, so the split is the final one
        delta.usage = _usage(req, n)
    req.streamed_tokens = n
    req.text = ""
    return delta


def final_output(req: Request, now: float) -> RequestOutput:
    gen = req.generated  # a fresh list
    first = req.t_first or now
    prefill_s = max(req.prefill_done_t or first, req.t_admit) - req.t_admit
    decode_s = max(now - first, 0.0)
    n_dec = max(len(gen) - 1, 0)
    return RequestOutput(
        request_id=req.request_id,
        prompt_token_ids=list(req.prompt),
        token_ids=gen,
        text=req.detok.text if req.detok is not None else "",
        finish_reason=req.finish_reason,  # type: ignore[arg-type]
        error=None,
        logprobs=req.logprobs,
        usage=_usage(req, len(gen)),
        metrics=Metrics(
            queued_s=max(req.t_admit - req.t_submit, 0.0),
            ttft_s=max(first - req.t_submit, 0.0) if gen else 0.0,
            prefill_s=prefill_s,
            decode_s=decode_s,
            decode_tokens_per_s=n_dec / decode_s if decode_s > 0 and n_dec else 0.0,
            restore_s=_restore_seconds(req.usage.restore_timing),
            suspensions=req.suspensions,
        ),
        stop_string=req.detok.stop_string if req.detok is not None else None,
    )


def _usage(req: Request, completion_tokens: int) -> Usage:
    u = req.usage
    return Usage(
        prompt_tokens=req.gen_start,
        completion_tokens=completion_tokens,
        cached_tokens=u.cached_tokens,
        cached_prefix_tokens=u.cached_prefix_tokens,
        restored_host_bytes=u.restored_host_bytes,
        cache_creation_tokens=u.created_prompt_tokens,
    )


def suspended_output(req: Request, reason: str, now: float) -> RequestOutput:
    """The final output of a request that ends while suspended (cancelled in the queue): what
    it generated, released held-back text included."""
    req.finish_reason = reason
    flush_text(req)
    return final_output(req, now)


def _restore_seconds(ticket) -> float:
    """Start of a restore batch to its last event (0.0 without timing events or copies). The
    request's first token was sampled after every layer's event, so they have landed by then."""
    if ticket is None or not hasattr(ticket, "elapsed_ms") or not ticket.done():
        return 0.0  # (a request cancelled before its first pass may not have waited)
    elapsed = ticket.elapsed_ms()
    return max(elapsed.values()) / 1e3 if elapsed else 0.0


# Errors the engine gives a request that did nothing wrong (a fault in its step, or the engine's
# end) start with this; `LLM` raises EngineError for them instead of ValueError.
ENGINE_ERROR_PREFIX = "engine error: "


def engine_error_text(message: str) -> str:
    return message if message.startswith(ENGINE_ERROR_PREFIX) else ENGINE_ERROR_PREFIX + message


def is_engine_error(out: RequestOutput) -> bool:
    return out.finish_reason == "error" and (out.error or "").startswith(ENGINE_ERROR_PREFIX)


def fault_output(req: Request, message: str, now: float) -> RequestOutput:
    """A request failed by a fault: what it generated so far, finish_reason "error"."""
    try:
        out = final_output(req, now)
    except Exception:  # noqa: BLE001 - the request's own state is what failed: report it bare
        return error_output(req, engine_error_text(message))
    out.finish_reason = "error"
    out.error = engine_error_text(message)
    return out


def error_output(req: Request, message: str, reason: str = "error") -> RequestOutput:
    return RequestOutput(
        request_id=req.request_id,
        prompt_token_ids=list(req.prompt),
        finish_reason=reason,  # type: ignore[arg-type]
        error=message if reason == "error" else None,
        usage=Usage(prompt_tokens=len(req.prompt)),
        metrics=Metrics(queued_s=max(time.perf_counter() - req.t_submit, 0.0)),
    )
