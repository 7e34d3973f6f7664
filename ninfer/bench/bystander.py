"""Bystander latency under hostile requests: a live `ninfer serve` on the demo model (127.0.0.1
only) streams one ordinary reply and answers /health while clients send a ~30 MB prompt and
n=16 requests with top_logprobs=20 and long replies. Prints the bystander stream's longest gap
between chunks and /health's p50 and max latency (the server's event loop must stay free),
and the machine's load average before and after (the figures mean little on a saturated one).

    python -m ninfer.bench.bystander [--max-body-mib 40] [--reply-tokens 300]
        [--hostile huge,wide,huge,wide] [--device cpu|cuda] [--stall-trace OUT.json]

`--hostile` picks the hostile requests ("huge": the 30 MB chat prompt, refused; "wide": n=16
with top_logprobs=20; "none": the bystander alone), to tell which of them costs what.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

MODEL = "demo"
HEALTH_EVERY_S = 0.02
KINDS = ("huge", "wide", "huge", "wide")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(port: int, args: argparse.Namespace, log) -> subprocess.Popen:
    """The server, its output to `log`; under `ninfer.bench.stalls` with --stall-trace."""
    cmd = [sys.executable, "-m"]
    cmd += ["ninfer.bench.stalls", args.stall_trace, "ninfer"] if args.stall_trace else ["ninfer"]
    cmd += ["serve", "--host", "127.0.0.1", "--port", str(port), "--device", args.device]
    cmd += ["--max-body-mib", str(args.max_body_mib), "--max-model-len", "4096"]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))


async def _wait_up(client, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if (await client.get(url + "/health")).status_code == 200:
                return
        except Exception:  # not listening yet
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("the server did not start")


async def _bystander(client, url: str, tokens: int) -> tuple[float, list[float]]:
    """(seconds to the first token, the gaps between later chunks); the role chunk, sent
    before the engine admits the request, is not counted."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    gaps, last, start = [], None, time.perf_counter()
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or '"role"' in line:
                continue
            now = time.perf_counter()
            if last is not None:
                gaps.append((now - last, now))
            last = now
    return (last or start) - start - sum(g for g, _ in gaps), gaps


async def _health(client, url: str, stop: asyncio.Event) -> list[float]:
    lat = []
    while not stop.is_set():
        t = time.perf_counter()
        await client.get(url + "/health")
        lat.append(time.perf_counter() - t)
        await asyncio.sleep(HEALTH_EVERY_S)
    return lat


def _hostile(url: str, kind: str, tokens: int) -> tuple[int, float]:
    """One hostile request, sent from its own process (so the client's own work, encoding a
    30 MB body or reading a large reply, never delays the measuring loop)."""
    import httpx

    if kind == "huge":
        big = "word " * (30_000_000 // 5)
        body = {"model": MODEL, "messages": [{"role": "user", "content": big}], "max_tokens": 4}
    else:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "List numbers."}],
            "n": 16,
            "max_tokens": tokens,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 20,
        }
    status = httpx.post(url + "/v1/chat/completions", json=body, timeout=600).status_code
    return status, time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes


async def run(port: int, tokens: int, hostile: tuple[str, ...], start_timeout_s: float) -> dict:
    import httpx

    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=600) as client:
        await _wait_up(client, url, start_timeout_s)
        await _bystander(client, url, 8)  # warm
        stop = asyncio.Event()
        health = asyncio.ensure_future(_health(client, url, stop))
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(max(1, len(hostile))) as pool:
            sent = [loop.run_in_executor(pool, _hostile, url, kind, tokens) for kind in hostile]
            await asyncio.sleep(2.0)  # the hostile requests arrive first
            t_begin = time.perf_counter()
            ttft, gaps = await _bystander(client, url, tokens)
            t_end = time.perf_counter()
            answers = await asyncio.gather(*sent)
        stop.set()
        lat = await health
    ms = [g * 1e3 for g, _ in gaps]
    return {
        "bystander_chunks": len(gaps) + 1,
        "bystander_ttft_s": round(ttft, 2),
        "bystander_max_gap_ms": round(max(ms), 1),
        "bystander_p50_gap_ms": round(statistics.median(ms), 1),
        # the longest gaps, each with when it ended, in seconds from the stream's start
        "bystander_worst_gaps": [
            {"ms": round(g * 1e3, 1), "at_s": round(at - t_begin, 3)}
            for g, at in sorted(gaps, reverse=True)[:3]
        ],
        "health_requests": len(lat),
        "health_p50_ms": round(statistics.median(lat) * 1e3, 1),
        "health_max_ms": round(max(lat) * 1e3, 1),
        "hostile": list(hostile),
        "hostile_statuses": [status for status, _ in answers],
        # when each hostile request's answer reached its client, from the stream's start
        "hostile_answered_at_s": [round(at - t_begin, 3) for _, at in answers],
        "window": (t_begin, t_end),
    }


def _trace_in_window(path: str, window: tuple[float, float]) -> dict:
    """The stall trace's collections and stalls during the bystander's stream."""
    with open(path) as f:
        trace = json.load(f)
    begin, end = window
    gcs = [g for g in trace["gc"] if begin <= g["t"] <= end]
    stalls = sorted(
        (s for s in trace["stalls"] if begin <= s["t"] <= end), key=lambda s: -s["late_ms"]
    )
    return {
        "gc_over_5ms": len(gcs),
        "gc_max_ms": max((g["ms"] for g in gcs), default=0.0),
        "gc_generations": sorted({g["generation"] for g in gcs}),
        "stalls_over_30ms": len(stalls),
        "worst_stalls": [
            {"late_ms": s["late_ms"], "threads": {k: v[-2:] for k, v in s["threads"].items()}}
            for s in stalls[:3]
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-body-mib", type=float, default=40.0)
    parser.add_argument("--reply-tokens", type=int, default=300)
    parser.add_argument("--hostile", default=",".join(KINDS), help="huge / wide, or none")
    parser.add_argument("--device", default="cpu", help="the server's device (cpu, cuda)")
    parser.add_argument("--start-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--server-log", default=os.devnull, help="the server's output, to a file")
    parser.add_argument("--stall-trace", help="run the server under ninfer.bench.stalls: JSON")
    args = parser.parse_args(argv)
    hostile = tuple(k for k in args.hostile.split(",") if k and k != "none")
    if any(k not in ("huge", "wide") for k in hostile):
        parser.error("--hostile: a list of huge and wide, or none")
    port = _free_port()
    load = os.getloadavg()[0]
    with open(args.server_log, "w") as log:
        server = _start(port, args, log)
        try:
            figures = asyncio.run(run(port, args.reply_tokens, hostile, args.start_timeout))
        finally:
            server.terminate()
            server.wait(60)
    window = figures.pop("window")
    if args.stall_trace:
        figures["stall_trace"] = _trace_in_window(args.stall_trace, window)
    figures["load_1min"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    figures["cpus"] = os.cpu_count()
    figures["device"] = args.device
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
