"""Seeded workload traces: deterministic, and each kind has the shape its name promises."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.bench.workloads import (
    REUSE_TRACES,
    TRACES,
    Session,
    Step,
    Trace,
    agent_trace,
    apply_step,
    chat_trace,
    edit_trace,
    replay,
    retry_trace,
    subagent_trace,
)

VOCAB = 1000


def run(trace: Trace) -> list[tuple[str, list]]:
    """Replays `trace` with a fake model; returns (session, prompt) per request, in order.

    A conversation's reply is "reply N" (N counts the requests); a raw session's is [N] * 3.
    """
    sent: list[tuple[str, list]] = []

    def respond(session: Session, step: Step, prompt: list):
        sent.append((session.name, prompt))
        return [len(sent)] * 3 if session.raw else f"reply {len(sent)}"

    replay(trace, respond)
    return sent


def per_session(trace: Trace) -> dict[str, list]:
    out: dict[str, list] = {}
    for name, prompt in run(trace):
        out.setdefault(name, []).append(prompt)
    return out


@pytest.mark.parametrize("kind", sorted(TRACES))
def test_same_seed_same_trace_other_seed_other_trace(kind):
    make = TRACES[kind]
    assert make(seed=3) == make(seed=3)
    assert make(seed=3) != make(seed=4)


@pytest.mark.parametrize("kind", sorted(REUSE_TRACES))
def test_reuse_trace_same_seed_same_trace_other_seed_other_trace(kind):
    make = REUSE_TRACES[kind]
    assert make(3, VOCAB, 0.5) == make(3, VOCAB, 0.5)
    assert make(3, VOCAB, 0.5) != make(4, VOCAB, 0.5)


@pytest.mark.parametrize("kind", sorted(REUSE_TRACES))
def test_reuse_trace_sends_every_step_once_in_its_order(kind):
    trace = REUSE_TRACES[kind](0, VOCAB, 0.25)
    arrivals = trace.arrivals()
    for i, session in enumerate(trace.sessions):
        assert arrivals.count(i) == len(session.steps)
    assert [name for name, _ in run(trace)] == [trace.sessions[i].name for i in arrivals]


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(sorted(REUSE_TRACES)), st.integers(0, 10**6))
def test_reuse_trace_raw_tokens_stay_clear_of_special_ids(kind, seed):
    for session in REUSE_TRACES[kind](seed, VOCAB, 0.1).sessions:
        if session.raw:
            ids = [*session.prefix, *(t for step in session.steps for t in step.tokens)]
            assert ids and all(4 <= t < VOCAB - 60 for t in ids)


def test_chat_sessions_share_the_system_prompt_and_grow():
    trace = chat_trace(seed=1, sessions=3, turns=4)
    assert len({s.prefix[0]["content"] for s in trace.sessions}) == 1
    for convs in per_session(trace).values():
        assert [len(c) for c in convs] == [2, 4, 6, 8]
        for earlier, later in zip(convs, convs[1:], strict=False):
            assert later[: len(earlier)] == earlier  # each turn extends the previous one


def test_agent_tool_results_echo_the_previous_reply():
    (convs,) = per_session(agent_trace(seed=0, turns=4)).values()
    for i in range(1, 4):
        tool = convs[i][-1]
        assert tool["role"] == "tool"
        assert tool["content"].endswith(f"reply {i}")


def test_subagents_share_a_long_preamble_then_diverge():
    trace = subagent_trace(seed=0, sessions=4, preamble_words=400)
    assert all(s.prefix == trace.sessions[0].prefix for s in trace.sessions)
    assert sum(len(m["content"].split()) for m in trace.sessions[0].prefix) > 400
    firsts = [convs[0][-1]["content"] for convs in per_session(trace).values()]
    assert len(set(firsts)) == 4


def test_edit_changes_a_deep_message_and_keeps_the_rest():
    (convs,) = per_session(edit_trace(seed=0, turns=5)).values()
    before, after = convs[-2], convs[-1]
    assert after[1]["content"].startswith("Edited: ")
    assert after[1] != before[1]
    assert after[0] == before[0]
    assert after[2 : len(before)] == before[2:]  # everything after the edit is kept
    assert after[len(before)] == {"role": "assistant", "content": "reply 5"}
    assert after[-1]["role"] == "user" and len(after) == len(before) + 2


def test_retry_resends_the_same_conversation():
    (convs,) = per_session(retry_trace(seed=0, turns=3, retries=2)).values()
    assert convs[2] == convs[3] == convs[4]
    assert convs[3][-1]["role"] == "user"


def _extends_with_reply(earlier: list, later: list, reply: list) -> bool:
    return later[: len(earlier) + len(reply)] == earlier + reply and len(later) > len(earlier)


def test_reuse_agent_sends_each_prompt_and_reply_back_plus_a_tool_result():
    trace = REUSE_TRACES["agent"](0, VOCAB, 0.5)
    sent = [prompt for _, prompt in run(trace)]
    assert len(sent) == 8 and len(sent[0]) == 300
    for n, (earlier, later) in enumerate(zip(sent, sent[1:], strict=False), start=1):
        assert _extends_with_reply(earlier, later, [n] * 3)


def test_reuse_subagents_fork_one_raw_preamble_round_robin():
    trace = REUSE_TRACES["subagents"](0, VOCAB, 0.5)
    sent = run(trace)
    assert [name for name, _ in sent] == ["sub0", "sub1", "sub2", "sub3"] * 3
    firsts = [prompt for _, prompt in sent[:4]]
    assert all(p[:1000] == firsts[0][:1000] for p in firsts)  # a 2000 x 0.5 preamble
    assert len({tuple(p[1000:]) for p in firsts}) == 4  # then each its own task
    for k in range(4, 12):  # a sub-agent's next turn: its prompt, its reply, a tool result
        assert _extends_with_reply(sent[k - 4][1], sent[k][1], [k - 3] * 3)


def test_reuse_chat_goes_on_with_every_reply_in_the_history():
    convs = [prompt for _, prompt in run(REUSE_TRACES["chat"](0, VOCAB, 1.0))]
    assert [len(c) for c in convs] == [2 + 2 * i for i in range(8)]
    for n, (earlier, later) in enumerate(zip(convs, convs[1:], strict=False), start=1):
        assert later[: len(earlier) + 1] == [
            *earlier,
            {"role": "assistant", "content": f"reply {n}"},
        ]
    assert {
        step.max_tokens for s in REUSE_TRACES["chat"](0, VOCAB, 1.0).sessions for step in s.steps
    } <= {2, 8, 24, 64}


def test_reuse_edit_rewrites_turn_6_and_drops_what_followed():
    convs = [prompt for _, prompt in run(REUSE_TRACES["edit"](0, VOCAB, 1.0))]
    assert len(convs) == 11
    eighth, edited = convs[7], convs[8]
    assert edited[:11] == eighth[:11] and len(edited) == 12
    assert edited[11]["role"] == "user" and edited[11] != eighth[11]
    for earlier, later in zip(convs[8:], convs[9:], strict=False):
        assert later[: len(earlier)] == earlier


def test_reuse_retry_regenerates_each_chat_s_third_turn():
    trace = REUSE_TRACES["retry"](0, VOCAB, 1.0)
    sent = run(trace)
    assert [name for name, _ in sent] == [f"retry{i}" for i in (0, 0, 1, 1, 2, 2, 0, 1, 2, 0, 1, 2)]
    for third, again in zip(sent[6:9], sent[9:], strict=True):
        assert again == third and len(third[1]) == 6 and third[1][-1]["role"] == "user"


def test_reuse_noreply_resends_each_prompt_without_the_reply():
    trace = REUSE_TRACES["noreply"](0, VOCAB, 0.5)
    assert not any(s.keeps_replies for s in trace.sessions)
    sent = per_session(trace)
    assert sum(len(p) for p in sent.values()) == 34
    assert [len(p) for p in sent["agent"]] == [1024 + 250 * i for i in range(10)]
    assert [len(c) for c in sent["chat"]] == list(range(2, 14))  # a user turn each, no reply
    for prompts in sent.values():
        for earlier, later in zip(prompts, prompts[1:], strict=False):
            assert later[: len(earlier)] == earlier and len(later) > len(earlier)
    forks = [sent[f"sub{i}"][0] for i in range(4)]
    assert all(p[:750] == forks[0][:750] for p in forks)  # a 1500 x 0.5 preamble


def test_apply_step_does_not_change_its_input():
    conv = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    copy = [dict(m) for m in conv]
    apply_step(conv, Step("edit", index=0, content="z"), "b")
    apply_step(conv, Step("retry"), "b")
    apply_step(conv, Step("rewind", ({"role": "user", "content": "c"},), index=1), "b")
    assert conv == copy
    with pytest.raises(ValueError, match="unknown step"):
        apply_step(conv, Step("bogus"), "")
    with pytest.raises(ValueError, match="raw-token session"):
        apply_step([1, 2], Step("retry"), "", raw=True)
