"""Prometheus metrics of one server: requests, tokens, TTFT and decode histograms, every field
of the engine's `cache_stats()` (read at scrape time) as `ninfer_cache_<field>`, with
speculative decoding its counters (`speculation_stats()`) as `ninfer_spec_*`, and the
server's event-loop cost (`ninfer_server_*`)."""

from __future__ import annotations

import time
from dataclasses import fields

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ninfer.request import RequestOutput

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1)


class _CacheCollector:
    def __init__(self, stats) -> None:
        self._stats = stats  # () -> CacheStats

    def collect(self):
        try:
            stats = self._stats()
        except RuntimeError:  # the engine is closed
            return
        for f in fields(stats):
            value = getattr(stats, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            yield GaugeMetricFamily(f"ninfer_cache_{f.name}", f"cache_stats().{f.name}", value)


# SpeculationStats field -> (metric name, help): the counters vLLM exposes as
# spec_decode_num_{drafts, draft_tokens, accepted_tokens}, and the tokens the rows yielded
_SPEC_COUNTERS = {
    "verify_rows": ("ninfer_spec_verify_rows", "speculative verify rows run"),
    "drafted": ("ninfer_spec_draft_tokens", "draft tokens proposed"),
    "accepted": ("ninfer_spec_accepted_tokens", "draft tokens accepted"),
    "emitted": ("ninfer_spec_emitted_tokens", "tokens the verify rows yielded"),
    "head_faults": ("ninfer_spec_head_faults", "draft head passes that raised (drafts lost)"),
}


class _SpecCollector:
    """The speculation counters, read at scrape time (nothing with speculation off)."""

    def __init__(self, stats) -> None:
        self._stats = stats  # () -> SpeculationStats | None

    def collect(self):
        try:
            stats = self._stats()
        except RuntimeError:  # the engine is closed
            return
        if stats is None:
            return
        for field, (name, text) in _SPEC_COUNTERS.items():
            yield CounterMetricFamily(name, text, getattr(stats, field))


class _LoopCollector:
    """The server's own host cost: its event loop's CPU time (the loop thread runs no model
    code, and it competes with the engine thread for the GIL), loop wake-ups for engine
    events, and streamed body writes (`python -m ninfer.bench.serving --server-cpu` divides them
    by the tokens streamed)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self):
        m = self._metrics
        yield CounterMetricFamily(
            "ninfer_server_stream_writes", "response body writes on the server", m.stream_writes
        )
        loop = m.loop_stats() if m.loop_stats is not None else None
        thread, wakeups = loop if loop is not None else (None, 0)  # None: no request yet
        cpu = None
        if thread is not None:
            try:
                cpu = time.clock_gettime(time.pthread_getcpuclockid(thread))
            except (AttributeError, OSError):  # no per-thread clocks here, or the thread ended
                cpu = None
        if cpu is not None:
            yield CounterMetricFamily(
                "ninfer_server_loop_cpu_seconds", "CPU time of the event-loop thread", cpu
            )
        yield CounterMetricFamily(
            "ninfer_server_loop_wakeups", "loop callbacks that delivered engine events", wakeups
        )


class ServerMetrics:
    def __init__(self, cache_stats, speculation_stats=lambda: None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "ninfer_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.prompt_tokens = Counter("ninfer_prompt_tokens", "prompt tokens", registry=r)
        self.cached_tokens = Counter(
            "ninfer_cached_tokens", "prompt tokens served from the prefix cache", registry=r
        )
        self.completion_tokens = Counter("ninfer_completion_tokens", "generated tokens", registry=r)
        self.finished = Counter(
            "ninfer_request_finish", "finished requests by reason", ["reason"], registry=r
        )
        self.ttft = Histogram(
            "ninfer_ttft_seconds", "time to first token", buckets=_TTFT_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "ninfer_decode_seconds_per_token",
            "decode time per generated token after the first",
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("ninfer_requests_in_flight", "requests being served", registry=r)
        r.register(_CacheCollector(cache_stats))
        r.register(_SpecCollector(speculation_stats))
        self.stream_writes = 0  # response body messages sent (counted by the app's middleware)
        self.loop_stats = None  # () -> (loop thread id, wake-ups) | None: the driver's
        r.register(_LoopCollector(self))

    def observe(self, out: RequestOutput) -> None:
        u, m = out.usage, out.metrics
        self.prompt_tokens.inc(u.prompt_tokens)
        self.cached_tokens.inc(u.cached_tokens)
        self.completion_tokens.inc(u.completion_tokens)
        self.finished.labels(out.finish_reason or "none").inc()
        if u.completion_tokens:
            self.ttft.observe(m.ttft_s)
        if u.completion_tokens > 1 and m.decode_s > 0:
            self.tpot.observe(m.decode_s / (u.completion_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
