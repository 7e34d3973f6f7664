"""Multi-turn TTFT with and without the prefix cache, on a seeded workload trace.

The trace is replayed once on an engine with the cache (prefix_reuse=True), recording every
conversation it sends; the very same conversations are then sent to an engine built with
prefix_reuse=False. Both engines run one after the other (never two models in memory), one
request at a time, greedy, so TTFT is prefill (and restore) time with no queueing. The first
requests of each engine are an unrelated warm-up (`_warm_up`) and are not counted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ninfer.bench.throughput import greedy
from ninfer.bench.workloads import TRACES, Session, Step, Trace, apply_step, replay
from ninfer.probe import release_memory


def _chat(llm, conv: list[dict], max_tokens: int):
    out = llm.chat([conv], greedy(max_tokens), enable_thinking=False)[0]
    if out.error:
        raise RuntimeError(f"bench ttft: request failed: {out.error}")
    return out


def _warm_up(llm, trace: Trace, max_tokens: int) -> None:
    """Untimed requests before the first timed one: a short one, then one shaped like the
    trace's first conversation (same messages, same lengths) in other words, so that its
    first prefill pass of that size and its decode steps are not the first the engine runs,
    and nothing of it can serve a timed turn from the cache."""
    _chat(llm, [{"role": "user", "content": "warm up"}], 2)
    sessions = trace.sessions
    if sessions and sessions[0].steps:
        first = apply_step([dict(m) for m in sessions[0].prefix], sessions[0].steps[0], "")
        _chat(llm, [_other_words(m) for m in first], max_tokens)


def _other_words(message: dict) -> dict:
    content = message.get("content")
    if not isinstance(content, str):
        return dict(message)
    return {**message, "content": "Warm-up. " + " ".join(reversed(content.split()))}


def bench_ttft(make_llm: Callable[..., object], trace: Trace, max_tokens: int = 8) -> dict:
    """`make_llm(**overrides)` builds an engine (used as a context manager)."""
    sent, cached = _replay_cached(make_llm, trace, max_tokens)
    release_memory()  # the cached engine's pools go before the cold engine takes its own
    cold = _send_cold(make_llm, [conv for _, _, conv in sent], max_tokens, trace)
    release_memory()
    rows = []
    for (name, turn, _), hot, base in zip(sent, cached, cold, strict=True):
        rows.append({
            "session": name,
            "turn": turn,
            "prompt_tokens": hot.usage.prompt_tokens,
            "cached_tokens": hot.usage.cached_tokens,
            "ttft_cached_s": hot.metrics.ttft_s,
            "ttft_cold_s": base.metrics.ttft_s,
            "speedup": base.metrics.ttft_s / hot.metrics.ttft_s if hot.metrics.ttft_s else None,
        })  # fmt: skip
    prompt = sum(r["prompt_tokens"] for r in rows)
    return {
        "turns": rows,
        "summary": {
            "requests": len(rows),
            "cache_hit_rate": sum(r["cached_tokens"] for r in rows) / prompt if prompt else 0.0,
            "ttft_cached_total_s": sum(r["ttft_cached_s"] for r in rows),
            "ttft_cold_total_s": sum(r["ttft_cold_s"] for r in rows),
        },
    }


def _replay_cached(make_llm, trace: Trace, max_tokens: int):
    sent: list[tuple[str, int, list[dict]]] = []
    outs: list = []
    with make_llm(prefix_reuse=True) as llm:
        _warm_up(llm, trace, max_tokens)

        def respond(session: Session, step: Step, conv: list[dict]) -> str:
            out = _chat(llm, conv, max_tokens)
            sent.append((session.name, sum(s[0] == session.name for s in sent), conv))
            outs.append(out)
            return out.text

        replay(trace, respond)
    return sent, outs


def _send_cold(make_llm, convs: list[list[dict]], max_tokens: int, trace: Trace):
    with make_llm(prefix_reuse=False) as llm:
        _warm_up(llm, trace, max_tokens)
        return [_chat(llm, conv, max_tokens) for conv in convs]


def trace_sessions(name: str, seed: int, turns: int, prompt_tokens: int) -> Trace:
    """A named trace (workloads.TRACES) with `turns` turns per session, its shared prefix about
    `prompt_tokens` tokens (a word is about two tokens; each turn adds a sixth of that)."""
    factory = TRACES[name]
    accepted = inspect.signature(factory).parameters
    words = max(8, prompt_tokens // 2)
    sizes = {"system_words": words, "preamble_words": words, "turn_words": max(4, words // 6)}
    return factory(seed=seed, turns=turns, **{k: v for k, v in sizes.items() if k in accepted})
