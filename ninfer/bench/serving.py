"""Replay a multi-turn agent trace through `ninfer serve` and through `LLM` in-process.

The trace: at each concurrency level (default 1, 4, 8), that many agent sessions run side by
side; a session shares its level's system prompt (a tools description), then runs `--turns`
turns, each a new user message (a tool result) plus a streamed reply of `--reply` tokens that
joins the history. Reported per level: TTFT p50 / p99, per-stream decode tokens/s, the
fraction of prompt tokens served from the cache, and wall time. The same trace runs
in-process through `LLM.stream` (`--inprocess`) or against a running server (`--url`); with
`--compare FILE` (an in-process result) the server's overhead per decoded token is printed.
With `--server-cpu` (and `--url`) the server's own host cost is reported per level from its
/metrics: the CPU time of its event-loop thread (which runs no model code, and competes with
the engine thread for the GIL) per streamed token and per request, loop wake-ups per token
and response writes per token.

    # CPU smoke test (demo model): in-process, then the server in-process too
    python -m ninfer.bench.serving --small --inprocess --json /tmp/inproc.json
    python -m ninfer.bench.serving --small --url http://127.0.0.1:8000 --compare /tmp/inproc.json
    # the server's loop cost per token (demo model on CPU: `ninfer serve` first)
    python -m ninfer.bench.serving --url http://127.0.0.1:8000 --server-cpu --levels 8 --reply 128 \
        --turns 1 --sessions-per-client 1 --system-words 200 --user-words 30

Every figure is a benchmark's, not a test's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from ninfer.cli.main import add_engine_flags, engine_kwargs

WORDS = ("alpha", "delta", "river", "stone", "cloud", "ember", "field", "north", "quartz", "tide")


@dataclass(slots=True)
class Shape:
    system_words: int
    user_words: int
    reply: int
    turns: int
    sessions_per_client: int

    @classmethod
    def from_args(cls, a) -> Shape:
        if a.small:
            return cls(120, 30, 8, 2, 1)
        return cls(a.system_words, a.user_words, a.reply, a.turns, a.sessions_per_client)


@dataclass(slots=True)
class Sample:
    ttft_s: float
    decode_tok_s: float  # (tokens - 1) / (last - first token); 0 with one token
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass(slots=True)
class Level:
    concurrency: int
    requests: int
    wall_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    decode_tok_s_p50: float
    cached_fraction: float
    samples: list[Sample] = field(default_factory=list)
    server_cpu: dict | None = None  # `--server-cpu`: the server's event-loop cost


def _scrape(base: str) -> dict[str, float]:
    """The server's event-loop counters from /metrics (`ninfer_server_loop_*`)."""
    import httpx

    values = {}
    for line in httpx.get(base + "/metrics", timeout=30).text.splitlines():
        if line.startswith("ninfer_server_"):
            name, value = line.rsplit(" ", 1)
            values[name.removesuffix("_total")] = float(value)
    return values


def _loop_cost(before: dict, after: dict, samples: list[Sample]) -> dict:
    """The loop thread's CPU time and wake-ups over one level, per streamed token and per
    request. The loop thread runs no model code (the engine has its own thread), so its CPU
    time is the server's host cost, and it competes with the engine thread for the GIL."""
    tokens = sum(s.completion_tokens for s in samples) or 1
    requests = len(samples) or 1

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    cpu = delta("ninfer_server_loop_cpu_seconds")
    return {
        "tokens": tokens,
        "loop_cpu_s": cpu,
        "loop_cpu_us_per_token": cpu / tokens * 1e6,
        "loop_cpu_ms_per_request": cpu / requests * 1e3,
        "wakeups_per_token": delta("ninfer_server_loop_wakeups") / tokens,
        "writes_per_token": delta("ninfer_server_stream_writes") / tokens,
    }


def _text(n: int, salt: int) -> str:
    return " ".join(f"{WORDS[(i * 7 + salt) % len(WORDS)]}{(i + salt) % 97}" for i in range(n))


def _system(shape: Shape, level: int) -> str:
    """The level's shared system prompt (the warm-up's, level 0, shares nothing with them)."""
    return f"You are coding agent {level}. Tools:\n" + _text(shape.system_words, 1000 + level)


def _user(shape: Shape, session: int, turn: int) -> str:
    return f"Tool result {session}.{turn}:\n" + _text(shape.user_words, 31 * session + turn)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def _level(concurrency: int, samples: list[Sample], wall_s: float) -> Level:
    ttft = [s.ttft_s * 1e3 for s in samples]
    prompt = sum(s.prompt_tokens for s in samples)
    return Level(
        concurrency=concurrency,
        requests=len(samples),
        wall_s=wall_s,
        ttft_p50_ms=_pct(ttft, 0.5),
        ttft_p99_ms=_pct(ttft, 0.99),
        decode_tok_s_p50=statistics.median([s.decode_tok_s for s in samples] or [0.0]),
        cached_fraction=sum(s.cached_tokens for s in samples) / prompt if prompt else 0.0,
        samples=samples,
    )


# ---- in-process ------------------------------------------------------------------------------
def _inprocess_session(llm, shape: Shape, params, system: str, s: int, out: list[Sample]):
    """One session's turns through `LLM.stream`, a sample per turn appended to `out`."""
    from ninfer.request import RequestOutput

    history = [{"role": "system", "content": system}]
    for t in range(shape.turns):
        history.append({"role": "user", "content": _user(shape, s, t)})
        t0 = time.perf_counter()
        first = last = None
        text = ""
        final = None
        for event in llm.stream(history, params, enable_thinking=False):
            now = time.perf_counter()
            if isinstance(event, RequestOutput):
                final = event
                continue
            if event.token_ids:
                first = first or now
                last = now
            text += event.text
        n = final.usage.completion_tokens
        decode = (n - 1) / (last - first) if n > 1 and last > first else 0.0
        out.append(
            Sample(first - t0, decode, final.usage.prompt_tokens, final.usage.cached_tokens, n)
        )
        history.append({"role": "assistant", "content": text})


def run_inprocess(llm, shape: Shape, levels: list[int], warm: bool = False) -> list[Level]:
    from ninfer.request import SamplingParams

    params = SamplingParams(max_tokens=shape.reply, temperature=0, ignore_eos=True)
    results = []
    for c in levels:
        samples: list[Sample] = []
        system = _system(shape, 0 if warm else c)
        threads = [
            threading.Thread(
                target=_inprocess_session, args=(llm, shape, params, system, s, samples)
            )
            for s in range(1000 * warm, 1000 * warm + c * shape.sessions_per_client)
        ]
        # at most c sessions at once: start them in waves of c
        t0 = time.perf_counter()
        for i in range(0, len(threads), c):
            wave = threads[i : i + c]
            for th in wave:
                th.start()
            for th in wave:
                th.join()
        results.append(_level(c, samples, time.perf_counter() - t0))
    return results


# ---- against a server ------------------------------------------------------------------------
async def _serve_session(client, url: str, model: str, shape, level: int, s: int, out) -> None:
    """One session's turns (level 0: the warm-up's own prompts)."""
    history = [{"role": "system", "content": _system(shape, level)}]
    for t in range(shape.turns):
        history.append({"role": "user", "content": _user(shape, s, t)})
        body = {
            "model": model,
            "messages": history,
            "max_tokens": shape.reply,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False},
            "return_token_ids": True,  # tokens are timed even when they decode to no text
        }
        t0 = time.perf_counter()
        first = last = None
        text, usage = "", None
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {await r.aread()!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk["choices"]:
                    text += choice["delta"].get("content") or ""
                    if choice.get("token_ids"):
                        now = time.perf_counter()
                        first = first or now
                        last = now
        n = usage["completion_tokens"]
        first = first or time.perf_counter()
        decode = (n - 1) / (last - first) if n > 1 and last and last > first else 0.0
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        out.append(Sample(first - t0, decode, usage["prompt_tokens"], cached, n))
        history.append({"role": "assistant", "content": text})


def run_server(
    base: str, shape: Shape, levels: list[int], warm: bool = False, cpu: bool = False
) -> list[Level]:
    import httpx

    model = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
    url = base + "/v1/chat/completions"

    async def level(c: int) -> Level:
        samples: list[Sample] = []
        sem = asyncio.Semaphore(c)
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=c)) as cl:

            async def bounded(s: int) -> None:
                async with sem:
                    level, session = (0, s + 1000) if warm else (c, s)
                    await _serve_session(cl, url, model, shape, level, session, samples)

            t0 = time.perf_counter()
            await asyncio.gather(*(bounded(s) for s in range(c * shape.sessions_per_client)))
            return _level(c, samples, time.perf_counter() - t0)

    results = []
    for c in levels:
        before = _scrape(base) if cpu else {}
        lv = asyncio.run(level(c))
        if cpu:
            lv.server_cpu = _loop_cost(before, _scrape(base), lv.samples)
        results.append(lv)
    return results


# ---- the report ------------------------------------------------------------------------------
def _print(title: str, levels: list[Level]) -> None:
    print(title)
    print("  conc  reqs   wall s   TTFT p50 ms  TTFT p99 ms  decode tok/s  cached")
    for lv in levels:
        print(
            f"  {lv.concurrency:4d}  {lv.requests:4d}  {lv.wall_s:7.2f}  {lv.ttft_p50_ms:11.1f}"
            f"  {lv.ttft_p99_ms:11.1f}  {lv.decode_tok_s_p50:12.1f}  {lv.cached_fraction:6.1%}"
        )
    for lv in levels:
        if lv.server_cpu:
            c = lv.server_cpu
            print(
                f"  conc {lv.concurrency}: server loop CPU {c['loop_cpu_us_per_token']:.0f} us"
                f"/token ({c['loop_cpu_ms_per_request']:.1f} ms/request, {c['tokens']} tokens),"
                f" {c['wakeups_per_token']:.2f} wake-ups/token,"
                f" {c['writes_per_token']:.2f} SSE writes/token"
            )


def _overhead(server: list[Level], inproc: list[dict]) -> list[dict]:
    rows = []
    by_c = {lv["concurrency"]: lv for lv in inproc}
    for lv in server:
        ref = by_c.get(lv.concurrency)
        if ref is None or not lv.decode_tok_s_p50:
            continue
        per_token = ref["decode_tok_s_p50"] / lv.decode_tok_s_p50 - 1.0
        rows.append(
            {
                "concurrency": lv.concurrency,
                "decode_overhead_per_token": per_token,
                "ttft_p50_delta_ms": lv.ttft_p50_ms - ref["ttft_p50_ms"],
            }
        )
    return rows


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--url", help="a running `ninfer serve`, e.g. http://127.0.0.1:8000")
    mode.add_argument("--inprocess", action="store_true", help="through LLM in this process")
    p.add_argument("--levels", default="1,4,8", help="concurrency levels (default 1,4,8)")
    p.add_argument("--small", action="store_true", help="a tiny trace (CPU smoke test)")
    p.add_argument("--system-words", type=int, default=1500)
    p.add_argument("--user-words", type=int, default=250)
    p.add_argument("--reply", type=int, default=128, help="tokens per reply")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--sessions-per-client", type=int, default=2)
    p.add_argument("--compare", help="an in-process JSON result: print the server's overhead")
    p.add_argument(
        "--server-cpu",
        action="store_true",
        help="with --url: the server's event-loop CPU time and wake-ups per streamed token",
    )
    p.add_argument("--json", help="write the result here")
    p.add_argument("--preset", help="in-process: a preset's random weights (as ninfer serve)")
    add_engine_flags(p)  # in-process: `ninfer`'s engine flags (--model: a checkpoint folder)
    return p.parse_args(argv)


def _llm(a):
    engine = engine_kwargs(a)
    if a.preset:
        from ninfer.bench.suite import BenchSpec, load

        return load(BenchSpec(parts=[], preset=a.preset, engine=engine)).make_llm(engine)
    from ninfer.llm import LLM

    return LLM(**engine)


def main(argv=None) -> int:
    a = _args(argv)
    shape = Shape.from_args(a)
    levels = [int(x) for x in a.levels.split(",")]
    if a.inprocess:
        llm = _llm(a)
        try:
            warm = Shape(shape.system_words, shape.user_words, shape.reply, 1, 1)
            run_inprocess(llm, warm, [1], warm=True)  # first passes, graphs
            result = run_inprocess(llm, shape, levels)
        finally:
            llm.close(save=False)
        title = "in-process (LLM.stream)"
    else:
        warm = Shape(shape.system_words, shape.user_words, shape.reply, 1, 1)
        run_server(a.url, warm, [1], warm=True)
        result = run_server(a.url, shape, levels, cpu=a.server_cpu)
        title = f"server {a.url}"
    _print(title, result)
    out = {"mode": "inprocess" if a.inprocess else "server", "shape": asdict(shape)}
    out["levels"] = [{k: v for k, v in asdict(lv).items() if k != "samples"} for lv in result]
    if a.compare:
        with open(a.compare) as f:
            ref = json.load(f)
        _print("in-process (from " + a.compare + ")", [Level(**lv) for lv in ref["levels"]])
        out["overhead"] = _overhead(result, ref["levels"])
        for row in out["overhead"]:
            print(
                f"  conc {row['concurrency']}: server decode overhead per token "
                f"{row['decode_overhead_per_token']:+.1%}, TTFT p50 "
                f"{row['ttft_p50_delta_ms']:+.1f} ms"
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
