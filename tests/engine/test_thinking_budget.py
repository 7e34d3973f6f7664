"""The thinking budget (`SamplingParams.thinking_token_budget`): with a prompt that leaves
`<think>` open, the reply spends at most b tokens inside the block and `</think>` comes as the
token after the b-th (random weights rarely close the block themselves). Checked on the CPU
with the tiny model and the demo tokenizer, with the overlapped decode on and off (the plain
engine is the oracle: same tokens), alone and beside a structured output's grammar."""

from __future__ import annotations

import json

import pytest
import torch
from engine_helpers import assert_idle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.request import SamplingParams, StructuredOutputsParams
from ninfer.sampling import apply_token_mask
from ninfer.structured import Matcher, token_mask


def _chat(words: list[str]) -> list[dict]:
    return [{"role": "user", "content": " ".join(words) or "hi"}]


def _check_budget(out, budget: int | None, close: int) -> None:
    """The property: at most `budget` tokens before `</think>`, and `</think>` within the
    first budget + 1 tokens of a reply longer than the budget."""
    tokens = out.token_ids
    assert out.finish_reason in ("stop", "length"), out.error
    if budget is None:
        return
    inside = tokens.index(close) if close in tokens else len(tokens)
    assert inside <= budget
    if len(tokens) > budget:
        assert close in tokens[: budget + 1]


_PARAMS = st.builds(
    lambda budget, extra, seed, greedy: SamplingParams(
        max_tokens=(budget or 0) + extra,
        temperature=0.0 if greedy else 1.0,
        seed=seed,
        thinking_token_budget=budget,
    ),
    st.none() | st.integers(0, 24),
    st.integers(1, 12),
    st.integers(0, 2**16),
    st.booleans(),
)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    convs=st.lists(
        st.lists(st.sampled_from(["a", "cat", "sky", "why", "42"]), max_size=6),
        min_size=1,
        max_size=4,
    ),
    params=st.lists(_PARAMS, min_size=4, max_size=4),
    concurrency=st.sampled_from([1, 4]),
)
def test_budget_bounds_the_reasoning_with_and_without_overlap(make_llm, convs, params, concurrency):
    """Any budgets (None among them), prompts, seeds and concurrency: every reply keeps its
    budget, and the overlapped engine gives the plain engine's tokens."""
    params = params[: len(convs)]
    runs = {}
    for overlap in (False, True):
        llm = make_llm(overlap_decode=overlap, max_concurrency=concurrency)
        close = llm.tokenizer.token_to_id("</think>")
        outs = llm.chat([_chat(c) for c in convs], params, enable_thinking=True)
        for out, p in zip(outs, params, strict=True):
            _check_budget(out, p.thinking_token_budget, close)
        assert_idle(llm)
        runs[overlap] = [(o.token_ids, o.finish_reason) for o in outs]
        llm.close()
    assert runs[True] == runs[False]


def test_budget_zero_closes_the_block_at_once(make_llm):
    llm = make_llm()
    close = llm.tokenizer.token_to_id("</think>")
    out = llm.chat(_chat(["hi"]), SamplingParams(max_tokens=8, thinking_token_budget=0))[0]
    assert out.token_ids[0] == close


def test_a_long_budget_runs_overlapped(make_llm):
    """The overlapped decode stays on while the budget is far (a budgeted lane defers its
    sampling only at the step that may force `</think>`), and forces it on time."""
    llm = make_llm(overlap_decode=True, max_concurrency=1)
    close = llm.tokenizer.token_to_id("</think>")
    p = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True, thinking_token_budget=40)
    out = llm.chat(_chat(["why"]), p)[0]
    _check_budget(out, 40, close)
    assert len(out.token_ids) == 60 and close in out.token_ids
    assert llm.engine.overlapped_steps > 30


def test_thinking_off_leaves_the_budget_nothing_to_do(make_llm):
    llm = make_llm()
    close = llm.tokenizer.token_to_id("</think>")
    p = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    free = llm.chat(_chat(["sky"]), p, enable_thinking=False)[0]
    p.thinking_token_budget = 0
    budgeted = llm.chat(_chat(["sky"]), p, enable_thinking=False)[0]
    assert budgeted.token_ids == free.token_ids and close not in budgeted.token_ids[:1]


@pytest.mark.parametrize("overlap", [False, True])
def test_budget_then_the_grammar(make_llm, overlap):
    """Budget and structured output together: the block closes on budget, then the reply
    follows the grammar."""
    pytest.importorskip("xgrammar")
    llm = make_llm(overlap_decode=overlap)
    close = llm.tokenizer.token_to_id("</think>")
    spec = StructuredOutputsParams(choice=["yes", "no"])
    params = [
        SamplingParams(max_tokens=40, seed=s, structured_outputs=spec, thinking_token_budget=b)
        for s, b in ((1, 0), (2, 5), (3, 9))
    ]
    outs = llm.chat([_chat(["why"])] * 3, params)
    for out, p in zip(outs, params, strict=True):
        _check_budget(out, p.thinking_token_budget, close)
        after = out.token_ids[out.token_ids.index(close) + 1 :]
        if out.finish_reason == "stop":
            text = llm.tokenizer.decode([t for t in after if t not in llm.engine.eos])
            assert text.strip() in ("yes", "no"), json.dumps(text)


def test_budget_validation():
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="thinking_token_budget"):
            SamplingParams(thinking_token_budget=bad).validated()
    assert SamplingParams(thinking_token_budget=7).validated().thinking_token_budget == 7


@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(1, 300), data=st.data())
def test_a_spent_budget_allows_exactly_the_close_token(vocab, data):
    """The forcing mask, through the sampler's own mask op: every token but `</think>` is
    -inf, for any id (bit 31 of a word is int32's sign bit)."""
    close = data.draw(st.integers(0, vocab - 1))
    m = Matcher(None, close, budget=0)
    mask = token_mask([None, m], vocab, pin=False)
    assert mask is not None and mask.rows == [1]
    logits = torch.zeros(2, vocab)
    apply_token_mask(logits, mask.rows, mask.bits)
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert allowed == [close] and torch.isfinite(logits[0]).all()
    m.accept(close)
    assert not m.active and token_mask([m], vocab, pin=False) is None


def test_the_matcher_counts_and_forces():
    m = Matcher(None, 9, budget=2)
    assert not m.active and not m.may_constrain(1) and m.may_constrain(2)
    m.accept(4)
    assert not m.active and m.may_constrain(1)
    m.accept(5)
    assert m.active
    with pytest.raises(ValueError, match="forced"):
        m.accept(6)
    m.accept(9)
    assert not m.active and not m.may_constrain(5)
