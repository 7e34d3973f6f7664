"""Structured outputs (`SamplingParams.structured_outputs`): constrained decoding never produces
an invalid document, even with random weights. On the CPU with the demo model: a dozen JSON
schemas sampled at temperature 1 with several seeds; every reply that finished "stop" parses
and validates. Constrained and free lanes share batches; the grammar survives a suspension;
with thinking, the reasoning stays free."""

from __future__ import annotations

import json
import random
import re

import pytest
from engine_helpers import assert_idle, rand_tokens

from ninfer import LLM, SamplingParams, StructuredOutputsParams
from ninfer.bench.schemas import SCHEMAS
from ninfer.request import RequestOutput
from ninfer.structured import Grammars

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def llm():
    with LLM(
        None, device="cpu", kv_capacity=16384, host_cache_mib=16, check_invariants=True
    ) as llm:
        yield llm


def _json(schema, seed, max_tokens=160, **kw) -> SamplingParams:
    spec = StructuredOutputsParams(json=schema)
    return SamplingParams(max_tokens=max_tokens, seed=seed, structured_outputs=spec, **kw)


def test_constrained_json_always_parses_and_validates(llm):
    """The validity test: 12 schemas x 3 seeds at temperature 1, one batch."""
    cases = [(s, seed) for s in SCHEMAS for seed in SEEDS]
    outs = llm.generate(["Answer in JSON."] * len(cases), [_json(s, seed) for s, seed in cases])
    stopped = 0
    for out, (schema, _) in zip(outs, cases, strict=True):
        assert out.finish_reason in ("stop", "length"), out.error
        if out.finish_reason == "stop":
            stopped += 1
            jsonschema.validate(json.loads(out.text), schema)
    assert stopped >= 0.8 * len(cases)


def test_regex_choice_and_grammar(llm):
    specs = [
        (StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2,5}"), r"[0-9]{3}-[a-z]{2,5}"),
        (StructuredOutputsParams(choice=["yes", "no", "maybe so"]), r"yes|no|maybe so"),
        (StructuredOutputsParams(grammar='root ::= "(" [ab]+ ")"'), r"\([ab]+\)"),
        (StructuredOutputsParams(json_object=True), None),
    ]
    params = [
        SamplingParams(max_tokens=60, seed=seed, structured_outputs=spec)
        for spec, _ in specs
        for seed in SEEDS
    ]
    outs = llm.generate(["Reply."] * len(params), params)
    for i, out in enumerate(outs):
        spec, pattern = specs[i // len(SEEDS)]
        if out.finish_reason != "stop":
            assert out.finish_reason == "length" and pattern != r"yes|no|maybe so"
            continue
        if pattern is None:
            assert isinstance(json.loads(out.text), dict)
        else:
            assert re.fullmatch(pattern, out.text), (spec, out.text)


def test_free_lanes_are_untouched_by_constrained_neighbours(llm):
    """Seeded free requests give the same tokens alone and in a batch where every other lane
    is constrained; constrained ones give the same tokens alone and batched."""
    free = [SamplingParams(max_tokens=24, seed=s, ignore_eos=True) for s in (5, 6)]
    bound = [_json(SCHEMAS[i], seed=i, max_tokens=24) for i in (0, 7)]
    mixed = [p for pair in zip(free, bound, strict=True) for p in pair]
    prompts = [f"Prompt {i}." for i in range(len(mixed))]
    together = llm.generate(prompts, mixed)
    alone = [llm.generate(p, sp)[0] for p, sp in zip(prompts, mixed, strict=True)]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]


def test_same_tokens_without_the_decode_overlap(llm):
    """The overlapped path (mask computed after the step in flight settles, sampling queued
    then) samples what the plain path samples."""
    params = [_json(SCHEMAS[i], seed=10 + i) for i in range(4)]
    prompts = ["x"] * 4
    with LLM(None, device="cpu", kv_capacity=16384, host_cache_mib=0, overlap_decode=False) as b:
        plain = b.generate(prompts, params)
    overlapped = llm.generate(prompts, params)
    assert llm.engine.overlapped_steps > 0
    assert [o.token_ids for o in plain] == [o.token_ids for o in overlapped]


def test_logprobs_are_of_the_constrained_distribution(llm):
    spec = StructuredOutputsParams(choice=["alpha", "beta"])
    out = llm.generate(
        "Pick.", SamplingParams(max_tokens=10, seed=3, logprobs=5, structured_outputs=spec)
    )[0]
    assert out.text in ("alpha", "beta") and out.logprobs
    for tok, top in zip(out.token_ids, out.logprobs, strict=True):
        assert top[tok] > float("-inf")
        finite = [lp for lp in top.values() if lp > float("-inf")]
        assert sum(2.718281828459045**lp for lp in finite) <= 1.0 + 1e-4


def test_an_uncompilable_schema_names_the_field(llm):
    bad = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "nope"}}})
    with pytest.raises(ValueError, match=r"structured_outputs\.json: cannot compile"):
        llm.generate("x", SamplingParams(structured_outputs=bad))
    with pytest.raises(ValueError, match=r"structured_outputs\.regex"):
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(regex="((")))
    with pytest.raises(ValueError, match="set exactly one"):
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams()))
    outs = llm.generate(
        ["x", "y"], [SamplingParams(structured_outputs=bad), SamplingParams(max_tokens=2)]
    )
    assert outs[0].finish_reason == "error" and "structured_outputs.json" in outs[0].error
    assert outs[1].finish_reason == "length"


def test_thinking_stays_free_until_the_think_block_closes(llm):
    """A prompt that leaves `<think>` open: the grammar waits for the generated `</think>`.
    Forced here by a stop-free grammar check on the matcher itself."""
    tok = llm.tokenizer
    think, close = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    grammars = Grammars(tok, llm.model_config.vocab_size, llm.engine.eos)
    grammar = grammars.compile(_json(SCHEMAS[1], seed=0).validated().structured_outputs)
    m = grammar.start([5, 6, think, 7])
    assert not m.active
    m.accept(tok.encode("free text")[0])  # anything goes while thinking
    m.accept(close)
    assert m.active
    with pytest.raises(ValueError, match="rejects"):
        m.accept(tok.encode("free")[0])
    assert grammar.start([think, 9, close]).active  # thinking off: constrained at once
    # end to end: a thinking chat reply is free until it closes its reasoning
    out = llm.chat([{"role": "user", "content": "hi"}], _json(SCHEMAS[1], seed=4, max_tokens=40))[0]
    assert out.finish_reason in ("stop", "length")
    if close not in out.token_ids:  # random weights rarely close it: the text is free
        assert out.finish_reason == "length"


def test_the_grammar_survives_a_suspension(make_llm, monkeypatch):
    """Two long constrained replies on a pool too small for both: a lane is suspended and
    resumed, carrying its matcher; each reply is the one it gives alone, and it validates."""
    from ninfer.engine.kv import pages

    monkeypatch.setattr(pages, "OUTPUT_WINDOW", 64)
    schema = {
        "type": "array",
        "items": {"type": "integer", "minimum": 10, "maximum": 99},
        "minItems": 40,
        "maxItems": 40,
    }
    rng = random.Random(3)
    prompts = [rand_tokens(rng, 100), rand_tokens(rng, 120)]
    params = [_json(schema, seed=s, max_tokens=400) for s in (1, 2)]
    small = make_llm(kv_capacity=8 * 64, max_concurrency=2)
    roomy = make_llm(kv_capacity=200 * 64, max_concurrency=1, prefix_reuse=False)
    outs: list[RequestOutput] = small.generate(prompts, params)
    assert sum(o.metrics.suspensions for o in outs) >= 1
    for out, prompt, sp in zip(outs, prompts, params, strict=True):
        assert out.finish_reason == "stop", out.error
        jsonschema.validate(json.loads(out.text), schema)
        assert out.token_ids == roomy.generate([prompt], sp)[0].token_ids
    assert_idle(small)


def test_cancelled_and_finished_lanes_drop_their_grammar(llm):
    stream = llm.stream("x", _json(SCHEMAS[0], seed=1, max_tokens=100))
    next(stream)
    stream.close()
    assert not llm.engine.call(lambda: [ln for ln in llm.engine.lanes])
