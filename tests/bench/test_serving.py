"""The serving bench in-process (`python -m ninfer.bench.serving --inprocess`) on a tiny model:
every turn of every session yields a sample, timed from the streamed deltas and counted from the
final output's usage."""

from __future__ import annotations

import torch

from ninfer.bench.serving import Shape, run_inprocess
from ninfer.chat_template import ChatTemplate
from ninfer.demo import DEMO_DIR
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.tokenizer import Tokenizer
from tests.engine.engine_helpers import TINY


def test_every_turn_is_a_sample():
    tok = Tokenizer.from_dir(DEMO_DIR)
    model = build_random_model(TINY, torch.float32, "cpu", seed=1)
    shape = Shape(system_words=40, user_words=8, reply=5, turns=2, sessions_per_client=1)
    with LLM.from_model(model, tokenizer=tok, chat_template=ChatTemplate(tok), device="cpu") as llm:
        levels = run_inprocess(llm, shape, [1, 2])
    assert [(lv.concurrency, lv.requests) for lv in levels] == [(1, 2), (2, 4)]
    for lv in levels:
        assert all(s.completion_tokens == shape.reply for s in lv.samples)
        assert all(s.ttft_s > 0 and s.decode_tok_s > 0 for s in lv.samples)
        assert all(0 <= s.cached_tokens < s.prompt_tokens for s in lv.samples)
    # each session's second turn extends its first: its prompt is served from the cache
    assert levels[0].samples[1].cached_tokens > 0
