"""The server behaves as the APIs it speaks (issue 39, item 2), driven by the real SDKs: the demo
model answers in `content`; `/v1/completions` takes batches; errors in each API's own shape
(404 `model_not_found`, fields we do not implement refused by name, conversation mistakes naming
the message, Anthropic's ranges)."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import MODEL

from ninfer.request import SamplingParams
from ninfer.server.app import create_app

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

HELLO = [{"role": "user", "content": "Hello"}]
GREEDY = {"temperature": 0}


@pytest.fixture
def oai(served):
    return openai.OpenAI(base_url=served.base, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def anth(served):
    return anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=60)


# ---- the demo answers in content ---------------------------------------------------------------
def test_demo_openai_answers_in_content(served, oai):
    """The README's example: no thinking switch, the reply is in `content` (the engine's reply
    with thinking off), no reasoning."""
    r = oai.chat.completions.create(model=MODEL, max_tokens=6, messages=HELLO, temperature=0)
    msg = r.choices[0].message
    (ref,) = served.llm.chat(
        HELLO, SamplingParams(max_tokens=6, temperature=0), enable_thinking=False
    )
    assert msg.content and msg.content == ref.text
    assert getattr(msg, "reasoning_content", None) is None
    on = oai.chat.completions.create(
        model=MODEL,
        max_tokens=6,
        messages=HELLO,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}},
    )
    assert on.choices[0].message.reasoning_content  # asked for: the reply starts in <think>


def test_demo_anthropic_answers_in_text(anth):
    m = anth.messages.create(model=MODEL, max_tokens=6, messages=HELLO, extra_body=GREEDY)
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    on = anth.messages.create(
        model=MODEL,
        max_tokens=6,
        messages=HELLO,
        extra_body=GREEDY,
        thinking={"type": "enabled"},
    )
    assert on.content[0].type == "thinking"


def test_reasoning_effort_switches_thinking(oai):
    r = oai.chat.completions.create(
        model=MODEL, max_tokens=4, messages=HELLO, temperature=0, reasoning_effort="high"
    )
    assert r.choices[0].message.reasoning_content


# ---- completions batches ----------------------------------------------------------------------
def test_completions_list_of_prompts(served, oai):
    prompts = ["The river", "A stone in the field"]
    r = oai.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    refs = served.llm.generate(prompts, SamplingParams(max_tokens=5, temperature=0))
    assert [c.text for c in r.choices] == [refs[0].text] * 2 + [refs[1].text] * 2
    prompt_tokens = sum(len(o.prompt_token_ids) for o in refs)
    assert r.usage.prompt_tokens == prompt_tokens
    assert r.usage.completion_tokens == sum(2 * len(o.token_ids) for o in refs)


def test_completions_list_of_token_lists_with_token_ids(served, oai):
    ids = [[5, 6, 7, 8], [9, 10, 11]]
    r = oai.completions.create(
        model=MODEL,
        prompt=ids,
        max_tokens=4,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    refs = served.llm.generate(ids, SamplingParams(max_tokens=4, temperature=0))
    for choice, ref in zip(r.choices, refs, strict=True):
        dumped = choice.model_dump()
        assert dumped["token_ids"] == ref.token_ids
        assert dumped["prompt_token_ids"] == ref.prompt_token_ids


def test_completions_stream_batch_with_token_ids(served, oai):
    prompts = ["The river", "A stone"]
    got: dict[int, list[int]] = {0: [], 1: []}
    text: dict[int, str] = {0: "", 1: ""}
    stream = oai.completions.create(
        model=MODEL,
        prompt=prompts,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            got[c.index] += c.model_dump().get("token_ids") or []
            text[c.index] += c.text
    refs = served.llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0))
    assert [got[0], got[1]] == [refs[0].token_ids, refs[1].token_ids]
    assert [text[0], text[1]] == [refs[0].text, refs[1].text]
    assert usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in refs)


def test_completions_batch_error_names_the_prompt(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=MODEL, prompt=[[5, 6], [5, 10**7]], max_tokens=2)
    assert e.value.param == "prompt[1]" and e.value.body["message"].startswith("prompt[1]: token")
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=MODEL, prompt=["a", ""], max_tokens=2)
    assert e.value.param == "prompt[1]"


# ---- model names ------------------------------------------------------------------------------
def test_unknown_model_is_404_model_not_found(oai, anth):
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="gpt-4o", max_tokens=2, messages=HELLO)
    assert e.value.code == "model_not_found" and "gpt-4o" in e.value.message
    with pytest.raises(openai.NotFoundError) as e:
        oai.completions.create(model="gpt-4o", prompt="x", max_tokens=2)
    assert e.value.code == "model_not_found"
    with pytest.raises(anthropic.NotFoundError) as e:
        anth.messages.create(model="claude-x", max_tokens=2, messages=HELLO)
    assert e.value.body["error"]["type"] == "not_found_error"


def test_several_served_names(served, serve_app):
    app = create_app(served.llm, ["demo", "gpt-4o-mini", "claude-sonnet-4-5"])
    url = serve_app(app)
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == [
        "demo",
        "gpt-4o-mini",
        "claude-sonnet-4-5",
    ]
    r = client.chat.completions.create(model="gpt-4o-mini", max_tokens=2, messages=HELLO)
    assert r.model == "gpt-4o-mini"
    a = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=60)
    m = a.messages.create(model="claude-sonnet-4-5", max_tokens=2, messages=HELLO)
    assert m.model == "claude-sonnet-4-5"


def test_unknown_route_and_method_in_api_shape(served):
    r = httpx.get(served.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json() and "detail" not in r.json()
    r = httpx.get(served.url + "/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"


# ---- fields we do not implement ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("use_beam_search", True),
        ("logit_bias", {"5": 10}),
        ("best_of", 3),
        ("repetition_penalty", 1.2),
        ("moderation", {"model": "omni-moderation-latest"}),
        ("guided_whitespace_pattern", " *"),
        ("return_tokens_as_token_ids", True),
    ],
)
def test_chat_refuses_unimplemented_fields(oai, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model=MODEL, max_tokens=2, messages=HELLO, extra_body={field: value}
        )
    assert e.value.param == field and field in e.value.message


def test_refusals_say_why_and_noops_pass(oai, anth):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model=MODEL, max_tokens=2, messages=HELLO, extra_body={"min_tokens": 3}
        )
    assert "not supported by this server" in e.value.message
    refused = [("suffix", "end"), ("best_of", 2), ("logit_bias", {"5": 1}), ("prompt_embeds", "e")]
    for field, value in refused:
        with pytest.raises(openai.BadRequestError) as e:
            oai.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body={field: value})
        assert e.value.param == field
    with pytest.raises(anthropic.BadRequestError) as e:
        anth.messages.create(
            model=MODEL, max_tokens=2, messages=HELLO, extra_body={"output_format": {}}
        )
    assert "output_format" in e.value.message
    with pytest.raises(anthropic.BadRequestError) as e:  # a server tool is not a function
        anth.messages.create(
            model=MODEL, max_tokens=2, messages=HELLO,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )  # fmt: skip
    assert "tools[0].type" in e.value.message
    # no-op values and unknown fields: accepted and ignored, as the APIs do
    oai.chat.completions.create(
        model=MODEL,
        max_tokens=2,
        messages=HELLO,
        response_format={"type": "text"},
        logit_bias={},
        store=False,
        extra_body={"some_future_field": 1},
    )
    oai.completions.create(model=MODEL, prompt="x", max_tokens=2, best_of=1, suffix=None)


# ---- conversation mistakes name the message ---------------------------------------------------
def test_conversation_mistakes_name_the_message(oai, anth):
    cases = [
        (
            [{"role": "user", "content": "hi"}, _tool_result("toolu_nope")],
            "messages.1.content.0",
        ),
        ([{"role": "assistant", "content": "hi"}, *HELLO], "messages.0.role"),
        ([{"role": "robot", "content": "hi"}], "messages.0.role"),
    ]
    for messages, where in cases:
        with pytest.raises(anthropic.BadRequestError) as e:
            anth.messages.create(model=MODEL, max_tokens=2, messages=messages)
        text = e.value.body["error"]["message"]
        assert where in text and "No user query" not in text, text
    openai_cases = [
        ([{"role": "assistant", "content": "hi"}], "messages[0].role"),
        ([{"role": "system", "content": "s"}], "messages"),
        ([*HELLO, {"role": "tool", "content": "r", "tool_call_id": "x"}], "messages[1].role"),
        ([*HELLO, {"role": "system", "content": "late"}], "messages[1].role"),
    ]
    for messages, where in openai_cases:
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model=MODEL, max_tokens=2, messages=messages)
        assert e.value.param == where and "No user query" not in e.value.message


def _tool_result(tool_use_id: str) -> dict:
    block = {"type": "tool_result", "tool_use_id": tool_use_id, "content": "rain"}
    return {"role": "user", "content": [block]}


# ---- ranges -----------------------------------------------------------------------------------
def test_anthropic_temperature_range(anth):
    with pytest.raises(anthropic.BadRequestError) as e:
        anth.messages.create(
            model=MODEL, max_tokens=2, messages=HELLO, extra_body={"temperature": 1.5}
        )
    assert "temperature" in e.value.body["error"]["message"]
    anth.messages.create(model=MODEL, max_tokens=2, messages=HELLO, extra_body={"temperature": 1})


def test_max_tokens_beyond_model_length(served, oai, anth):
    too_many = served.llm.engine_config.memory.max_model_len + 1
    with pytest.raises(anthropic.BadRequestError) as e:
        anth.messages.create(model=MODEL, max_tokens=too_many, messages=HELLO)
    assert "max_tokens" in e.value.body["error"]["message"]
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, max_tokens=too_many, messages=HELLO)
    assert e.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=MODEL, prompt="x", max_tokens=too_many)
    assert e.value.param == "max_tokens"


# ---- stop_token_ids (vLLM's extension) ----------------------------------------------------------
def test_stop_token_ids_end_the_reply_at_the_first_of_them(served, oai):
    """Honoured as vLLM does on both OpenAI routes, streamed or not: the reply ends at the first
    generated id of the list (finish_reason "stop"); the ids before it are the free reply's."""
    ids = {"return_token_ids": True}
    free = oai.completions.create(model=MODEL, prompt="The lake", max_tokens=12, extra_body=ids,
                                  **GREEDY).choices[0].model_extra["token_ids"]  # fmt: skip
    stop_at = free[3]
    cut = free[: free.index(stop_at) + 1]
    extra = {**ids, "stop_token_ids": [stop_at]}
    c = oai.completions.create(
        model=MODEL, prompt="The lake", max_tokens=12, extra_body=extra, **GREEDY
    ).choices[0]
    assert c.model_extra["token_ids"] == cut and c.finish_reason == "stop"
    assert c.text == served.llm.tokenizer.decode(cut)
    streamed, reasons = [], []
    for chunk in oai.completions.create(
        model=MODEL, prompt="The lake", max_tokens=12, stream=True, extra_body=extra, **GREEDY
    ):
        for ch in chunk.choices:
            streamed += (ch.model_extra or {}).get("token_ids") or []
            reasons.append(ch.finish_reason)
    assert streamed == cut and reasons[-1] == "stop"
    chat_free = (
        oai.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=10, extra_body=ids, **GREEDY
        )
        .choices[0]
        .model_extra["token_ids"]
    )
    stop_at = chat_free[2]
    chat = oai.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=10, **GREEDY,
        extra_body={**ids, "stop_token_ids": [stop_at, 10**9]},
    ).choices[0]  # fmt: skip
    assert chat.model_extra["token_ids"] == chat_free[: chat_free.index(stop_at) + 1]
    assert chat.finish_reason == "stop"


@pytest.mark.parametrize("value", [5, ["5"], [True], "x"])
def test_bad_stop_token_ids_are_a_400_naming_the_field(oai, value):
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(
            model=MODEL, prompt="x", max_tokens=2, extra_body={"stop_token_ids": value}
        )
    assert e.value.param == "stop_token_ids"


# ---- echo -------------------------------------------------------------------------------------
def test_echo_repeats_the_prompt_text_or_tokens(served, oai):
    """`echo` puts the prompt before the reply, a token-id prompt as its text too (streamed or
    not); with logprobs it would owe the prompt's logprobs, which are not computed: a 400."""
    ids = [300, 301, 302, 303]
    for prompt, head in (("The river", "The river"), (ids, served.llm.tokenizer.decode(ids))):
        free = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=4, **GREEDY)
        r = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=4, echo=True, **GREEDY)
        assert head and r.choices[0].text == head + free.choices[0].text
        chunks = oai.completions.create(
            model=MODEL, prompt=prompt, max_tokens=4, echo=True, stream=True, **GREEDY
        )
        assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=MODEL, prompt="x", max_tokens=2, echo=True, logprobs=1)
    assert e.value.param == "echo"


def test_a_forced_tool_call_without_tools_is_a_400(oai, anth):
    """As the APIs answer: a tool_choice that forces a call needs tools (never free text)."""
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        for tools in ([], openai.NOT_GIVEN):
            with pytest.raises(openai.BadRequestError) as e:
                oai.chat.completions.create(
                    model=MODEL, max_tokens=2, messages=HELLO, tools=tools, tool_choice=choice
                )
            assert e.value.param == "tool_choice"
    for choice in ({"type": "any"}, {"type": "tool", "name": "f"}):
        with pytest.raises(anthropic.BadRequestError) as e:
            anth.messages.create(model=MODEL, max_tokens=2, messages=HELLO, tool_choice=choice)
        assert "tool_choice" in e.value.body["error"]["message"]
