"""`ninfer bench reuse`: how much of the reusable prefix the engine reuses on seeded traces.

Each trace (`workloads.REUSE_TRACES`: agent, subagents, chat, edit, retry, noreply) replays on
a fresh engine, request after request (greedy), and every request is scored against a
theoretical bound:

    theoretical(r) = min(n_r - 1, max over earlier requests q of LCP(prompt_r, prompt_q + out_q))
    reused(r)      = usage.cached_tokens of r

that is, the longest prefix of r's prompt that any sequence already run holds (its prompt and
the tokens it generated), less the last prompt token, which is always computed. An engine that
kept every state at every token would reach it; a hybrid model's cache reaches it only where a
snapshot lies.

The long parts scale with `scale` (`ninfer bench reuse` sizes them by the largest
--prompt-tokens / 2048: at 8192 the noreply trace starts at 8192 tokens and grows by 2000).
"""

from __future__ import annotations

from ninfer.bench.workloads import REUSE_TRACES, Session, Step, replay
from ninfer.request import SamplingParams

TRACE_NAMES = tuple(REUSE_TRACES)


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class _Replay:
    """One trace on one engine: runs requests and scores each against the bound."""

    def __init__(self, llm) -> None:
        self.llm = llm
        self.seen: list[list[int]] = []
        self.reused = self.theoretical = self.requests = 0

    def respond(self, session: Session, step: Step, prompt: list) -> str | list[int]:
        """`workloads.replay`'s callback: runs one request; its reply text or token ids."""
        params = SamplingParams(max_tokens=step.max_tokens, temperature=0, ignore_eos=True)
        if session.raw:
            out = self.llm.generate({"prompt_token_ids": prompt}, params)[0]
        else:
            out = self.llm.chat([prompt], params)[0]
        self._score(out)
        return list(out.token_ids) if session.raw else out.text

    def _score(self, out) -> None:
        prompt = list(out.prompt_token_ids)
        bound = max((_lcp(prompt, s) for s in self.seen), default=0)
        self.theoretical += min(bound, len(prompt) - 1)
        self.reused += out.usage.cached_tokens
        self.requests += 1
        self.seen.append(prompt + list(out.token_ids))


def bench_reuse(
    make_llm, vocab: int, seed: int = 0, scale: float = 1.0, traces=TRACE_NAMES
) -> dict:
    """Replay each trace on a fresh engine (`make_llm()`, a context manager); per trace and
    overall: requests, reused and theoretical tokens, and their ratio. `scale` multiplies the
    long parts (preambles, first prompts, system prompts); 1.0 is the documented trace."""
    rows = []
    for k, name in enumerate(traces):
        with make_llm() as llm:
            r = _Replay(llm)
            replay(REUSE_TRACES[name](seed * 1000 + k, vocab, scale), r.respond)
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
