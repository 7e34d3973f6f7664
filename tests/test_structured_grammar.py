"""The grammar layer (`ninfer.structured`) without a model: random walks through the masks of
the dozen schemas on a byte-level BPE vocabulary in Qwen3.5's shape (every step a random token
the mask allows) end in documents that parse and validate; the schema guard refuses what the
grammar would not enforce."""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ninfer.bench.schemas import SCHEMAS
from ninfer.request import StructuredOutputsParams
from ninfer.server.tool_calls import parse_text, tool_schemas
from ninfer.structured import (
    Grammars,
    Unenforceable,
    enforceable_schema,
    length_pattern,
    token_mask,
    tool_call_tag,
)
from ninfer.tokenizer import Tokenizer

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")
sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from tiny_tokenizer import build_tiny_bpe  # noqa: E402


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_dir(build_tiny_bpe(tmp_path_factory.mktemp("bpe")))


def _walk(
    grammars: Grammars, spec, tok: Tokenizer, seed: int, vocab: int, steps: int = 120
) -> str | None:
    rng = random.Random(seed)
    m = grammars.compile(spec).start([])
    stop = set(tok.eos_token_ids)
    ids: list[int] = []
    shifts = torch.arange(32, dtype=torch.int32)
    for _ in range(steps):
        mask = token_mask([m], vocab, pin=False)
        allowed = ((mask.bits.unsqueeze(-1) >> shifts) & 1).view(-1)[:vocab].nonzero()
        pick = allowed.flatten().tolist()
        ends = [t for t in pick if t in stop]
        t = ends[0] if ends and rng.random() < 0.5 else rng.choice(pick)
        m.accept(t)
        if t in stop:
            return tok.decode(ids)
        ids.append(t)
    return None


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_random_walks_give_valid_documents_on_a_byte_level_vocabulary(bpe, index):
    vocab = len(bpe.token_bytes) + 7  # logits wider than the tokenizer: the rest is masked
    grammars = Grammars(bpe, vocab, bpe.eos_token_ids)
    spec = StructuredOutputsParams(json=SCHEMAS[index])
    for seed in range(6):
        text = _walk(grammars, spec, bpe, seed, vocab)
        if text is not None:
            jsonschema.validate(json.loads(text), SCHEMAS[index])


def test_the_guard_refuses_what_the_grammar_would_not_enforce():
    for schema, word in [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"anyOf": [{"not": {"type": "string"}}]}, "'not' at /anyOf/0"),
        ({"oneOf": [{"type": "integer"}]}, "use anyOf"),
        ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "allOf"),
        ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "length bound"),
        ({"type": "array", "contains": {"const": 1}}, "contains"),
    ]:
        with pytest.raises(Unenforceable, match=word):
            enforceable_schema(schema)
    inlined = enforceable_schema({"allOf": [{"type": "integer"}], "description": "d"})
    assert inlined == {"type": "integer", "description": "d"}
    bounded = enforceable_schema({"properties": {"s": {"type": "string", "maxLength": 4}}})
    assert bounded["properties"]["s"]["pattern"] == "^[\\u0020-\\U0010FFFF]{0,4}$"


BOUNDED = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 2, "maxLength": 4},
        "tag": {"type": "string", "maxLength": 1},
        "code": {"type": "string", "pattern": "^[A-Z]{2}$"},
        "units": {"enum": ["metric", "imperial"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "tag", "code", "units", "days"],
}


@pytest.mark.parametrize("seed", range(8))
def test_forced_tool_call_arguments_validate_as_the_parser_reads_them(bpe, seed):
    """A forced call in Qwen3.5's XML format, walked at random (whitespace padding the values
    wherever the grammar allows it), parses to arguments that validate against the tool's
    schema: a bounded string comes out within its bounds."""
    vocab = len(bpe.token_bytes)
    tools = [{"type": "function", "function": {"name": "get", "parameters": BOUNDED}}]
    spec = StructuredOutputsParams(structural_tag=tool_call_tag(tools, "get"))
    text = _walk(Grammars(bpe, vocab, bpe.eos_token_ids), spec, bpe, seed, vocab, steps=400)
    assert text is not None
    _, _, calls = parse_text(text, False, tool_schemas(tools), lambda: "id")
    assert len(calls) == 1
    jsonschema.validate(calls[0].arguments, BOUNDED)


@given(st.integers(0, 6), st.one_of(st.none(), st.integers(0, 6)), st.text(" ab", max_size=8))
def test_the_trimmed_length_pattern_is_the_bounds_without_edge_spaces(lo, hi, s):
    expected = lo <= len(s) and (hi is None or len(s) <= hi) and s == s.strip(" ")
    if hi is not None and hi < max(lo, 1):
        return  # an empty range (or only ""): the plain pattern, left to the compiler
    assert bool(re.fullmatch(length_pattern(lo, hi, trim=True).strip("^$"), s)) == expected
