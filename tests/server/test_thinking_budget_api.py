"""A thinking budget the server enforces (issue 39: no output field is a silent no-op), driven
by the real SDKs: Anthropic's `thinking.budget_tokens` (checked by Anthropic's rules) and
vLLM's `thinking_token_budget` on the OpenAI routes end the reasoning with `</think>` after
that many tokens; the reply is the engine's with the same budget."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from server_helpers import MODEL

from ninfer.request import SamplingParams

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

ASK = [{"role": "user", "content": "Hello"}]
GREEDY = {"temperature": 0}


@pytest.fixture
def anth(served):
    return anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def oai(served):
    return openai.OpenAI(base_url=served.base, api_key="unused", max_retries=0, timeout=60)


def _reference(served, max_tokens: int, budget: int | None):
    p = SamplingParams(max_tokens=max_tokens, temperature=0, thinking_token_budget=budget)
    return served.llm.chat(ASK, p)[0]


def test_anthropic_budget_tokens_closes_the_thinking(served, anth):
    """The reply is the engine's with the same budget: its thinking block ends at token 1024
    and the answer follows in a text block. The engine's reference (greedy, budget 1024 of
    max_tokens 1040: its first `</think>` is token 1024, exactly the budget; the budget's own
    behaviour is tested in tests/engine/test_thinking_budget.py) decodes beside the request,
    in the same steps."""
    close = served.llm.tokenizer.token_to_id("</think>")
    kw = dict(
        model=MODEL,
        max_tokens=1040,
        messages=ASK,
        extra_body=GREEDY,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(_reference, served, 1040, 1024)
        msg = anth.messages.create(**kw)
        ref = reference.result()
    assert ref.token_ids.index(close) == 1024
    reasoning, _, answer = ref.text.partition("</think>")
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == reasoning.rstrip("\n")
    assert msg.content[1].text == answer.strip()
    assert msg.usage.output_tokens == len(ref.token_ids)


@pytest.mark.parametrize(
    ("thinking", "max_tokens", "says"),
    [
        ({"type": "enabled", "budget_tokens": 1023}, 2000, ">= 1024"),
        ({"type": "enabled", "budget_tokens": "1500"}, 2000, ">= 1024"),
        ({"type": "enabled", "budget_tokens": 1024}, 1024, "greater than"),
        ({"type": "disabled", "budget_tokens": 1024}, 2000, "type enabled"),
    ],
)
def test_anthropic_budget_rules(anth, thinking, max_tokens, says):
    with pytest.raises(anthropic.BadRequestError) as e:
        anth.messages.create(model=MODEL, max_tokens=max_tokens, messages=ASK, thinking=thinking)
    assert "thinking.budget_tokens" in str(e.value) and says in str(e.value)


@pytest.mark.parametrize("budget", [0, 3, 9])
def test_openai_thinking_token_budget(served, oai, budget):
    close = served.llm.tokenizer.token_to_id("</think>")
    ref = _reference(served, 16, budget)
    assert ref.token_ids.index(close) == budget
    r = oai.chat.completions.create(
        model=MODEL,
        max_tokens=16,
        messages=ASK,
        temperature=0,
        extra_body={
            "chat_template_kwargs": {"enable_thinking": True},
            "thinking_token_budget": budget,
            "return_token_ids": True,
        },
    )
    assert r.choices[0].token_ids == ref.token_ids


def test_openai_completions_thinking_token_budget(served, oai):
    """A raw prompt that leaves `<think>` open (the chat template's, rendered) is budgeted too."""
    close = served.llm.tokenizer.token_to_id("</think>")
    prompt = served.llm.render_chat(ASK, enable_thinking=True).prompt.token_ids
    r = oai.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        extra_body={"thinking_token_budget": 4, "return_token_ids": True},
    )
    assert r.choices[0].token_ids.index(close) == 4


@pytest.mark.parametrize("bad", [-1, 1.5, "x"])
def test_openai_bad_budget_is_a_400_naming_it(oai, bad):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model=MODEL, max_tokens=4, messages=ASK, extra_body={"thinking_token_budget": bad}
        )
    assert "thinking_token_budget" in str(e.value)
