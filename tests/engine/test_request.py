"""The length rule, in one place (`Request.length_reached`): the stop check after a token is
appended and the overlap's look-ahead before it agree, and the entitlement's `tokens_left`
counts from the request's own prompt, however often it was suspended."""

from __future__ import annotations

import queue

from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.engine.outputs import check_finish
from ninfer.engine.request import PromptHints, Request
from ninfer.request import SamplingParams


def _request(prompt_len: int, generated: int, max_tokens: int) -> Request:
    req = Request("r", list(range(prompt_len)), SamplingParams(max_tokens=max_tokens),
                  PromptHints(), queue.Queue())  # fmt: skip
    req.tokens += [7] * generated
    return req


@settings(max_examples=200, deadline=None)
@given(
    prompt_len=st.integers(1, 300),
    generated=st.integers(0, 300),
    max_tokens=st.integers(1, 300),
    max_model_len=st.integers(1, 700),
)
def test_the_look_ahead_and_the_stop_check_apply_one_rule(
    prompt_len, generated, max_tokens, max_model_len
):
    req = _request(prompt_len, generated, max_tokens)
    sure = req.length_reached(max_model_len, pending=1)
    assert req.tokens_left() == max_tokens - generated
    req.tokens.append(5)
    reason = check_finish(req, 5, eos=(), max_model_len=max_model_len)
    assert (reason == "length") == sure == req.length_reached(max_model_len)
    assert reason == "length" or (
        generated + 1 < max_tokens and prompt_len + generated + 1 < max_model_len
    )


def test_a_request_counts_its_output_from_its_own_prompt():
    req = _request(300, 40, 100)
    assert req.gen_start == 300 and req.generated == [7] * 40 and req.tokens_left() == 60
    assert not req.length_reached(1000) and req.length_reached(340)
