"""A conversation whose text alone is longer than max_model_len tokens could hold is refused
before its text is tokenized: before it is rendered when its messages and tool definitions
already are (issue 41, item 1). The tokenizer's `encode` is spied on: it records every long
text it is given, and a refused request must have given it none."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import MODEL

from ninfer.server.app import create_app

BIG = 30_000_000  # characters: the issue's ~30 MB prompt
LONG = 100_000  # an encode input this long means the whole conversation was being tokenized


@pytest.fixture
def encoded(served, monkeypatch) -> list[int]:
    """The lengths of the long texts the server's tokenizer encodes during the test."""
    tok = served.llm.tokenizer
    original = tok.encode
    seen: list[int] = []

    def spy(text: str) -> list[int]:
        if len(text) > LONG:
            seen.append(len(text))
            return [0] * (len(text) // 4)  # a long answer, without the long wait
        return original(text)

    monkeypatch.setattr(tok, "encode", spy)
    return seen


@pytest.fixture(scope="module")
def big_url(served, serve_app) -> str:
    """A server over the session LLM that reads bodies of the 30 MB prompt."""
    return serve_app(create_app(served.llm, MODEL, max_body_bytes=40 << 20))


def _limit(served) -> int:
    """The most characters a prompt of max_model_len tokens could have."""
    return served.app.state.driver._max_text_chars()


def test_a_30mb_chat_prompt_is_400_naming_messages_untokenized(served, big_url, encoded):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * (BIG // 5)}],
        "max_tokens": 4,
    }
    r = httpx.post(big_url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 400, r.text[:500]
    err = r.json()["error"]
    assert err["param"] == "messages" and "max_model_len" in err["message"], err
    assert encoded == []


def test_a_30mb_anthropic_message_is_400_naming_messages_untokenized(served, big_url, encoded):
    body = {
        "model": MODEL,
        "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "w" * BIG}]}],
        "max_tokens": 4,
    }
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        r = httpx.post(big_url + route, json=body, timeout=120)
        assert r.status_code == 400, r.text[:500]
        assert r.json()["type"] == "error", r.text[:500]
        message = r.json()["error"]["message"]
        assert message.startswith("messages: ") and "max_model_len" in message
    assert encoded == []


def test_tool_definitions_count_toward_the_length(served, encoded):
    limit = _limit(served)
    tools = [{"type": "function", "function": {"name": "f", "description": "d" * limit}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    r = httpx.post(served.base + "/chat/completions", json={**body, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400, r.text[:500]
    assert r.json()["error"]["param"] == "messages"
    assert encoded == []


def test_a_rendered_conversation_too_long_is_refused_before_encoding(served, encoded):
    """An assistant turn's content is not counted before rendering (templates rewrite it);
    the rendered text is checked before it is encoded."""
    limit = _limit(served)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "x" * (limit + 1)},
        {"role": "user", "content": "again"},
    ]
    with pytest.raises(ValueError, match=r"^messages: .*max_model_len"):
        served.llm.render_chat(messages)
    assert encoded == []


def test_reasoning_the_template_drops_is_not_counted(served):
    """History reasoning the Qwen template leaves out of the prompt does not make it too
    long: only what is rendered counts."""
    limit = _limit(served)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>" + "r" * (limit + 1) + "</think>ok"},
        {"role": "user", "content": "again"},
    ]
    chat = served.llm.render_chat(messages)
    assert "r" * 100 not in chat.text and len(chat.prompt.token_ids) < 200


def test_llm_chat_refuses_a_long_conversation_untokenized(served, encoded):
    limit = _limit(served)
    with pytest.raises(ValueError, match=r"^messages: .*max_model_len"):
        served.llm.chat([{"role": "user", "content": "w " * limit}])
    assert encoded == []


def test_the_length_bound_is_not_a_template_option(served):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "chat_template_kwargs": {"max_chars": 10**9},
    }
    r = httpx.post(served.base + "/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"


def test_long_texts_encode_as_before_in_both_backends(monkeypatch, tmp_path):
    """The tokenizer's long-text paths (the atomic-token split a window at a time, `tokenizers`'
    GIL-free `encode_batch`) give the ids the one-call paths gave."""
    import re

    from fixtures.tiny_tokenizer import build_tiny_bpe

    import ninfer.tokenizer as tk
    from ninfer.demo import DEMO_DIR

    text = ("<|im_start|>user\nhi there<|im_end|>\n<think>\nx</think> é " * 300)[:-7]
    sp = tk.Tokenizer.from_dir(DEMO_DIR)._b
    alts = sorted(sp.atomic, key=len, reverse=True)
    split = re.compile("(" + "|".join(map(re.escape, alts)) + ")").split
    one_call = [
        i
        for k, part in enumerate(split(text))
        for i in ([sp.atomic[part]] if k % 2 else sp.sp.encode(part) if part else [])
    ]
    for window in (1, 7, 16, 100, 1 << 16):
        monkeypatch.setattr(tk, "_SEARCH_WINDOW", window)
        assert sp.encode(text) == one_call
    bpe = tk.Tokenizer.from_dir(build_tiny_bpe(tmp_path))._b
    assert len(text) >= tk._LONG_TEXT
    assert bpe.encode(text) == bpe.tok.encode(text, add_special_tokens=False).ids
