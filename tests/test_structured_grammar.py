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
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.bench.schemas import SCHEMAS
from ninfer.request import StructuredOutputsParams
from ninfer.schema_guard import Unenforceable, enforceable_schema, length_pattern
from ninfer.server.tool_calls import parse_text, tool_schemas
from ninfer.structured import Grammars, token_mask, tool_call_tag
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
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "branches 0 and 1"),
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


@settings(deadline=None)  # the first regex compile of a code-point class is slow
@given(st.integers(0, 6), st.one_of(st.none(), st.integers(0, 6)), st.text(" ab", max_size=8))
def test_the_trimmed_length_pattern_is_the_bounds_without_edge_spaces(lo, hi, s):
    expected = lo <= len(s) and (hi is None or len(s) <= hi) and s == s.strip(" ")
    if hi is not None and hi < max(lo, 1):
        return  # an empty range (or only ""): the plain pattern, left to the compiler
    assert bool(re.fullmatch(length_pattern(lo, hi, trim=True).strip("^$"), s)) == expected


# ---- oneOf: exclusive branches are taken as anyOf, the rest refused -------------------------
PET = {  # a tagged union as pydantic writes one (`Field(discriminator="pet_type")`)
    "$defs": {
        "Cat": {
            "type": "object",
            "properties": {
                "pet_type": {"const": "cat", "type": "string"},
                "lives": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["pet_type", "lives"],
        },
        "Dog": {
            "type": "object",
            "properties": {
                "pet_type": {"const": "dog", "type": "string"},
                "good": {"type": "boolean"},
            },
            "required": ["pet_type", "good"],
        },
    },
    "type": "object",
    "properties": {
        "pet": {
            "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
            "discriminator": {"propertyName": "pet_type"},
        },
        "id": {"oneOf": [{"type": "integer", "maximum": 99}, {"type": "null"}]},
    },
    "required": ["pet", "id"],
}


def test_a_tagged_union_one_of_walks_to_valid_documents(bpe):
    vocab = len(bpe.token_bytes)
    grammars = Grammars(bpe, vocab, bpe.eos_token_ids)
    spec = StructuredOutputsParams(json=PET)
    done = 0
    for seed in range(8):
        text = _walk(grammars, spec, bpe, seed, vocab, steps=200)
        if text is not None:
            jsonschema.validate(json.loads(text), PET)  # oneOf: exactly one branch
            done += 1
    assert done


def test_one_of_is_refused_where_branches_may_overlap():
    obj = {"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]}
    loose = {"type": "object", "properties": {"k": {"const": "b"}}}  # k not required
    for branches, pair in [
        ([{"type": "integer"}, {"type": "number"}], "0 and 1"),
        ([{"type": "string"}, {"maxLength": 3}], "0 and 1"),  # no type: anything
        ([{"type": "null"}, obj, loose], "1 and 2"),
        ([obj, {"$ref": "https://example.com/s.json"}], "0 and 1"),
        ([{"enum": ["a", 1]}, {"enum": [1.0, "b"]}], "0 and 1"),  # 1 and 1.0 are one value
    ]:
        with pytest.raises(Unenforceable, match=f"branches {pair}"):
            enforceable_schema({"oneOf": branches})
    with pytest.raises(Unenforceable, match="beside 'anyOf'"):
        enforceable_schema({"oneOf": [{"type": "null"}], "anyOf": [{"type": "null"}]})
    taken = enforceable_schema(PET)["properties"]["pet"]
    assert "oneOf" not in taken and len(taken["anyOf"]) == 2


_BRANCHES = st.one_of(
    st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"]).map(
        lambda t: {"type": t}
    ),
    st.sampled_from([None, True, 0, 1, 1.0, "a", "b"]).map(lambda v: {"const": v}),
    st.lists(st.sampled_from([0, 1.0, "a", "b", None]), min_size=1, max_size=3).map(
        lambda vs: {"enum": vs}
    ),
    st.builds(
        lambda tag, required: {
            "type": "object",
            "properties": {"k": tag},
            **({"required": ["k"]} if required else {}),
        },
        st.sampled_from([{"const": "a"}, {"const": "b"}, {"enum": ["a", "c"]}, {}]),
        st.booleans(),
    ),
)
_INSTANCES = [None, True, False, 0, 1, 1.0, 2.5, "a", "b", [], [1], {}, {"k": "a"},
              {"k": "b"}, {"k": "c"}, {"k": 1}]  # fmt: skip


@settings(deadline=None)
@given(st.lists(_BRANCHES, min_size=1, max_size=4))
def test_an_accepted_one_of_never_has_two_matching_branches(branches):
    """Soundness of the exclusivity proof: when the guard takes a oneOf, no instance of a
    pool covering every type (and the tags) validates against two of its branches."""
    try:
        enforceable_schema({"oneOf": branches})
    except Unenforceable:
        return
    for value in _INSTANCES:
        matches = sum(jsonschema.Draft202012Validator(b).is_valid(value) for b in branches)
        assert matches <= 1, (value, branches)


def _allowed(bits: torch.Tensor, vocab: int) -> list[int]:
    shifts = torch.arange(32, dtype=torch.int32)
    return ((bits.unsqueeze(-1) >> shifts) & 1).view(-1)[:vocab].nonzero().flatten().tolist()


def _masks_by_accepting(m, drafts: list[int], vocab: int) -> list[torch.Tensor | None]:
    """The mask before each of drafts[:j] (j = 0 .. len(drafts)), None where none applies,
    by accepting them one by one (`m` advances), to the first one rejected."""
    out = []
    for j in range(len(drafts) + 1):
        mask = token_mask([m], vocab, pin=False)
        out.append(None if mask is None else mask.bits[0].clone())
        if j == len(drafts):
            break
        try:
            m.accept(drafts[j])
        except ValueError:
            break
    return out


@settings(max_examples=40, deadline=None)
@given(
    index=st.sampled_from([0, 2, 5, 8]),
    seed=st.integers(0, 10**6),
    walked=st.integers(0, 30),
    drafts=st.integers(0, 5),
    wrong=st.floats(0, 0.5),
    budget=st.sampled_from([None, 0, 3, 12]),
    force=st.booleans(),
)
def test_draft_masks_are_the_masks_after_accepting_the_drafts(
    bpe, index, seed, walked, drafts, wrong, budget, force
):
    """`Matcher.fill_drafts` (speculative decoding's verify rows): row j is the mask after
    drafts[:j] were accepted, up to the first draft the grammar (or a spent thinking budget)
    rejects, all ones past it; and the matcher is left as it was, its grammar rolled back:
    its masks and acceptances go on as those of a matcher that never saw the drafts. Drafts
    mostly follow the mask, some are any token (a draft head proposes what it likes); with a
    budget the prompt leaves a reasoning block open. With `force`, a position whose mask
    allows one token only gets that token as its draft (and is listed) where the draft was
    another; the rest as proposed."""
    vocab = len(bpe.token_bytes) + 7
    spec = StructuredOutputsParams(json=SCHEMAS[index])
    grammar = Grammars(bpe, vocab, bpe.eos_token_ids).compile(spec, thinking_budget=budget)
    prompt = [] if budget is None else [bpe.token_to_id("<think>")]
    rng = random.Random(seed)
    shifts = torch.arange(32, dtype=torch.int32)

    def pick(m) -> int:
        mask = token_mask([m], vocab, pin=False)
        if mask is None or rng.random() < wrong:
            return rng.randrange(vocab)
        allowed = ((mask.bits.unsqueeze(-1) >> shifts) & 1).view(-1)[:vocab].nonzero()
        return rng.choice(allowed.flatten().tolist())

    m, twin, control = (grammar.start(prompt) for _ in range(3))
    for _ in range(walked):  # all three walk the same accepted tokens
        t = pick(m)
        try:
            m.accept(t)
        except ValueError:
            continue
        twin.accept(t)
        control.accept(t)
    props = [pick(m) for _ in range(drafts)]
    proposed, forced = list(props), [] if force else None
    bits = torch.zeros(drafts + 1, (vocab + 31) // 32, dtype=torch.int32)
    constrained = m.fill_drafts(props, bits, forced)
    want = _masks_by_accepting(twin, props, vocab)
    for j in range(drafts):  # forced where the mask allows one token only, and only there
        mask = want[j] if j < len(want) else None
        one = None if mask is None else _allowed(mask, vocab)
        if force and one is not None and len(one) == 1:
            assert props[j] == one[0], j
        if force and j in forced:
            assert one == [props[j]] and props[j] != proposed[j], j
        else:
            assert props[j] == proposed[j], j
    assert constrained == any(w is not None for w in want)
    for j in range(drafts + 1):
        w = want[j] if j < len(want) and want[j] is not None else torch.full_like(bits[j], -1)
        assert torch.equal(bits[j], w), j
    for _ in range(8):  # m goes on as the matcher that never saw the drafts
        mask, expected = token_mask([m], vocab, pin=False), token_mask([control], vocab, False)
        assert (mask is None) == (expected is None)
        assert mask is None or torch.equal(mask.bits, expected.bits)
        t = pick(control)
        try:
            control.accept(t)
        except ValueError:
            with pytest.raises(ValueError):
                m.accept(t)
            continue
        m.accept(t)
