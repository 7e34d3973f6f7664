"""A bounded load on localhost: concurrent streaming clients over shared prefixes, some of them
disconnecting mid-stream. No response lost, duplicated or mixed up, no 5xx, and the engine ends
idle with every cache invariant holding and no page held by a request."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest
from server_helpers import MODEL, engine_idle

CLIENTS = 32
REQUESTS = 192
DISCONNECT_EVERY = 8  # every 8th request leaves after its first chunk
TIME_LIMIT_S = 120


def _conversation(rng: random.Random, i: int) -> list[dict]:
    """One of 4 shared system prompts, a user turn of varying length (so the prompt length
    tells the requests apart) and sometimes a shared first exchange."""
    system = f"You are assistant {i % 4}. " + " ".join(f"rule{k}" for k in range(40 + 10 * (i % 4)))
    messages = [{"role": "system", "content": system}]
    if i % 3 == 0:
        messages += [
            {"role": "user", "content": "Start the log."},
            {"role": "assistant", "content": "Log started."},
        ]
    words = " ".join(f"w{rng.randrange(50)}" for _ in range(5 + i % 37))
    messages.append({"role": "user", "content": f"Request {i}: {words}"})
    return messages


async def _one(client: httpx.AsyncClient, url: str, i: int, messages, leave: bool) -> dict:
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 4,
        "temperature": 0.8,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    got = {"i": i, "ids": set(), "finishes": 0, "done": 0, "usage": None, "left": leave}
    async with client.stream("POST", url, json=body) as r:
        got["status"] = r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                got["done"] += 1
                continue
            chunk = json.loads(line[6:])
            got["ids"].add(chunk["id"])
            if chunk.get("usage"):
                got["usage"] = chunk["usage"]
            got["finishes"] += sum(1 for c in chunk["choices"] if c.get("finish_reason"))
            if leave:
                break
    return got


@pytest.mark.slow
def test_concurrent_streams_with_disconnects(served):
    rng = random.Random(26)
    convos = [_conversation(rng, i) for i in range(REQUESTS)]
    llm = served.llm
    expected = [len(llm.render_chat(c, enable_thinking=False).prompt.token_ids) for c in convos]
    url = served.base + "/chat/completions"

    async def main() -> list[dict]:
        limits = httpx.Limits(max_connections=CLIENTS)
        sem = asyncio.Semaphore(CLIENTS)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:

            async def bounded(i: int) -> dict:
                async with sem:
                    return await _one(client, url, i, convos[i], i % DISCONNECT_EVERY == 3)

            return await asyncio.gather(*(bounded(i) for i in range(REQUESTS)))

    t0 = time.monotonic()
    results = asyncio.run(asyncio.wait_for(main(), TIME_LIMIT_S))
    assert sorted(r["i"] for r in results) == list(range(REQUESTS))
    assert all(r["status"] == 200 for r in results)
    ids = [r["ids"] for r in results]
    assert all(len(s) == 1 for s in ids)
    assert len(set().union(*ids)) == REQUESTS  # one id per request, never shared
    for r in results:
        if r["left"]:
            continue
        assert (r["done"], r["finishes"]) == (1, 1)
        assert r["usage"]["prompt_tokens"] == expected[r["i"]]  # its own prompt, not another's
        assert r["usage"]["completion_tokens"] >= 1
    cached = sum(
        r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results if r["usage"]
    )
    assert cached > 0  # the shared prefixes were reused
    engine_idle(served.llm, timeout_s=30)
    metrics = httpx.get(served.url + "/metrics").text
    assert 'status="5' not in metrics
    assert time.monotonic() - t0 < TIME_LIMIT_S
