"""Seeded workload traces for benchmarks and tests: the access patterns a prefix cache meets.

A trace is a list of sessions; a session is a list of steps replayed in order against one growing
conversation. Each step changes the conversation, then sends it as one request; the engine's
reply is appended as the assistant message (so later turns carry the model's real outputs, as an
agent loop does). Kinds of traces:

    chat       multi-turn chats that all share one system prompt
    agent      a tool-calling loop: each tool result echoes the previous assistant output
    subagents  several sessions that share a long preamble, then diverge
    edits      a long chat in which a message deep in the history is edited, then resent
    retries    a chat whose last reply is regenerated (same prompt sent again)

Pure data and pure Python: nothing here knows the engine, the tokenizer or torch. Text is drawn
from a fixed word list with `random.Random(seed)`, so a (kind, seed, sizes) triple always gives
the same trace. Sizes are in words; a word is a few tokens under any tokenizer.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

_WORD_LIST = (
    "cache prefix block snapshot state token layer model engine request prompt reply tool "
    "agent system user memory page slot host device copy restore tap ladder chunk decode "
    "prefill batch lane queue budget bytes tier index tree node hit miss evict pin write "
    "read the a of to and in is it for on with as at by from this that which when after"
)
WORDS = tuple(_WORD_LIST.split())


@dataclass(frozen=True, slots=True)
class Step:
    """One change to the conversation followed by one request.

    op: "append"  add `messages` (user turns, tool results with literal content)
        "echo"    add a tool message whose content quotes the previous assistant reply
        "edit"    replace the content of message `index` (kept in place; nothing is cut)
        "retry"   drop the last assistant reply and send the same conversation again
    """

    op: str
    messages: tuple[dict, ...] = ()
    index: int = -1
    content: str = ""
    max_tokens: int = 16


@dataclass(slots=True)
class Session:
    name: str
    prefix: list[dict]  # the conversation before the first step (system prompt, preamble)
    steps: list[Step] = field(default_factory=list)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def chat_trace(
    seed: int = 0, sessions: int = 2, turns: int = 4, system_words: int = 200, turn_words: int = 30
) -> list[Session]:
    rng = random.Random(seed)
    system = [
        {"role": "system", "content": "You are a helpful assistant. " + words(rng, system_words)}
    ]
    return [
        Session(
            f"chat{s}",
            list(system),
            [_user(rng, turn_words) for _ in range(turns)],
        )
        for s in range(sessions)
    ]


def agent_trace(
    seed: int = 0, sessions: int = 1, turns: int = 6, system_words: int = 200, turn_words: int = 30
) -> list[Session]:
    rng = random.Random(seed)
    tools = "Tools: search(query), read(path), run(cmd). " + words(rng, system_words)
    out = []
    for s in range(sessions):
        steps = [_user(rng, turn_words)]
        steps += [Step("echo") for _ in range(turns - 1)]
        out.append(Session(f"agent{s}", [{"role": "system", "content": tools}], steps))
    return out


def subagent_trace(
    seed: int = 0,
    sessions: int = 4,
    turns: int = 2,
    preamble_words: int = 600,
    turn_words: int = 30,
) -> list[Session]:
    rng = random.Random(seed)
    preamble = [
        {"role": "system", "content": "You are a sub-agent. " + words(rng, preamble_words // 2)},
        {"role": "user", "content": "Shared context: " + words(rng, preamble_words // 2)},
        {"role": "assistant", "content": "Understood."},
    ]
    return [
        Session(f"sub{s}", list(preamble), [_user(rng, turn_words) for _ in range(turns)])
        for s in range(sessions)
    ]


def edit_trace(
    seed: int = 0, turns: int = 6, system_words: int = 200, turn_words: int = 30
) -> list[Session]:
    """One chat of `turns` turns, then an edit of the first user message (deep in the history)."""
    rng = random.Random(seed)
    system = [{"role": "system", "content": words(rng, system_words)}]
    steps = [_user(rng, turn_words) for _ in range(turns)]
    steps.append(Step("edit", index=1, content="Edited: " + words(rng, turn_words)))
    return [Session("edits", system, steps)]


def retry_trace(
    seed: int = 0, turns: int = 3, retries: int = 2, system_words: int = 200, turn_words: int = 30
) -> list[Session]:
    rng = random.Random(seed)
    system = [{"role": "system", "content": words(rng, system_words)}]
    steps = [_user(rng, turn_words) for _ in range(turns)]
    steps += [Step("retry") for _ in range(retries)]
    return [Session("retries", system, steps)]


TRACES: dict[str, Callable[..., list[Session]]] = {
    "chat": chat_trace,
    "agent": agent_trace,
    "subagents": subagent_trace,
    "edits": edit_trace,
    "retries": retry_trace,
}


def _user(rng: random.Random, n: int) -> Step:
    return Step("append", ({"role": "user", "content": words(rng, n)},))


def replay(session: Session, respond: Callable[[list[dict], Step], str]) -> Iterator[list[dict]]:
    """Applies each step and calls `respond(conversation, step)` -> reply text.

    Yields the conversation after each reply was appended. `respond` gets a copy it may keep.
    """
    conv = [dict(m) for m in session.prefix]
    last_reply = ""
    for step in session.steps:
        conv = apply_step(conv, step, last_reply)
        last_reply = respond([dict(m) for m in conv], step)
        conv.append({"role": "assistant", "content": last_reply})
        yield conv


def apply_step(conv: list[dict], step: Step, last_reply: str) -> list[dict]:
    """The conversation to send for `step` (a new list; `conv` is not changed)."""
    conv = list(conv)
    if step.op == "append":
        conv += [dict(m) for m in step.messages]
    elif step.op == "echo":
        conv.append({"role": "tool", "content": f"output of the last call: {last_reply}"})
    elif step.op == "edit":
        conv[step.index] = {**conv[step.index], "content": step.content}
        if conv[-1]["role"] == "assistant":
            conv.append({"role": "user", "content": "Continue with the edited context."})
    elif step.op == "retry":
        if conv and conv[-1]["role"] == "assistant":
            conv.pop()
    else:
        raise ValueError(f"unknown step op {step.op!r}")
    return conv
