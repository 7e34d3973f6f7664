"""`ninfer.bench.vision` (CPU): on the tiny random checkpoint with a tower, and on a preset
built in memory (a tiny text shape with Qwen3.5's vocabulary, a tiny tower, the demo's
tokenizer with the vision tokens): every figure is there and positive, the cached turn resumed
past the image, and the engines' models were never two in memory."""

from __future__ import annotations

import gc
import json
import math
import weakref
from dataclasses import replace

import pytest

from ninfer.bench import vision
from ninfer.demo import VISION_TOKENS, demo_vision_tokenizer
from ninfer.models import presets
from ninfer.models.vision import TOKEN_IDS, VisionConfig
from ninfer.vision.preprocess import ImageProcessorConfig, smart_resize
from tests.models.util import narrow
from tests.models.vision_util import PREPROCESSOR, VISION
from tests.vision.vl_checkpoint import build_vl_checkpoint

FIGURES = ("preprocess_s", "tower_s", "first_turn_ttft_s", "cached_turn_ttft_s",
           "cold_turn_ttft_s")  # fmt: skip


def test_bench_vision_prints_its_figures(tmp_path, capsys):
    build_vl_checkpoint(tmp_path)
    vision.main(["--model", str(tmp_path), "--device", "cpu", "--side", "64", "--repeats", "2"])
    result = json.loads(capsys.readouterr().out)
    assert all(result[k] > 0 for k in FIGURES)
    cached, prompt = result["cached_turn_tokens"]
    assert result["image_tokens"] > 0 and result["image_tokens"] < cached < prompt
    assert result["model"] == str(tmp_path) and result["device"] == "cpu"


def test_model_or_preset_is_required_and_not_both(capsys):
    for argv in ([], ["--model", "x", "--preset", "9B"], ["--preset", "nope"]):
        with pytest.raises(SystemExit):
            vision.main(argv)
    capsys.readouterr()


@pytest.fixture
def model_builds(monkeypatch) -> list[weakref.ref]:
    """Every model `build_random_vl_model` builds; each build first checks the earlier ones
    are gone."""
    built: list[weakref.ref] = []
    build = presets.build_random_vl_model

    def checked(*args, **kwargs):
        gc.collect()
        assert all(ref() is None for ref in built), "a second model while one is alive"
        model = build(*args, **kwargs)
        built.append(weakref.ref(model))
        return model

    monkeypatch.setattr(presets, "build_random_vl_model", checked)
    return built


def test_preset_path_end_to_end(model_builds):
    text = replace(narrow(presets.PRESETS["9B"], layers=4), vocab_size=248_320)
    tower = VisionConfig(**VISION, out_hidden_size=text.hidden_size)
    processor = ImageProcessorConfig.from_dict(PREPROCESSOR)
    result = vision.run_preset(text, tower, processor, "cpu", side=64, repeats=1)
    assert all(math.isfinite(result[k]) and result[k] > 0 for k in FIGURES)
    h, w = smart_resize(64, 64, processor.factor, processor.min_pixels, processor.max_pixels)
    assert result["image_tokens"] == (h // processor.factor) * (w // processor.factor)
    cached, prompt = result["cached_turn_tokens"]
    assert result["image_tokens"] < cached < prompt  # resumed past the image
    assert result["device"] == "cpu"
    assert len(model_builds) == 2  # the cached engine's model, then the cold one's


def test_vision_tokens_encode_to_the_released_ids():
    tok = demo_vision_tokenizer()
    for text, field in VISION_TOKENS.items():
        assert tok.encode(text) == [TOKEN_IDS[field]]
        assert tok.token_to_id(text) == TOKEN_IDS[field] and tok.decode([TOKEN_IDS[field]]) == text
    placeholder = "see <|vision_start|><|image_pad|><|vision_end|> here"
    ids = tok.encode(placeholder)
    start = ids.index(248053)
    assert ids[start : start + 3] == [248053, 248056, 248054] and ids.count(248056) == 1
    assert tok.decode(ids) == placeholder
    assert tok.decode(ids, skip_special_tokens=True) == "see  here"
    assert tok.vocab_size == 248058 and len(tok.token_bytes) == 248058
