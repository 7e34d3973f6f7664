"""`ninfer bench reuse`: how much of the reusable prefix the engine reuses on seeded traces.

Each trace replays on a fresh engine, request after request (greedy), and every request is
scored against a theoretical bound:

    theoretical(r) = min(n_r - 1, max over earlier requests q of LCP(prompt_r, prompt_q + out_q))
    reused(r)      = usage.cached_tokens of r

that is, the longest prefix of r's prompt that any sequence already run holds (its prompt and
the tokens it generated), less the last prompt token, which is always computed. An engine that
kept every state at every token would reach it; a hybrid model's cache reaches it only where a
snapshot lies. Traces:

    agent       an agent loop: each turn echoes the previous prompt and reply token for token,
                plus a tool result
    subagents   4 sub-agents x 3 turns over one 2000-token raw-token preamble (no structural
                boundary at the fork), arriving one after another, round robin
    chat        a chat through the template: the history is re-rendered each turn (the reply's
                reasoning is dropped), short and long replies
    edit        a chat, then a message deep in its history is changed and the chat goes on
    retry       chats whose latest turn is regenerated twice (the same prompt again)
    noreply     clients that resend the previous prompt plus new text without the reply as
                generated (they rewrote or dropped it), 34 requests on one engine: a raw-token
                agent (2048 tokens, +500 a turn, 10 turns), a chat through the template that
                drops its replies (a 1000-token system prompt, +75 tokens a turn, 12 turns), and
                4 sub-agents x 3 turns forked from one cold 1500-token raw preamble (no boundary
                marks the fork)

The long parts scale with `scale` (`ninfer bench reuse` sizes them by the largest
--prompt-tokens / 2048: at 8192 the noreply trace starts at 8192 tokens and grows by 2000).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ninfer.request import SamplingParams

TRACE_NAMES = ("agent", "subagents", "chat", "edit", "retry", "noreply")

_WORDS = (
    "river",
    "bridge",
    "city",
    "north",
    "stone",
    "light",
    "market",
    "tower",
    "garden",
    "winter",
    "harbor",
    "signal",
    "copper",
    "meadow",
    "lantern",
    "orbit",
    "canyon",
    "ledger",
    "thunder",
    "velvet",
)


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class _Replay:
    """One trace on one engine: runs requests and scores each against the bound."""

    def __init__(self, llm, vocab: int) -> None:
        self.llm, self.vocab = llm, vocab
        self.seen: list[list[int]] = []
        self.reused = self.theoretical = self.requests = 0

    def raw(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(4, self.vocab - 60) for _ in range(n)]

    def _score(self, out) -> object:
        prompt = list(out.prompt_token_ids)
        bound = max((_lcp(prompt, s) for s in self.seen), default=0)
        self.theoretical += min(bound, len(prompt) - 1)
        self.reused += out.usage.cached_tokens
        self.requests += 1
        self.seen.append(prompt + list(out.token_ids))
        return out

    def generate(self, prompt: list[int], max_tokens: int):
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        return self._score(self.llm.generate({"prompt_token_ids": prompt}, params)[0])

    def chat(self, conv: list[dict], max_tokens: int):
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        return self._score(self.llm.chat([conv], params)[0])


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _agent(r: _Replay, rng: random.Random, scale: float) -> None:
    prompt = r.raw(rng, int(600 * scale))
    for _ in range(8):
        out = r.generate(prompt, rng.randrange(8, 48))
        prompt = prompt + list(out.token_ids) + r.raw(rng, rng.randrange(30, 200))


def _subagents(r: _Replay, rng: random.Random, scale: float) -> None:
    preamble = r.raw(rng, int(2000 * scale))
    prompts = [preamble + r.raw(rng, rng.randrange(60, 120)) for _ in range(4)]
    for _turn in range(3):
        for i, prompt in enumerate(prompts):
            out = r.generate(prompt, rng.randrange(16, 48))
            prompts[i] = prompt + list(out.token_ids) + r.raw(rng, rng.randrange(100, 300))


def _conversation(rng: random.Random, scale: float) -> list[dict]:
    system = "You are a careful assistant. " + _words(rng, int(120 * scale))
    return [{"role": "system", "content": system}, {"role": "user", "content": _words(rng, 40)}]


def _chat_turns(r: _Replay, rng: random.Random, conv: list[dict], turns: int) -> list[dict]:
    for _ in range(turns):
        out = r.chat(conv, rng.choice([2, 8, 24, 64]))
        more = {"role": "user", "content": _words(rng, rng.randrange(5, 60))}
        conv = [*conv, {"role": "assistant", "content": out.text}, more]
    return conv


def _chat(r: _Replay, rng: random.Random, scale: float) -> None:
    _chat_turns(r, rng, _conversation(rng, scale), 8)


def _edit(r: _Replay, rng: random.Random, scale: float) -> None:
    conv = _chat_turns(r, rng, _conversation(rng, scale), 8)
    # change the user message of turn 6 of 8 (deep in the history), then go on
    i = 1 + 2 * 5
    edited = [*conv[:i], {"role": "user", "content": _words(rng, 30)}]
    _chat_turns(r, rng, edited, 3)


def _retry(r: _Replay, rng: random.Random, scale: float) -> None:
    convs = [_chat_turns(r, rng, _conversation(rng, scale), 2) for _ in range(3)]
    for _ in range(2):  # regenerate each conversation's latest turn twice
        for conv in convs:
            r.chat(conv, rng.choice([8, 24, 64]))


def _noreply(r: _Replay, rng: random.Random, scale: float) -> None:
    prompt = r.raw(rng, int(2048 * scale))
    for _ in range(10):
        r.generate(prompt, rng.randrange(8, 48))
        prompt = prompt + r.raw(rng, int(500 * scale))
    system = "You are a careful assistant. " + _words(rng, int(1000 * scale))
    conv = [{"role": "system", "content": system}]
    for _ in range(12):
        conv = [*conv, {"role": "user", "content": _words(rng, int(75 * scale))}]
        r.chat(conv, rng.choice([8, 24, 64]))
    preamble = r.raw(rng, int(1500 * scale))
    forks = [preamble + r.raw(rng, rng.randrange(60, 120)) for _ in range(4)]
    for _turn in range(3):
        for i, prompt in enumerate(forks):
            r.generate(prompt, rng.randrange(16, 48))
            forks[i] = prompt + r.raw(rng, rng.randrange(100, 300))


_TRACES: dict[str, Callable[[_Replay, random.Random, float], None]] = {
    "agent": _agent,
    "subagents": _subagents,
    "chat": _chat,
    "edit": _edit,
    "retry": _retry,
    "noreply": _noreply,
}


def bench_reuse(
    make_llm, vocab: int, seed: int = 0, scale: float = 1.0, traces=TRACE_NAMES
) -> dict:
    """Replay each trace on a fresh engine (`make_llm()`, a context manager); per trace and
    overall: requests, reused and theoretical tokens, and their ratio. `scale` multiplies the
    long parts (preambles, first prompts, system prompts); 1.0 is the documented trace."""
    rows = []
    for k, name in enumerate(traces):
        with make_llm() as llm:
            r = _Replay(llm, vocab)
            _TRACES[name](r, random.Random(seed * 1000 + k), scale)
        rows.append(_row(name, r.requests, r.reused, r.theoretical))
    total = _row(
        "overall",
        sum(x["requests"] for x in rows),
        sum(x["reused"] for x in rows),
        sum(x["theoretical"] for x in rows),
    )
    return {"rows": rows, "overall": total}


def _row(name: str, requests: int, reused: int, theoretical: int) -> dict:
    ratio = reused / theoretical if theoretical else 1.0
    return {
        "trace": name,
        "requests": requests,
        "reused": reused,
        "theoretical": theoretical,
        "ratio": ratio,
    }
