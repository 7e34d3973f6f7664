"""`ninfer generate`'s input lines (ninfer.cli.jsonl), without an engine: every field is checked
by name and type, and no value makes the parser raise."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.cli.jsonl import KNOWN_FIELDS, SAMPLING_FIELDS, parse_line, read_jobs


def error_of(obj: dict, defaults: dict | None = None) -> str | None:
    return parse_line(7, json.dumps(obj), defaults or {}).error


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [("max_token", "max_tokens"), ("temprature", "temperature"), ("stop_tokens", "stop_token_ids"),
     ("zzz", None)],
)  # fmt: skip
def test_an_unknown_field_is_an_error_naming_it_and_the_known_fields(name, suggestion):
    err = error_of({"prompt": "hi", name: 4})
    assert err.startswith(f'line 7: unknown field "{name}"')
    if suggestion:
        assert f'(did you mean "{suggestion}"?)' in err
    assert err.endswith("known fields: " + ", ".join(KNOWN_FIELDS))


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("temperature", "hot", '"temperature" must be a finite number, got "hot" (a string)'),
        ("temperature", True, '"temperature" must be a finite number, got true (a boolean)'),
        ("max_tokens", True, '"max_tokens" must be an integer, got true (a boolean)'),
        ("max_tokens", 2.5, '"max_tokens" must be an integer, got 2.5 (a number)'),
        ("top_k", "3", '"top_k" must be an integer, got "3" (a string)'),
        ("seed", 1.5, '"seed" must be an integer from 0 to 2**64-1, or null, got 1.5'),
        ("seed", 2**64, '"seed" must be an integer from 0 to 2**64-1, or null'),
        ("seed", -1, '"seed" must be an integer from 0 to 2**64-1, or null, got -1'),
        ("seed", "7", '"seed" must be an integer from 0 to 2**64-1, or null, got "7"'),
        ("seed", [1], '"seed" must be an integer from 0 to 2**64-1, or null, got [1] (a list)'),
        ("logprobs", True, '"logprobs" must be an integer (top-k per token) or null, got true'),
        ("stop", 5, '"stop" must be a string or a list of strings, got 5 (an integer)'),
        ("stop_token_ids", 7, '"stop_token_ids" must be a list of integers, got 7'),
        ("ignore_eos", 1, '"ignore_eos" must be true or false, got 1 (an integer)'),
        ("thinking_token_budget", "3", '"thinking_token_budget" must be an integer or null'),
        ("id", 1.5, '"id" must be a string or an integer, got 1.5 (a number)'),
    ],
)
def test_a_type_error_names_the_field_and_the_type_it_needs(field, value, expected):
    assert error_of({"prompt": "hi", field: value}).startswith(f"line 7: {expected}")


def test_a_good_line_and_line_defaults():
    job = parse_line(3, '{"id": "a", "prompt": "hi", "seed": 18446744073709551615}', {})
    assert job.error is None and job.id == "a" and job.params.seed == 2**64 - 1
    job = parse_line(3, '{"prompt": "hi", "max_tokens": 5}', {"max_tokens": 9, "top_p": 0.5})
    assert job.id == 3 and job.params.max_tokens == 5 and job.params.top_p == 0.5
    job = parse_line(4, '{"prompt": "hi", "thinking_token_budget": 0}', {})
    assert job.error is None and job.params.thinking_token_budget == 0


def test_a_repeated_id_fails_the_repeat_alone(tmp_path):
    src = tmp_path / "in.jsonl"
    lines = ['{"id": "x", "prompt": "a"}', '{"prompt": "b"}', '{"id": 2, "prompt": "c"}',
             '{"id": "x", "prompt": "d"}', b'{"prompt": "\xff"}'.decode("latin-1")]  # fmt: skip
    src.write_bytes("\n".join(lines[:4]).encode() + b'\n{"prompt": "\xff"}\n')
    jobs = read_jobs(src, {})
    assert [j.error is None for j in jobs] == [True, True, False, False, False]
    assert jobs[2].error == "line 3: duplicate id 2 (first on line 2); this line was not run"
    assert jobs[3].duplicate and "first on line 1" in jobs[3].error
    assert jobs[4].error.startswith("line 5: not UTF-8 text")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),  # fmt: skip
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from([*SAMPLING_FIELDS, "id", "tools", "enable_thinking"]),
       value=json_values)  # fmt: skip
def test_any_value_of_any_field_is_accepted_or_an_error_naming_that_field(field, value):
    kind = {"messages": [{"role": "user", "content": "hi"}]} if field in (
        "tools", "enable_thinking") else {"prompt": "hi"}  # fmt: skip
    text = json.dumps({**kind, field: value})
    job = parse_line(1, text, {})  # never raises
    if job.error is None:
        job.params.validate()  # what was accepted is a valid request
    else:
        assert f'"{field}"' in job.error or field in job.error, job.error


def test_response_format_and_structured_outputs_lines():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    job = parse_line(1, json.dumps({"prompt": "hi", "response_format": fmt}), {})
    assert job.error is None and job.params.structured_outputs.json == schema
    job = parse_line(2, json.dumps({"prompt": "hi", "structured_outputs": {"regex": "a+"}}), {})
    assert job.error is None and job.params.structured_outputs.regex == "a+"
    job = parse_line(3, json.dumps({"prompt": "hi", "response_format": {"type": "yaml"}}), {})
    assert "response_format.type" in job.error
    both = {"prompt": "hi", "response_format": fmt, "structured_outputs": {"regex": "a"}}
    assert "not both" in parse_line(4, json.dumps(both), {}).error
