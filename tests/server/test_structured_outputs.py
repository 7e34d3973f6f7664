"""Structured outputs through the real SDKs (openai, anthropic) on the demo model, whose random
weights would never produce JSON or a tool call by themselves: OpenAI `response_format`
(json_object, json_schema), vLLM's `structured_outputs` / `guided_*` on completions, a forced
tool call (`tool_choice` "required" / a named function; Anthropic `any` / `tool`) and
Anthropic's `output_config.format`. A schema the engine cannot compile is a 400 naming the
field."""

from __future__ import annotations

import json
import re

import pytest
from server_helpers import MODEL

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "units": {"enum": ["metric", "imperial"]},
    },
    "required": ["city", "days", "units"],
}
ASK = [{"role": "user", "content": "Weather in Oslo for two days, as JSON."}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}},
]
ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "w", "input_schema": SCHEMA},
    # a tool without arguments: an open object would let random weights write keys for ever
    {"name": "noop", "description": "n",
     "input_schema": {"type": "object", "properties": {}, "additionalProperties": False}},
]  # fmt: skip


@pytest.fixture(scope="module")
def oai(served):
    return openai.OpenAI(base_url=served.base, api_key="k", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def anth(served):
    return anthropic.Anthropic(base_url=served.url, api_key="k", max_retries=0, timeout=120)


def _schema_format(schema=SCHEMA) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": True}}


def test_chat_json_schema(oai, seed=1):
    r = oai.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=120, seed=seed,
        response_format=_schema_format(), extra_body=NO_THINK,
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_chat_json_schema_streamed(oai):
    stream = oai.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=120, seed=3, stream=True,
        response_format=_schema_format(), extra_body=NO_THINK,
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_chat_json_object(oai):
    r = oai.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=200, seed=4,
        response_format={"type": "json_object"}, extra_body=NO_THINK,
    )  # fmt: skip
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_an_uncompilable_schema_is_a_400_naming_the_field(oai, anth):
    bad = {"type": "object", "properties": {"a": {"type": "no-such-type"}}}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=5, response_format=_schema_format(bad)
        )
    assert e.value.param == "response_format.json_schema.schema"
    assert "response_format.json_schema.schema" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(
            model=MODEL, prompt="x", max_tokens=5, extra_body={"guided_regex": "(("}
        )
    assert e.value.param == "guided_regex"
    with pytest.raises(openai.BadRequestError) as e:  # a keyword the grammar would not enforce
        oai.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=5,
            response_format=_schema_format({"type": "array", "uniqueItems": True}),
        )  # fmt: skip
    assert "uniqueItems" in e.value.message
    with pytest.raises(anthropic.BadRequestError) as e:
        anth.messages.create(
            model=MODEL, max_tokens=5, messages=ASK,
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": bad}}},
        )  # fmt: skip
    assert "output_config.format.schema" in e.value.message


def test_completions_regex_and_choice(oai):
    r = oai.completions.create(
        model=MODEL, prompt="Code:", max_tokens=30, seed=5,
        extra_body={"structured_outputs": {"regex": "[A-Z]{2}-[0-9]{3}"}},
    )  # fmt: skip
    assert re.fullmatch("[A-Z]{2}-[0-9]{3}", r.choices[0].text)
    r = oai.completions.create(
        model=MODEL, prompt="Answer:", max_tokens=10, seed=6,
        extra_body={"guided_choice": ["yes", "no"]},
    )  # fmt: skip
    assert r.choices[0].text in ("yes", "no")


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_openai_forced_tool_call(oai, choice):
    r = oai.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=150, seed=7, tools=OPENAI_TOOLS,
        tool_choice=choice, parallel_tool_calls=False, extra_body=NO_THINK,
    )  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0].function
    if isinstance(choice, dict):
        assert call.name == "get_weather"
    if call.name == "get_weather":
        args = json.loads(call.arguments)
        assert args["days"] in range(1, 8) and args["units"] in ("metric", "imperial")


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_anthropic_forced_tool_use(anth, choice):
    m = anth.messages.create(
        model=MODEL, max_tokens=150, messages=ASK, tools=ANTHROPIC_TOOLS,
        tool_choice={**choice, "disable_parallel_tool_use": True},
    )  # fmt: skip
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(uses) == 1
    if choice["type"] == "tool":
        assert uses[0].name == "get_weather"
    if uses[0].name == "get_weather":
        assert uses[0].input["days"] in range(1, 8)


def test_anthropic_output_format(anth):
    m = anth.messages.create(
        model=MODEL, max_tokens=120, messages=ASK,
        extra_body={"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}},
    )  # fmt: skip
    assert m.stop_reason == "end_turn"
    jsonschema.validate(json.loads(m.content[0].text), SCHEMA)
