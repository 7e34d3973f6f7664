"""Turning a lane's progress into public events: stream deltas, stop checks, final outputs.

Knows the detokenizer and the stop rules of SamplingParams; knows nothing about the cache.
Mutates only the lane's text / stream bookkeeping and finish_reason.
"""

from __future__ import annotations

import time

from ninfer.detokenizer import Detokenizer
from ninfer.engine.lane import Lane, Request
from ninfer.request import Metrics, RequestOutput, StreamDelta, Usage


def new_detokenizer(tokenizer, job: Request):
    """The lane's incremental detokenizer (None without a tokenizer: ids only, no text)."""
    if tokenizer is None:
        return None
    return Detokenizer(tokenizer, job.prompt, job.params.stop)


def add_text(lane: Lane, token: int) -> bool:
    """Detokenize a new token into the lane's unstreamed text; True when a stop string hit."""
    if lane.detok is None:
        return False
    piece, stopped = lane.detok.feed([token])
    lane.text += piece
    return stopped


def flush_text(lane: Lane) -> None:
    """At finish: release text held back for stop-string matching."""
    if lane.detok is not None:
        lane.text += lane.detok.flush()


def check_finish(lane: Lane, token: int, eos: tuple[int, ...], max_model_len: int) -> str | None:
    """The finish reason after `token` was appended to the lane (text already checked)."""
    p = lane.job.params
    if not p.ignore_eos and token in eos:
        return "stop"
    if p.stop_token_ids and token in p.stop_token_ids:
        return "stop"
    if len(lane.tokens) - lane.gen_start >= p.max_tokens or len(lane.tokens) >= max_model_len:
        return "length"
    return None


def stream_delta(lane: Lane) -> StreamDelta | None:
    """New tokens and text since the previous delta, or None if nothing is new."""
    n = len(lane.tokens) - lane.gen_start  # generated so far (no copy: this runs every step)
    if n == lane.streamed_tokens and not lane.text:
        return None
    new = lane.tokens[lane.gen_start + lane.streamed_tokens :]
    delta = StreamDelta(request_id=lane.job.request_id, token_ids=new, text=lane.text)
    if lane.streamed_tokens == 0:
        # the first token: the prompt's blocks are committed, so the split is the final one
        delta.usage = _usage(lane, n)
    lane.streamed_tokens = n
    lane.text = ""
    return delta


def final_output(lane: Lane, now: float) -> RequestOutput:
    job = lane.job
    gen = lane.generated  # a fresh list
    first = lane.t_first or now
    prefill_s = max(lane.prefill_done_t or first, lane.t_admit) - lane.t_admit
    decode_s = max(now - first, 0.0)
    n_dec = max(len(gen) - 1, 0)
    return RequestOutput(
        request_id=job.request_id,
        prompt_token_ids=list(job.prompt),
        token_ids=gen,
        text=lane.detok.text if lane.detok is not None else "",
        finish_reason=lane.finish_reason,  # type: ignore[arg-type]
        error=None,
        logprobs=lane.logprobs,
        usage=_usage(lane, len(gen)),
        metrics=Metrics(
            queued_s=max(lane.t_admit - job.t_submit, 0.0),
            ttft_s=max(first - job.t_submit, 0.0) if gen else 0.0,
            prefill_s=prefill_s,
            decode_s=decode_s,
            decode_tokens_per_s=n_dec / decode_s if decode_s > 0 and n_dec else 0.0,
            restore_s=_restore_seconds(lane.restore_timing),
            suspensions=lane.suspensions,
        ),
        stop_string=lane.detok.stop_string if lane.detok is not None else None,
    )


def _usage(lane: Lane, completion_tokens: int) -> Usage:
    cached, cached_prefix = lane.reported_cached()
    return Usage(
        prompt_tokens=lane.gen_start,
        completion_tokens=completion_tokens,
        cached_tokens=cached,
        cached_prefix_tokens=cached_prefix,
        restored_host_bytes=lane.restored_host_bytes,
        cache_creation_tokens=lane.created_prompt_tokens,
    )


def suspended_output(lane: Lane, reason: str, now: float) -> RequestOutput:
    """The final output of a request that ends while suspended (cancelled in the queue): what
    its suspended lane generated, released held-back text included."""
    lane.finish_reason = reason
    flush_text(lane)
    return final_output(lane, now)


def _restore_seconds(ticket) -> float:
    """Start of a restore batch to its last event (0.0 without timing events or copies). The
    lane's first token was sampled after every layer's event, so they have landed by then."""
    if ticket is None or not hasattr(ticket, "elapsed_ms") or not ticket.done():
        return 0.0  # (a lane cancelled before its first pass may not have waited)
    elapsed = ticket.elapsed_ms()
    return max(elapsed.values()) / 1e3 if elapsed else 0.0


# Errors the engine gives a request that did nothing wrong (a fault in its step, or the engine's
# end) start with this; `LLM` raises EngineError for them instead of ValueError.
ENGINE_ERROR_PREFIX = "engine error: "


def engine_error_text(message: str) -> str:
    return message if message.startswith(ENGINE_ERROR_PREFIX) else ENGINE_ERROR_PREFIX + message


def is_engine_error(out: RequestOutput) -> bool:
    return out.finish_reason == "error" and (out.error or "").startswith(ENGINE_ERROR_PREFIX)


def fault_output(lane: Lane, message: str, now: float) -> RequestOutput:
    """A lane failed by a fault: what it generated so far, finish_reason "error"."""
    try:
        out = final_output(lane, now)
    except Exception:  # noqa: BLE001 - the lane's own state is what failed: report it bare
        return error_output(lane.job, engine_error_text(message))
    out.finish_reason = "error"
    out.error = engine_error_text(message)
    return out


def error_output(job: Request, message: str, reason: str = "error") -> RequestOutput:
    return RequestOutput(
        request_id=job.request_id,
        prompt_token_ids=list(job.prompt),
        finish_reason=reason,  # type: ignore[arg-type]
        error=message if reason == "error" else None,
        usage=Usage(prompt_tokens=len(job.prompt)),
        metrics=Metrics(queued_s=max(time.perf_counter() - job.t_submit, 0.0)),
    )
