"""The public surface a server runs on (`LLM.render_chat`, `render_prompt`, `check`, `submit`
with a callback, `cancel`, `running`): the same tokens as `LLM.chat`, events in order on the
callback, cancellation by the returned id, errors before anything is submitted."""

from __future__ import annotations

import queue

import pytest

from ninfer import LLM, SamplingParams
from ninfer.request import RequestOutput, StreamDelta

CONVERSATION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Name three rivers.", "cache_control": {"type": "ephemeral"}},
    {"role": "assistant", "content": "Nile, Amazon, Danube."},
    {"role": "user", "content": "And three mountains?"},
]
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "find a fact",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]  # fmt: skip


@pytest.fixture(scope="module")
def llm():
    with LLM(device="cpu", max_concurrency=2, kv_capacity=8192, host_cache_mib=0) as engine:
        yield engine


def _events(llm: LLM, prompt, params, stream=True) -> tuple[str, list]:
    got: queue.Queue = queue.Queue()
    request_id = llm.submit(prompt, params, on_event=got.put, stream=stream)
    events = [got.get(timeout=60)]
    while not isinstance(events[-1], RequestOutput):
        events.append(got.get(timeout=60))
    return request_id, events


def test_submitted_chat_gives_chat_s_tokens_as_deltas_then_one_output(llm):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    want = llm.chat(CONVERSATION, params, tools=TOOLS)[0]
    chat = llm.render_chat(CONVERSATION, TOOLS, enable_thinking=True)
    assert chat.prompt.token_ids == want.prompt_token_ids
    assert chat.text and llm.tokenizer.encode(chat.text) == want.prompt_token_ids
    request_id, events = _events(llm, chat.prompt, params)
    final = events[-1]
    assert final.request_id == request_id and final.finish_reason == "length"
    assert final.token_ids == want.token_ids and final.text == want.text
    deltas = events[:-1]
    assert all(isinstance(e, StreamDelta) for e in deltas)
    assert [t for d in deltas for t in d.token_ids] == want.token_ids
    assert not llm.cancel(request_id)  # answered: no longer live
    _, quiet = _events(llm, chat.prompt, params, stream=False)
    assert len(quiet) == 1 and quiet[0].token_ids == want.token_ids


def test_tools_breakpoint_makes_the_end_of_the_tools_turn_a_client_breakpoint(llm):
    plain = llm.render_chat(CONVERSATION, TOOLS).prompt.hints
    marked = llm.render_chat(CONVERSATION, TOOLS, tools_breakpoint=True).prompt.hints
    assert plain.structural and plain.explicit  # the system turn's end; the cache_control message
    assert not set(plain.structural) <= set(plain.explicit)
    assert marked.explicit == sorted(set(plain.explicit) | set(plain.structural))
    assert marked.structural == plain.structural and marked.opener == plain.opener


def test_cancel_by_the_submitted_id_ends_the_request_abort(llm):
    params = SamplingParams(max_tokens=4000, temperature=0, ignore_eos=True)
    got: queue.Queue = queue.Queue()
    request_id = llm.submit(llm.render_prompt("a long reply"), params, on_event=got.put)
    first = got.get(timeout=60)
    assert isinstance(first, StreamDelta)
    assert llm.cancel(request_id)
    event = first
    while not isinstance(event, RequestOutput):
        event = got.get(timeout=60)
    assert event.finish_reason == "abort" and event.request_id == request_id
    assert 0 < len(event.token_ids) < 4000
    assert llm.running


def test_a_request_that_cannot_be_served_is_refused_before_submission(llm):
    calls = []
    too_long = llm.render_prompt([5] * (llm.engine_config.memory.max_model_len + 1))
    with pytest.raises(ValueError, match="longer than max_model_len"):
        llm.submit(too_long, None, on_event=calls.append)
    with pytest.raises(ValueError, match="max_tokens"):
        llm.check(llm.render_prompt("hi"), SamplingParams(max_tokens=0))
    with pytest.raises(ValueError, match="prompt_token_ids: token id"):
        llm.check(llm.render_prompt([llm.model_config.vocab_size]))
    assert calls == []
    frozen = llm.check(llm.render_prompt({"prompt": "hi", "cache_breakpoints": [1]}))
    assert frozen == SamplingParams().validated()
