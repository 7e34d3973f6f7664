"""Seeded workload traces: deterministic, and each kind has the shape its name promises."""

from __future__ import annotations

import pytest

from ninfer.bench.workloads import (
    TRACES,
    Step,
    agent_trace,
    apply_step,
    chat_trace,
    edit_trace,
    replay,
    retry_trace,
    subagent_trace,
)


def run(sessions):
    """Replays every session with a fake model; returns the conversations sent, per session."""
    sent = {}
    for s in sessions:
        calls = sent.setdefault(s.name, [])

        def respond(conv, step, calls=calls):
            calls.append(conv)
            return f"reply {len(calls)}"

        for _ in replay(s, respond):
            pass
    return sent


@pytest.mark.parametrize("kind", sorted(TRACES))
def test_same_seed_same_trace_other_seed_other_trace(kind):
    make = TRACES[kind]
    assert make(seed=3) == make(seed=3)
    assert make(seed=3) != make(seed=4)


def test_chat_sessions_share_the_system_prompt_and_grow():
    sessions = chat_trace(seed=1, sessions=3, turns=4)
    assert len({s.prefix[0]["content"] for s in sessions}) == 1
    for convs in run(sessions).values():
        assert len(convs) == 4
        assert [len(c) for c in convs] == [2, 4, 6, 8]
        for earlier, later in zip(convs, convs[1:], strict=False):
            assert later[: len(earlier)] == earlier  # each turn extends the previous one


def test_agent_tool_results_echo_the_previous_reply():
    (convs,) = run(agent_trace(seed=0, turns=4)).values()
    for i in range(1, 4):
        tool = convs[i][-1]
        assert tool["role"] == "tool"
        assert tool["content"].endswith(f"reply {i}")


def test_subagents_share_a_long_preamble_then_diverge():
    sessions = subagent_trace(seed=0, sessions=4, preamble_words=400)
    assert all(s.prefix == sessions[0].prefix for s in sessions)
    assert sum(len(m["content"].split()) for m in sessions[0].prefix) > 400
    firsts = [convs[0][-1]["content"] for convs in run(sessions).values()]
    assert len(set(firsts)) == 4


def test_edit_changes_a_deep_message_and_keeps_the_rest():
    (convs,) = run(edit_trace(seed=0, turns=5)).values()
    before, after = convs[-2], convs[-1]
    assert after[1]["content"].startswith("Edited: ")
    assert after[1] != before[1]
    assert after[0] == before[0]
    assert after[2 : len(before)] == before[2:]  # everything after the edit is kept
    assert after[len(before)] == {"role": "assistant", "content": "reply 5"}
    assert after[-1]["role"] == "user" and len(after) == len(before) + 2


def test_retry_resends_the_same_conversation():
    (convs,) = run(retry_trace(seed=0, turns=3, retries=2)).values()
    assert convs[2] == convs[3] == convs[4]
    assert convs[3][-1]["role"] == "user"


def test_apply_step_does_not_change_its_input():
    conv = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    copy = [dict(m) for m in conv]
    apply_step(conv, Step("edit", index=0, content="z"), "b")
    apply_step(conv, Step("retry"), "b")
    assert conv == copy
    with pytest.raises(ValueError, match="unknown step"):
        apply_step(conv, Step("bogus"), "")
