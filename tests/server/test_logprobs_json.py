"""The chat reply's logprobs as JSON text (`openai_api.chat_logprobs`, `jsontext.RawJson`):
the same JSON a dict-and-list build gives, with a number of GC-tracked objects that does not
grow with the reply. A reply of 16 choices x 2000 tokens x 20 top logprobs built as dicts and
lists held ~700k tracked objects, and the collector's full passes over them held the GIL for
50-150 ms each (issue 41's stalls, seen in `ninfer.bench.bystander --stall-trace`)."""

from __future__ import annotations

import gc
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.request import RequestOutput
from ninfer.server.jsontext import json_bytes
from ninfer.server.openai_api import LOGPROB_FLOOR, chat_logprobs

VOCAB = ["a", " b", "é", "日本", "\n", '"q"', "\\", "🙂", "", "\x00x"]


class _Tok:
    def token_text(self, token_id: int) -> str:
        return VOCAB[token_id % len(VOCAB)]


def _oracle(out: RequestOutput, k: int) -> dict:
    """The logprobs object as plain dicts and lists (the API's shape)."""

    def entry(t: int, lp: float) -> dict:
        text = VOCAB[t % len(VOCAB)]
        return {"token": text, "logprob": max(lp, LOGPROB_FLOOR), "bytes": list(text.encode())}

    content = []
    for tok, top in zip(out.token_ids, out.logprobs, strict=True):
        ranked = sorted(top.items(), key=lambda kv: -kv[1])[:k]
        content.append(
            {**entry(tok, top.get(tok, 0.0)), "top_logprobs": [entry(i, lp) for i, lp in ranked]}
        )
    return {"content": content}


def _output(tokens: list[int], tops: list[dict[int, float]]) -> RequestOutput:
    return RequestOutput(request_id="r", prompt_token_ids=[1], token_ids=tokens, text="",
                         finish_reason="length", logprobs=tops)  # fmt: skip


logprob = st.one_of(st.floats(-50, 0), st.just(float("-inf")))
position = st.tuples(st.integers(0, 40), st.dictionaries(st.integers(0, 40), logprob, max_size=8))


@settings(max_examples=60, deadline=None)
@given(st.lists(position, max_size=12), st.integers(0, 8))
def test_logprobs_text_is_the_json_of_the_dict_build(positions, k):
    out = _output([t for t, _ in positions], [top for _, top in positions])
    body = {"choices": [{"index": 0, "logprobs": chat_logprobs(out, _Tok(), k)}]}  # as the route
    assert json.loads(json_bytes(body)) == {"choices": [{"index": 0, "logprobs": _oracle(out, k)}]}


def _tracked_reachable(root) -> int:
    """GC-tracked objects reachable from `root` (root included)."""
    seen, stack = set(), [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or not gc.is_tracked(obj):
            continue
        seen.add(id(obj))
        stack.extend(gc.get_referents(obj))
    return len(seen)


def test_a_long_reply_adds_no_tracked_objects():
    def reply(n: int) -> dict:
        tops = [{(i * 7 + j) % 40: -0.1 * j for j in range(20)} for i in range(n)]
        return chat_logprobs(_output([i % 40 for i in range(n)], tops), _Tok(), 20)

    assert _tracked_reachable(reply(2000)) == _tracked_reachable(reply(5))
