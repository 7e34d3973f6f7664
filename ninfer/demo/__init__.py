"""The embedded demo model, used when no `--model` is given.

Its weights are random (`demo_weights_seed`), so the text it generates is noise: it exists so
that `ninfer chat` and the engine run end to end, instantly, on a CPU, without a download. The
assets (config.json, a small sentencepiece tokenizer.model, tokenizer_config.json with the Qwen3.5
chat template, and the corpus the tokenizer was trained on) are built by
`tools/train_demo_tokenizer.py`. This package knows nothing about how weights are initialised;
the engine builds the model from `demo_config()` and the seed.
"""

from __future__ import annotations

from pathlib import Path

from ninfer.models.config import Qwen35Config

DEMO_DIR: Path = Path(__file__).resolve().parent / "assets"
demo_weights_seed = 0
DEMO_LABEL = "ninfer demo model (random weights: its text is noise)"


def demo_config() -> Qwen35Config:
    """The demo model's configuration, read from `DEMO_DIR/config.json`."""
    return Qwen35Config.from_file(DEMO_DIR / "config.json")
