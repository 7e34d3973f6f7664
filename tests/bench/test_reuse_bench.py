"""`ninfer bench reuse` small on the CPU: the seeded traces replayed on the engine (tiny model,
demo tokenizer and chat template) reuse at least the published floors of the theoretical bound,
the bound itself is computed as documented, and the table prints every trace."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

from ninfer.bench.reuse import TRACE_NAMES, _lcp, _Replay, bench_reuse
from ninfer.bench.workloads import Session, Step
from ninfer.chat_template import ChatTemplate
from ninfer.cli.bench_view import reuse as reuse_table
from ninfer.demo import DEMO_DIR
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.tokenizer import Tokenizer
from tests.engine.engine_helpers import TINY, VOCAB


@pytest.fixture(scope="module")
def make_llm():
    tok = Tokenizer.from_dir(DEMO_DIR)
    template = ChatTemplate(tok)
    model = build_random_model(TINY, torch.float32, "cpu", seed=1)

    def factory() -> LLM:
        return LLM.from_model(
            model,
            tokenizer=tok,
            chat_template=template,
            device="cpu",
            kv_capacity=16384,
            host_cache_mib=64,
            check_invariants=True,
        )

    return factory


@pytest.mark.slow
def test_reuse_floors(make_llm):
    r = bench_reuse(make_llm, VOCAB, seed=0, scale=0.5)
    ratios = {x["trace"]: x["ratio"] for x in r["rows"]}
    assert list(ratios) == list(TRACE_NAMES)
    assert all(x["theoretical"] > 0 and x["reused"] <= x["theoretical"] for x in r["rows"])
    assert all(v >= 0.95 for v in ratios.values()), ratios
    assert ratios["agent"] >= 0.98, ratios
    # clients that drop the reply resume at the previous prompt's end
    assert ratios["noreply"] >= 0.99, ratios
    assert r["overall"]["ratio"] >= 0.95, r["overall"]
    out = io.StringIO()
    Console(file=out, width=120).print(reuse_table(r))
    for name in (*TRACE_NAMES, "overall"):
        assert name in out.getvalue()


class _FakeLLM:
    """generate() answering with fixed tokens and a chosen cached_tokens."""

    def __init__(self, cached: int, reply: list[int]) -> None:
        self.cached, self.reply = cached, reply

    def generate(self, prompt, params):
        from types import SimpleNamespace

        usage = SimpleNamespace(cached_tokens=self.cached)
        ids = prompt["prompt_token_ids"]
        return [SimpleNamespace(prompt_token_ids=ids, token_ids=self.reply, usage=usage)]


def test_theoretical_bound_is_the_longest_prefix_run_capped_at_n_minus_1():
    r = _Replay(_FakeLLM(0, [7, 8, 9]))
    raw, step = Session("raw", [], raw=True), Step("append", max_tokens=3)
    assert r.respond(raw, step, [1, 2, 3, 4]) == [7, 8, 9]  # runs 1 2 3 4 7 8 9
    assert r.theoretical == 0
    r.respond(raw, step, [1, 2, 3, 4, 7, 8, 5])  # shares 1 2 3 4 7 8 with the first sequence
    assert r.theoretical == 6
    r.respond(raw, step, [1, 2, 3, 4])  # a retry: capped at n - 1
    assert r.theoretical == 6 + 3
    assert _lcp([1, 2], [1, 2, 3]) == 2 and _lcp([], [1]) == 0
