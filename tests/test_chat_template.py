"""Chat rendering vs transformers' apply_chat_template (the real Qwen3.5 template on a tiny
byte-level BPE tokenizer), and the tap hints' positions."""

from __future__ import annotations

import copy
import random

import pytest
from fixtures.tiny_tokenizer import build_tiny_bpe

from ninfer.chat_template import ChatTemplate, prepare_messages, render_chat
from ninfer.demo import DEMO_DIR
from ninfer.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city — in °C",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
]
SYS = {"role": "system", "content": "You are terse.\n"}
U1 = {"role": "user", "content": "Weather in Paris? 🌧 café"}
CALL = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "Need the tool.",
    "tool_calls": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "arguments": {"city": "Paris", "days": 2, "opts": {"u": "C"}, "l": [1, "x"]},
            },
        },
        {"function": {"name": "now", "arguments": {}}},
    ],
}
TOOL1 = {"role": "tool", "content": '{"temp": 12}'}
TOOL2 = {"role": "tool", "content": "10:00"}
A1 = {"role": "assistant", "content": "<think>\nIt is mild.\n</think>\n\nMild, 12 °C."}
U2 = {
    "role": "user",
    "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "Rome?"}],
}
A_PLAIN = {"role": "assistant", "content": "Sunny.", "reasoning": "Guessing."}
A_CONTENT_CALL = {
    "role": "assistant",
    "content": "Let me check.",
    "tool_calls": [{"name": "now", "arguments": {"tz": "UTC"}}],
}

CONVERSATIONS = {
    "user": [U1],
    "system": [SYS, U1],
    "multi_turn_history_reasoning": [SYS, U1, A_PLAIN, U2],
    "agent_loop": [SYS, U1, CALL, TOOL1, TOOL2],
    "agent_done": [SYS, U1, CALL, TOOL1, TOOL2, A1],
    "agent_next_query": [SYS, U1, CALL, TOOL1, TOOL2, A1, U2],
    "content_and_call": [U1, A_CONTENT_CALL, TOOL2, A_PLAIN, U2],
    "tool_response_as_user": [
        U1,
        A_CONTENT_CALL,
        {"role": "user", "content": "<tool_response>\nok\n</tool_response>"},
    ],
}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tiny_bpe(tmp_path_factory.mktemp("tiny_bpe"))


@pytest.fixture(scope="module")
def hf(tok_dir):
    return transformers.AutoTokenizer.from_pretrained(str(tok_dir))


@pytest.fixture(scope="module")
def tmpl(tok_dir):
    return ChatTemplate(Tokenizer.from_dir(tok_dir))


def _hf_ids(hf, messages, **kw):
    return hf.apply_chat_template(copy.deepcopy(messages), tokenize=True, **kw)["input_ids"]


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["notools", "tools"])
@pytest.mark.parametrize("thinking", [None, True, False], ids=["think_default", "think", "nothink"])
@pytest.mark.parametrize("gen", [True, False], ids=["gen", "nogen"])
def test_ids_equal_transformers(hf, tmpl, name, tools, thinking, gen):
    messages = CONVERSATIONS[name]
    kw = {} if thinking is None else {"enable_thinking": thinking}
    want = _hf_ids(hf, messages, tools=tools, add_generation_prompt=gen, **kw)
    got = tmpl.render(messages, tools=tools, add_generation_prompt=gen, enable_thinking=thinking)
    assert got.token_ids == want
    assert got.text == hf.apply_chat_template(
        copy.deepcopy(messages), tools=tools, add_generation_prompt=gen, tokenize=False, **kw
    )


def test_history_reasoning_is_stripped_and_live_reasoning_kept(tmpl):
    text = tmpl.render(CONVERSATIONS["multi_turn_history_reasoning"]).text
    assert "Guessing" not in text
    text = tmpl.render(CONVERSATIONS["agent_done"]).text
    assert "<think>\nNeed the tool.\n</think>" in text and "<think>\nIt is mild.\n</think>" in text


def test_template_errors_are_value_errors(tmpl):
    with pytest.raises(ValueError, match="No user query"):
        tmpl.render([SYS])
    with pytest.raises(ValueError, match="System message must be at the beginning"):
        tmpl.render([U1, SYS])
    with pytest.raises(ValueError):
        tmpl.render([])


def _check_turn_start(tmpl, r, pos):
    tok = tmpl.tokenizer
    assert r.token_ids[pos] == tok.token_to_id("<|im_start|>")
    assert pos == 0 or tok.decode(r.token_ids[:pos]).endswith("<|im_end|>\n")


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["notools", "tools"])
def test_hints_positions(tmpl, name, tools):
    messages = CONVERSATIONS[name]
    r = tmpl.render(messages, tools=tools)
    tok = tmpl.tokenizer
    h = r.hints
    assert h.opener is not None
    assert tok.decode(r.token_ids[h.opener :]).startswith("<|im_start|>assistant\n<think>\n")
    assert r.token_ids.count(tok.token_to_id("<|im_start|>")) == len(h.message_starts) + 1
    for p in h.message_starts:
        _check_turn_start(tmpl, r, p)
    assert h.message_starts[0] == 0 and h.message_starts == sorted(h.message_starts)
    if tools or messages[0]["role"] == "system":
        (s,) = h.structural
        assert tok.decode(r.token_ids[:s]).startswith("<|im_start|>system\n")
        assert tok.decode(r.token_ids[:s]).count("<|im_start|>") == 1
        _check_turn_start(tmpl, r, s)
    else:
        assert h.structural == []
    assert h.explicit == []
    no_gen = tmpl.render(messages, tools=tools, add_generation_prompt=False)
    assert no_gen.hints.opener is None
    assert no_gen.token_ids == r.token_ids[: h.opener]


def _mark(messages, i, on_part=False):
    out = copy.deepcopy(messages)
    if on_part:
        out[i]["content"] = [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]
    else:
        out[i]["cache_control"] = {"type": "ephemeral"}
    return out


def test_cache_control_is_stripped_and_does_not_change_ids(hf, tmpl):
    messages = CONVERSATIONS["agent_next_query"]
    for i in range(len(messages)):
        marked = _mark(messages, i)
        assert tmpl.render(marked, tools=TOOLS).token_ids == _hf_ids(
            hf, messages, tools=TOOLS, add_generation_prompt=True
        )
    marked = _mark([SYS, U1], 1, on_part=True)
    assert prepare_messages(marked)[1]["content"] == [{"type": "text", "text": "Hi"}]
    assert "cache_control" not in prepare_messages(marked)[1]
    assert marked[1]["content"][0]["cache_control"]  # the caller's messages are not modified


def test_explicit_breakpoints(tmpl):
    tok = tmpl.tokenizer
    messages = CONVERSATIONS["agent_next_query"]  # SYS U1 CALL TOOL1 TOOL2 A1 U2
    r = tmpl.render(messages, tools=TOOLS)
    starts = r.hints.message_starts
    # system (its prefix alone raises: no user query) -> end of the tools/system turn
    assert tmpl.render(_mark(messages, 0), tools=TOOLS).hints.explicit == r.hints.structural
    # history user turn -> the next turn's start
    assert tmpl.render(_mark(messages, 1), tools=TOOLS).hints.explicit == [starts[2]]
    # first of two tool results: they share one turn, which ends after the second
    assert tmpl.render(_mark(messages, 3), tools=TOOLS).hints.explicit == [starts[4]]
    # an assistant turn whose reasoning the final render strips (rendered alone it keeps it)
    a1 = tmpl.render(_mark(messages, 5), tools=TOOLS).hints.explicit
    assert a1 == [starts[5]]
    assert tok.decode(r.token_ids[: a1[0]]).endswith("Mild, 12 °C.<|im_end|>\n")
    # the last message: the generation opener, or the end without a generation prompt
    assert tmpl.render(_mark(messages, 6), tools=TOOLS).hints.explicit == [r.hints.opener]
    last = tmpl.render(_mark(messages, 6), tools=TOOLS, add_generation_prompt=False)
    assert last.hints.explicit == [len(last.token_ids)]
    # on a content part
    part = tmpl.render(_mark([SYS, U1, A_PLAIN, U2], 1, on_part=True))
    assert part.hints.explicit == [part.hints.message_starts[2]]


def test_prefix_of_next_turn_is_stable_at_message_starts(tmpl):
    """Without history rewriting, turn i of a conversation is a token prefix of the next one's."""
    first = tmpl.render([SYS, U1], add_generation_prompt=False)
    second = tmpl.render([SYS, U1, {"role": "assistant", "content": "Yes."}, U2])
    n = len(first.token_ids)
    assert n in second.hints.message_starts
    assert second.token_ids[:n] == first.token_ids


def test_demo_assets_render():
    tok = Tokenizer.from_dir(DEMO_DIR)
    r = render_chat(tok, [SYS, U1, A_PLAIN, U2], tools=TOOLS, enable_thinking=False)
    assert r.token_ids == tok.encode(r.text)
    assert tok.decode(r.token_ids) == r.text
    assert r.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert r.token_ids[r.hints.opener] == tok.token_to_id("<|im_start|>")
    assert r.token_ids[r.hints.opener + 1 :][:1] == tok.encode("assistant")[:1]
    assert len(r.hints.message_starts) == 4 and r.hints.structural == [r.hints.message_starts[1]]


def _random_conversation(r: random.Random) -> list[dict]:
    words = ["hi", "café", "🌧", "<think>", "x\n\ny", "  pad  ", "</think>", '{"a": 1}', "end."]

    def text() -> str:
        return " ".join(r.choice(words) for _ in range(r.randint(0, 6)))

    messages: list[dict] = [{"role": "system", "content": text()}] if r.random() < 0.5 else []
    for _ in range(r.randint(1, 4)):
        messages.append({"role": "user", "content": text() or "q"})
        for _ in range(r.randint(0, 2)):
            turn: dict = {"role": "assistant", "content": text()}
            if r.random() < 0.4:
                turn["reasoning_content"] = text()
            if r.random() < 0.4:
                args = {"city": text(), "n": r.randint(0, 9), "flag": r.random() < 0.5}
                turn["tool_calls"] = [{"function": {"name": "get_weather", "arguments": args}}]
                messages.append(turn)
                messages += [{"role": "tool", "content": text()} for _ in range(r.randint(1, 2))]
            else:
                messages.append(turn)
    for m in messages:
        if r.random() < 0.15:
            m["cache_control"] = {"type": "ephemeral"}
    return messages


@pytest.mark.parametrize("seed", range(30))
def test_random_conversations(hf, tmpl, seed):
    r = random.Random(seed)
    messages = _random_conversation(r)
    tools = TOOLS if r.random() < 0.5 else None
    thinking = r.choice([None, True, False])
    gen = r.random() < 0.8
    kw = {} if thinking is None else {"enable_thinking": thinking}
    clean = [{k: v for k, v in m.items() if k != "cache_control"} for m in messages]
    want = _hf_ids(hf, clean, tools=tools, add_generation_prompt=gen, **kw)
    got = tmpl.render(messages, tools=tools, add_generation_prompt=gen, enable_thinking=thinking)
    assert got.token_ids == want
    h = got.hints
    assert (h.opener is not None) == gen
    for p in [*h.message_starts, *h.structural, *h.explicit]:
        assert p == len(want) or want[p] == tmpl.tokenizer.token_to_id("<|im_start|>")
    n_marked = sum("cache_control" in m for m in messages)
    assert len(h.explicit) <= n_marked and (n_marked == 0) == (not h.explicit)
