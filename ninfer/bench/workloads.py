"""Seeded workload traces for benchmarks and tests: the access patterns a prefix cache meets.

A trace is a list of sessions and the order in which they send. A session is a list of steps
replayed in order against one growing prompt: a conversation (sent through the chat template)
or raw token ids (sent as they are). Each step changes the prompt, then sends it as one
request; the engine's reply is appended (so later turns carry the model's real outputs, as an
agent loop does), unless the session drops its replies: a client that resends its prompt
without the reply as generated.

Conversation traces (`TRACES`, `bench ttft`), sized in words:

    chat       multi-turn chats that all share one system prompt
    agent      a tool-calling loop: each tool result echoes the previous assistant output
    subagents  several sessions that share a long preamble, then diverge
    edits      a long chat in which a message deep in the history is edited, then resent
    retries    a chat whose last reply is regenerated (same prompt sent again)

Reuse traces (`REUSE_TRACES`, `bench reuse`), their long parts sized by `scale`, reply lengths
drawn per request:

    agent       an agent loop in raw tokens: each turn sends the previous prompt and reply
                token for token, plus a tool result (8 turns from 600 tokens)
    subagents   4 sub-agents x 3 turns over one 2000-token raw-token preamble (no structural
                boundary at the fork), arriving one after another, round robin
    chat        a chat through the template: the history is re-rendered each turn (the reply's
                reasoning is dropped), short and long replies
    edit        a chat, then a message deep in its history is changed and the chat goes on
    retry       chats whose latest turn is regenerated twice (the same prompt again)
    noreply     clients that resend the previous prompt plus new text without the reply as
                generated (they rewrote or dropped it), 34 requests: a raw-token agent (2048
                tokens, +500 a turn, 10 turns), a chat through the template that drops its
                replies (a 1000-token system prompt, +75 tokens a turn, 12 turns), and 4
                sub-agents x 3 turns forked from one cold 1500-token raw preamble (no boundary
                marks the fork)

Pure data and pure Python: nothing here knows the engine, the tokenizer or torch. Text is drawn
from fixed word lists (`WORDS`; `NOUNS` for the reuse traces) and raw prompts from the token
ids a vocabulary size allows, with `random.Random(seed)`, so a (kind, seed, sizes) triple
always gives the same trace. Sizes are in words (a word is a few tokens under any tokenizer)
or in tokens where the prompt is raw.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

_WORD_LIST = (
    "cache prefix block snapshot state token layer model engine request prompt reply tool "
    "agent system user memory page slot host device copy restore tap ladder chunk decode "
    "prefill batch lane queue budget bytes tier index tree node hit miss evict pin write "
    "read the a of to and in is it for on with as at by from this that which when after"
)
WORDS = tuple(_WORD_LIST.split())
_NOUN_LIST = (
    "river bridge city north stone light market tower garden winter harbor signal copper "
    "meadow lantern orbit canyon ledger thunder velvet"
)
NOUNS = tuple(_NOUN_LIST.split())  # the reuse traces' text


@dataclass(frozen=True, slots=True)
class Step:
    """One change to the prompt followed by one request.

    op: "append"  add `messages` (user turns, tool results with literal content) or `tokens`
        "echo"    add a tool message whose content quotes the previous assistant reply
        "edit"    replace the content of message `index` (kept in place; nothing is cut)
        "rewind"  cut the conversation before message `index`, then add `messages`
        "retry"   drop the last assistant reply and send the same conversation again
    Raw-token sessions take "append" only.
    """

    op: str
    messages: tuple[dict, ...] = ()
    tokens: tuple[int, ...] = ()
    index: int = -1
    content: str = ""
    max_tokens: int = 16


@dataclass(slots=True)
class Session:
    name: str
    # the prompt before the first step: messages (system prompt, preamble), or token ids if raw
    prefix: list
    steps: list[Step] = field(default_factory=list)
    raw: bool = False
    keeps_replies: bool = True  # False: the client resends its prompt without the reply


@dataclass(slots=True)
class Trace:
    sessions: list[Session]
    # the session sending each request, in arrival order; empty: one session after another
    order: list[int] = field(default_factory=list)

    def arrivals(self) -> list[int]:
        if self.order:
            return list(self.order)
        return [i for i, s in enumerate(self.sessions) for _ in s.steps]


def words(rng: random.Random, n: int, vocabulary: Sequence[str] = WORDS) -> str:
    return " ".join(rng.choice(vocabulary) for _ in range(n))


def tokens(rng: random.Random, vocab: int, n: int) -> tuple[int, ...]:
    """`n` token ids clear of the first and last ids (special tokens sit there)."""
    return tuple(rng.randrange(4, vocab - 60) for _ in range(n))


def _user(content: str, max_tokens: int = 16) -> Step:
    return Step("append", ({"role": "user", "content": content},), max_tokens=max_tokens)


# Conversation traces (`bench ttft`)


def chat_trace(
    seed: int = 0, sessions: int = 2, turns: int = 4, system_words: int = 200, turn_words: int = 30
) -> Trace:
    rng = random.Random(seed)
    system = [
        {"role": "system", "content": "You are a helpful assistant. " + words(rng, system_words)}
    ]
    return Trace([
        Session(f"chat{s}", list(system), [_user(words(rng, turn_words)) for _ in range(turns)])
        for s in range(sessions)
    ])  # fmt: skip


def agent_trace(
    seed: int = 0, sessions: int = 1, turns: int = 6, system_words: int = 200, turn_words: int = 30
) -> Trace:
    rng = random.Random(seed)
    tools = "Tools: search(query), read(path), run(cmd). " + words(rng, system_words)
    out = []
    for s in range(sessions):
        steps = [_user(words(rng, turn_words))]
        steps += [Step("echo") for _ in range(turns - 1)]
        out.append(Session(f"agent{s}", [{"role": "system", "content": tools}], steps))
    return Trace(out)


def subagent_trace(
    seed: int = 0,
    sessions: int = 4,
    turns: int = 2,
    preamble_words: int = 600,
    turn_words: int = 30,
) -> Trace:
    rng = random.Random(seed)
    preamble = [
        {"role": "system", "content": "You are a sub-agent. " + words(rng, preamble_words // 2)},
        {"role": "user", "content": "Shared context: " + words(rng, preamble_words // 2)},
        {"role": "assistant", "content": "Understood."},
    ]
    return Trace([
        Session(f"sub{s}", list(preamble), [_user(words(rng, turn_words)) for _ in range(turns)])
        for s in range(sessions)
    ])  # fmt: skip


def edit_trace(
    seed: int = 0, turns: int = 6, system_words: int = 200, turn_words: int = 30
) -> Trace:
    """One chat of `turns` turns, then an edit of the first user message (deep in the history)."""
    rng = random.Random(seed)
    system = [{"role": "system", "content": words(rng, system_words)}]
    steps = [_user(words(rng, turn_words)) for _ in range(turns)]
    steps.append(Step("edit", index=1, content="Edited: " + words(rng, turn_words)))
    return Trace([Session("edits", system, steps)])


def retry_trace(
    seed: int = 0, turns: int = 3, retries: int = 2, system_words: int = 200, turn_words: int = 30
) -> Trace:
    rng = random.Random(seed)
    system = [{"role": "system", "content": words(rng, system_words)}]
    steps = [_user(words(rng, turn_words)) for _ in range(turns)]
    steps += [Step("retry") for _ in range(retries)]
    return Trace([Session("retries", system, steps)])


TRACES: dict[str, Callable[..., Trace]] = {
    "chat": chat_trace,
    "agent": agent_trace,
    "subagents": subagent_trace,
    "edits": edit_trace,
    "retries": retry_trace,
}


# Reuse traces (`bench reuse`): each (seed, vocab, scale) gives one trace. The random draws
# follow the order in which a live client would make them, request after request.

_REPLY_LENGTHS = (2, 8, 24, 64)


def _raw_agent(
    rng: random.Random, vocab: int, start: int, turns: int, tail: Callable[[], int], replies: bool
) -> Session:
    """A raw-token agent: each turn adds a tool result of `tail()` tokens."""
    prefix, steps, result = list(tokens(rng, vocab, start)), [], ()
    for _ in range(turns):
        steps.append(Step("append", tokens=result, max_tokens=rng.randrange(8, 48)))
        result = tokens(rng, vocab, tail())
    return Session("agent", prefix, steps, raw=True, keeps_replies=replies)


def _raw_forks(rng: random.Random, vocab: int, preamble: int, replies: bool) -> list[Session]:
    """4 sub-agents x 3 turns forked from one raw preamble, steps drawn round robin."""
    shared = tokens(rng, vocab, preamble)
    heads = [[*shared, *tokens(rng, vocab, rng.randrange(60, 120))] for _ in range(4)]
    forks = [Session(f"sub{i}", h, raw=True, keeps_replies=replies) for i, h in enumerate(heads)]
    results: list[tuple[int, ...]] = [()] * len(forks)
    for _turn in range(3):
        for i, fork in enumerate(forks):
            fork.steps.append(Step("append", tokens=results[i], max_tokens=rng.randrange(16, 48)))
            results[i] = tokens(rng, vocab, rng.randrange(100, 300))
    return forks


def _careful_chat(rng: random.Random, scale: float, name: str) -> Session:
    """A chat with a careful assistant's system prompt (120 words at scale 1), no steps yet."""
    system = "You are a careful assistant. " + words(rng, int(120 * scale), NOUNS)
    return Session(name, [{"role": "system", "content": system}])


def _chat_turns(rng: random.Random, steps: list[Step], user: str, turns: int) -> str:
    """Adds `turns` steps to `steps`, the first sending `user`, each with a reply length drawn
    when it is sent; returns the next user message (drawn after the last reply, not sent)."""
    for _ in range(turns):
        steps.append(_user(user, rng.choice(_REPLY_LENGTHS)))
        user = words(rng, rng.randrange(5, 60), NOUNS)
    return user


def _reuse_agent(seed: int, vocab: int, scale: float) -> Trace:
    rng = random.Random(seed)
    agent = _raw_agent(rng, vocab, int(600 * scale), 8, lambda: rng.randrange(30, 200), True)
    return Trace([agent])


def _reuse_subagents(seed: int, vocab: int, scale: float) -> Trace:
    forks = _raw_forks(random.Random(seed), vocab, int(2000 * scale), replies=True)
    return Trace(forks, [i for _turn in range(3) for i in range(len(forks))])


def _reuse_chat(seed: int, vocab: int, scale: float) -> Trace:
    rng = random.Random(seed)
    chat = _careful_chat(rng, scale, "chat")
    _chat_turns(rng, chat.steps, words(rng, 40, NOUNS), 8)
    return Trace([chat])


def _reuse_edit(seed: int, vocab: int, scale: float) -> Trace:
    """8 turns, then the user message of turn 6 is rewritten and the chat goes on from there."""
    rng = random.Random(seed)
    chat = _careful_chat(rng, scale, "edit")
    _chat_turns(rng, chat.steps, words(rng, 40, NOUNS), 8)
    edited = len(chat.steps)
    _chat_turns(rng, chat.steps, words(rng, 30, NOUNS), 3)
    # cut before message 11 (the system prompt, (user, assistant) x 5): turn 6's user message
    chat.steps[edited] = replace(chat.steps[edited], op="rewind", index=1 + 2 * 5)
    return Trace([chat])


def _reuse_retry(seed: int, vocab: int, scale: float) -> Trace:
    """3 chats of 2 turns; then each sends a third turn and regenerates it, round robin."""
    rng = random.Random(seed)
    sessions, latest = [], []
    for s in range(3):  # one chat's draws after another's
        sessions.append(_careful_chat(rng, scale, f"retry{s}"))
        latest.append(_chat_turns(rng, sessions[-1].steps, words(rng, 40, NOUNS), 2))
    for session, user in zip(sessions, latest, strict=True):
        session.steps.append(_user(user, rng.choice(_REPLY_LENGTHS[1:])))
    for session in sessions:
        session.steps.append(Step("retry", max_tokens=rng.choice(_REPLY_LENGTHS[1:])))
    return Trace(sessions, [0, 0, 1, 1, 2, 2, 0, 1, 2, 0, 1, 2])


def _reuse_noreply(seed: int, vocab: int, scale: float) -> Trace:
    rng = random.Random(seed)
    agent = _raw_agent(rng, vocab, int(2048 * scale), 10, lambda: int(500 * scale), False)
    system = "You are a careful assistant. " + words(rng, int(1000 * scale), NOUNS)
    chat = Session("chat", [{"role": "system", "content": system}], keeps_replies=False)
    for _ in range(12):
        chat.steps.append(_user(words(rng, int(75 * scale), NOUNS), rng.choice(_REPLY_LENGTHS[1:])))
    forks = _raw_forks(rng, vocab, int(1500 * scale), replies=False)
    order = [0] * len(agent.steps) + [1] * len(chat.steps) + [2, 3, 4, 5] * 3
    return Trace([agent, chat, *forks], order)


REUSE_TRACES: dict[str, Callable[[int, int, float], Trace]] = {
    "agent": _reuse_agent,
    "subagents": _reuse_subagents,
    "chat": _reuse_chat,
    "edit": _reuse_edit,
    "retry": _reuse_retry,
    "noreply": _reuse_noreply,
}


def replay(trace: Trace, respond: Callable[[Session, Step, list], object]) -> None:
    """Sends every request of `trace` in arrival order: `respond(session, step, prompt)` runs
    one and returns its reply (text for a conversation, token ids for a raw session). `prompt`
    is a copy `respond` may keep."""
    prompts = [_copy(s.prefix) for s in trace.sessions]
    replies: list = ["" for _ in trace.sessions]
    sent = [0] * len(trace.sessions)
    for i in trace.arrivals():
        session = trace.sessions[i]
        step = session.steps[sent[i]]
        sent[i] += 1
        prompt = apply_step(prompts[i], step, replies[i], raw=session.raw)
        replies[i] = respond(session, step, _copy(prompt))
        if session.keeps_replies and session.raw:
            prompt += list(replies[i])
        elif session.keeps_replies:
            prompt.append({"role": "assistant", "content": replies[i]})
        prompts[i] = prompt


def _copy(prompt: list) -> list:
    return [dict(m) if isinstance(m, dict) else m for m in prompt]


def apply_step(prompt: list, step: Step, last_reply: str, raw: bool = False) -> list:
    """The prompt to send for `step` (a new list; `prompt` is not changed)."""
    prompt = list(prompt)
    if step.op == "append":
        prompt += list(step.tokens) if raw else [dict(m) for m in step.messages]
    elif raw:
        raise ValueError(f"a raw-token session cannot {step.op!r}")
    elif step.op == "echo":
        prompt.append({"role": "tool", "content": f"output of the last call: {last_reply}"})
    elif step.op == "edit":
        prompt[step.index] = {**prompt[step.index], "content": step.content}
        if prompt[-1]["role"] == "assistant":
            prompt.append({"role": "user", "content": "Continue with the edited context."})
    elif step.op == "rewind":
        prompt = prompt[: step.index] + [dict(m) for m in step.messages]
    elif step.op == "retry":
        if prompt and prompt[-1]["role"] == "assistant":
            prompt.pop()
    else:
        raise ValueError(f"unknown step op {step.op!r}")
    return prompt
