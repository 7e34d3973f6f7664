"""Streaming detokenization: deltas add up to the full decode, never show broken characters,
and stop strings cut the text before the stop string."""

from __future__ import annotations

import pytest
from fixtures.tiny_tokenizer import build_tiny_bpe

from ninfer.demo import DEMO_DIR
from ninfer.detokenizer import Detokenizer
from ninfer.tokenizer import Tokenizer

TEXTS = [
    "Hello world, this is a test of streaming.",
    " leading space and  double  spaces\nnew line",
    "café 你好 🌧🌈 naïve — done",
    "tokens <think>inside</think> and end<|im_end|>",
    'numbers 12345 and JSON {"a": [1, 2]}',
]


@pytest.fixture(scope="module", params=["bpe", "demo"])
def tok(request, tmp_path_factory):
    if request.param == "demo":
        return Tokenizer.from_dir(DEMO_DIR)
    return Tokenizer.from_dir(build_tiny_bpe(tmp_path_factory.mktemp("tiny_bpe")))


def _stream(tok, ids, chunk=1, **kw):
    d = Detokenizer(tok, **kw)
    deltas, hit = [], False
    for i in range(0, len(ids), chunk):
        delta, hit = d.feed(ids[i : i + chunk])
        deltas.append(delta)
        if hit:
            break
    deltas.append(d.flush())
    return deltas, hit, d


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 3])
def test_deltas_add_up_to_decode(tok, text, chunk):
    ids = tok.encode(text)
    deltas, hit, d = _stream(tok, ids, chunk)
    assert not hit
    want = tok.decode(ids, skip_special_tokens=True)
    assert "".join(deltas) == want == d.text
    if "\ufffd" not in want:
        assert not any("\ufffd" in x for x in deltas)


def test_prompt_context_keeps_leading_space(tok):
    prompt = tok.encode("<|im_start|>assistant\nWell")
    out = tok.encode(" then, hello there")
    deltas, _, _ = _stream(tok, out, prompt_token_ids=prompt)
    full = tok.decode(prompt + out, skip_special_tokens=True)
    assert "".join(deltas) == full[len(tok.decode(prompt, skip_special_tokens=True)) :]
    assert "".join(deltas).startswith(" then")


def test_special_tokens_kept_when_asked(tok):
    ids = tok.encode("a<|im_end|>")
    deltas, _, _ = _stream(tok, ids, skip_special_tokens=False)
    assert "".join(deltas) == "a<|im_end|>"


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_stop_string_excluded_and_never_streamed(tok, chunk):
    text = "The answer is 42. STOP here and more text after STOP."
    ids = tok.encode(text)
    deltas, hit, d = _stream(tok, ids, chunk, stop=["STOP"])
    assert hit and d.stopped
    assert "".join(deltas) == d.text == "The answer is 42. "
    assert d.feed(tok.encode(" more")) == ("", True)


def test_earliest_stop_wins_and_spans_tokens(tok):
    ids = tok.encode("alpha beta gamma delta")
    deltas, hit, d = _stream(tok, ids, stop=["delta", "ta gam", "zzz"])
    assert hit and "".join(deltas) == "alpha be"


def test_held_back_text_is_flushed_without_stop(tok):
    ids = tok.encode("no stop string in this one")
    d = Detokenizer(tok, stop=["NEVERMATCHES"])
    streamed = "".join(d.feed([t])[0] for t in ids)
    assert len(streamed) <= len(d.text) - len("NEVERMATCHES") + 1
    assert streamed + d.flush() == "no stop string in this one"


def test_stop_at_very_start(tok):
    deltas, hit, d = _stream(tok, tok.encode("Hi there"), stop=["Hi"])
    assert hit and "".join(deltas) == "" and d.text == ""
