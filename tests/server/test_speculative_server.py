"""The server with MTP speculative decoding (`LLM(speculative="mtp")` over the demo model and
its random draft head): a JSON-schema reply with logprobs and a forced tool call through the
OpenAI SDK speculate, with the replies of the plain session server (same weights, greedy),
and /metrics counts the verify rows and drafts (`ninfer_spec_*`)."""

from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import BODY_LIMIT, LLM_OPTIONS, MODEL

from ninfer.llm import LLM
from ninfer.server.app import create_app

openai = pytest.importorskip("openai")
pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
}  # fmt: skip
ASK = [{"role": "user", "content": "Weather in Oslo for two days, as JSON."}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]


@pytest.fixture(scope="module")
def spec_url(serve_app):
    llm = LLM(speculative="mtp", num_speculative_tokens=3, **LLM_OPTIONS)
    yield serve_app(create_app(llm, MODEL, max_body_bytes=BODY_LIMIT)), llm
    llm.close()


def _client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=120)


def _ask(client, **kwargs):
    return client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=80, temperature=0, extra_body=NO_THINK, **kwargs
    )


def test_structured_replies_with_mtp_are_the_plain_servers(served, spec_url):
    url, llm = spec_url
    plain, spec = _client(served.url), _client(url)
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}}
    kinds = [
        dict(response_format=fmt, logprobs=True, top_logprobs=2),
        dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}),
    ]
    for kwargs in kinds:
        want, got = _ask(plain, **kwargs).choices[0], _ask(spec, **kwargs).choices[0]
        assert got.finish_reason == want.finish_reason
        assert got.message.content == want.message.content
        if kwargs.get("tools"):
            (call,) = got.message.tool_calls
            assert call.function.arguments == want.message.tool_calls[0].function.arguments
            assert json.loads(call.function.arguments).keys() == {"city", "days"}
        else:
            tokens = [(t.token, [a.token for a in t.top_logprobs]) for t in got.logprobs.content]
            assert tokens == [(t.token, [a.token for a in t.top_logprobs])
                              for t in want.logprobs.content]  # fmt: skip
            for g, w in zip(got.logprobs.content, want.logprobs.content, strict=True):
                assert abs(g.logprob - w.logprob) < 1e-4
    stats = llm.speculation_stats()
    assert stats.verify_rows > 0 and stats.drafted >= stats.verify_rows
    metrics = httpx.get(url + "/metrics").text
    assert f"ninfer_spec_verify_rows_total {float(stats.verify_rows)}" in metrics
    assert "ninfer_spec_accepted_tokens_total" in metrics
    assert "ninfer_spec_head_faults_total 0.0" in metrics
    assert "ninfer_spec_" not in httpx.get(served.url + "/metrics").text  # off: no counters
