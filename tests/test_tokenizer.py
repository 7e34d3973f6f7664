"""Tokenizer loading for both backends: tokenizer.json (vs transformers) and the demo's
sentencepiece tokenizer.model."""

from __future__ import annotations

import json
import shutil

import pytest
from fixtures.tiny_tokenizer import ADDED, CONTROL, build_tiny_bpe

from ninfer.demo import DEMO_DIR, demo_config, demo_weights_seed
from ninfer.tokenizer import Tokenizer

SAMPLES = [
    "",
    "Hello world",
    "  leading and trailing spaces  ",
    "line one\nline two\r\n\n\ttab",
    "café naïve Straße 你好 🌧 e\u0301",  # the last is NFD: NFC-normalised by the BPE tokenizer
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nx</think>\n\ny",
    "a<|im_end|>b<tool_call>c</tool_call><tool_response>d</tool_response>",
    'numbers 1234567 and 3.14, JSON {"a": [1, 2]}',
    "<|im_start",  # a partial special token is plain text
]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return build_tiny_bpe(tmp_path_factory.mktemp("tiny_bpe"))


@pytest.fixture(scope="module")
def bpe(bpe_dir):
    return Tokenizer.from_dir(bpe_dir)


@pytest.fixture(scope="module")
def demo():
    return Tokenizer.from_dir(DEMO_DIR)


def test_bpe_matches_transformers(bpe_dir, bpe):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(bpe_dir))
    for s in SAMPLES:
        ids = bpe.encode(s)
        assert ids == hf.encode(s, add_special_tokens=False), s
        assert bpe.decode(ids) == hf.decode(ids, skip_special_tokens=False)
        assert bpe.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
    assert bpe.vocab_size == len(hf)


@pytest.mark.parametrize("which", ["bpe", "demo"])
def test_special_tokens_are_single_ids(which, request):
    tok = request.getfixturevalue(which)
    for t in CONTROL + ADDED:
        i = tok.token_to_id(t)
        assert i is not None and tok.id_to_token(i) == t
        assert tok.encode(t) == [i]
        assert tok.encode(f"x{t}y").count(i) == 1
        assert tok.decode([i]) == t
    ids = tok.encode("<|im_start|>assistant\n")
    assert ids[0] == tok.token_to_id("<|im_start|>")
    assert tok.decode(ids[1:]) == "assistant\n"


@pytest.mark.parametrize("which", ["bpe", "demo"])
def test_skip_special_tokens_drops_control_tokens_only(which, request):
    tok = request.getfixturevalue(which)
    ids = tok.encode("<|im_start|>user\nhi<|im_end|><think>t</think><|endoftext|>")
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi<think>t</think>"


@pytest.mark.parametrize("which", ["bpe", "demo"])
def test_added_ids_hold_the_added_tokens_special_or_not(which, request):
    """`added_ids` (a trimmed MTP draft vocabulary keeps them): the control tokens and the
    added ones that are not special (`<think>`, which `skip_special_tokens` keeps)."""
    tok = request.getfixturevalue(which)
    think, end = tok.token_to_id("<think>"), tok.token_to_id("<|im_end|>")
    assert think not in tok.special_ids and {think, end} <= tok.added_ids
    assert tok.special_ids <= tok.added_ids


def test_demo_roundtrip_with_byte_fallback(demo):
    for s in SAMPLES:
        if s != SAMPLES[4]:  # sentencepiece does not normalise (identity rule)
            assert demo.decode(demo.encode(s)) == s
    s = "café 你好 🌧"
    ids = demo.encode(s)
    assert demo.decode(ids) == s
    assert any(demo.id_to_token(i).startswith("<0x") for i in ids)  # byte fallback was used


def test_eos_ids(bpe, demo):
    im_end, eot = bpe.token_to_id("<|im_end|>"), bpe.token_to_id("<|endoftext|>")
    assert bpe.eos_token_ids == (im_end, eot)  # generation_config first, then eos_token
    assert set(demo.eos_token_ids) == {demo.token_to_id("<|im_end|>"), demo.token_to_id(CONTROL[0])}
    assert demo.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


def test_unknown_token_lookup(bpe, demo):
    for tok in (bpe, demo):
        assert tok.token_to_id("<|no such token|>") is None
        assert tok.id_to_token(10**9) is None
        ids = tok.encode("ab")
        assert tok.decode([ids[0], tok.vocab_size + 3, *ids[1:]]) == "ab"  # padded rows: dropped


def test_chat_template_jinja_overrides_config(bpe_dir, tmp_path):
    d = tmp_path / "tok"
    shutil.copytree(bpe_dir, d)
    assert Tokenizer.from_dir(d).chat_template.startswith("{%- set image_count")
    (d / "chat_template.jinja").write_text("{{ messages[0].content }}", encoding="utf-8")
    assert Tokenizer.from_dir(d).chat_template == "{{ messages[0].content }}"
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": "A"},
        {"name": "tool_use", "template": "B"},
    ]
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    (d / "chat_template.jinja").unlink()
    assert Tokenizer.from_dir(d).chat_template == {"default": "A", "tool_use": "B"}


def test_missing_tokenizer(tmp_path):
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_dir(tmp_path)


def test_demo_assets():
    cfg = demo_config()
    tok = Tokenizer.from_dir(DEMO_DIR)
    assert cfg.model_type == "qwen3_5_text" and cfg.tie_word_embeddings
    assert cfg.vocab_size % 64 == 0 and tok.vocab_size <= cfg.vocab_size
    assert cfg.eos_token_ids[0] == tok.token_to_id("<|im_end|>")
    assert cfg.full_layer_ids == (3, 7)
    assert demo_weights_seed == 0
    total = sum(p.stat().st_size for p in DEMO_DIR.iterdir())
    assert total < 2 * 2**20


def test_sentencepiece_added_tokens_past_its_pieces(tmp_path):
    """Added tokens whose ids lie past the sentencepiece pieces extend the vocabulary: each
    encodes to its id and decodes to its text; the ids between are empty, and a special one
    is dropped by `skip_special_tokens`."""
    config = json.loads((DEMO_DIR / "tokenizer_config.json").read_text())
    n = Tokenizer.from_dir(DEMO_DIR).vocab_size
    config["added_tokens_decoder"] |= {
        str(n + 5): {"content": "<|far|>", "special": True},
        str(n + 2): {"content": "<|near|>", "special": False},
    }
    shutil.copy(DEMO_DIR / "tokenizer.model", tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_dir(tmp_path)
    ids = tok.encode("a<|near|>b<|far|>")
    assert ids[-1] == n + 5 and n + 2 in ids
    assert tok.decode(ids) == "a<|near|>b<|far|>"
    assert tok.decode(ids, skip_special_tokens=True) == "a<|near|>b"
    assert tok.vocab_size == n + 6 and tok.id_to_token(n + 5) == "<|far|>"
    assert tok.id_to_token(n + 3) is None and tok.decode([n + 3]) == ""
    assert tok.token_bytes[n:] == (b"", b"", b"<|near|>", b"", b"", b"<|far|>")
