"""OpenAI's `prompt_cache_key`, through the official `openai` client against the live server:
accepted on chat and completions (a string), a routing hint that leaves the output as it is; a
value that is not a string is a 400 naming the field."""

from __future__ import annotations

import pytest
from server_helpers import MODEL

openai = pytest.importorskip("openai")

PROMPT = "The lighthouse keeper wrote"


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.base, api_key="unused", max_retries=0, timeout=60)


def test_chat_accepts_the_key_and_answers_the_same(client):
    kw = dict(
        model=MODEL,
        max_tokens=6,
        temperature=0,
        messages=[{"role": "user", "content": PROMPT}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    plain = client.chat.completions.create(**kw)
    keyed = client.chat.completions.create(prompt_cache_key="user-42/session-7", **kw)
    assert keyed.choices[0].message.content == plain.choices[0].message.content


def test_completions_accept_the_key_and_answer_the_same(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    plain = client.completions.create(**kw)
    keyed = client.completions.create(extra_body={"prompt_cache_key": "user-42"}, **kw)
    assert keyed.choices[0].text == plain.choices[0].text


@pytest.mark.parametrize("value", [7, ["a"], {"k": "v"}])
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_key_that_is_not_a_string_is_a_400_naming_it(client, route, value):
    with pytest.raises(openai.BadRequestError) as e:
        if route == "chat":
            client.chat.completions.create(
                model=MODEL,
                max_tokens=2,
                messages=[{"role": "user", "content": PROMPT}],
                extra_body={"prompt_cache_key": value},
            )
        else:
            client.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"prompt_cache_key": value}
            )
    assert e.value.status_code == 400
    assert e.value.param == "prompt_cache_key"
