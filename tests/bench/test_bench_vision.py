"""`ninfer.bench.vision` on the tiny random checkpoint with a tower (CPU): every figure is
there and positive, and the cached turn resumed past the image."""

from __future__ import annotations

import json

from ninfer.bench import vision
from tests.vision.vl_checkpoint import build_vl_checkpoint


def test_bench_vision_prints_its_figures(tmp_path, capsys):
    build_vl_checkpoint(tmp_path)
    vision.main(["--model", str(tmp_path), "--device", "cpu", "--side", "64", "--repeats", "2"])
    result = json.loads(capsys.readouterr().out)
    keys = ("preprocess_s", "tower_s", "first_turn_ttft_s", "cached_turn_ttft_s",
            "cold_turn_ttft_s")  # fmt: skip
    assert all(result[k] > 0 for k in keys)
    cached, prompt = result["cached_turn_tokens"]
    assert result["image_tokens"] > 0 and result["image_tokens"] < cached < prompt
