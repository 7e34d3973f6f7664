"""The embedded demo model, used when no `--model` is given.

Its weights are random (`demo_weights_seed`), so the text it generates is noise: it exists so
that `ninfer chat` and the engine run end to end, instantly, on a CPU, without a download. The
assets (config.json, a small sentencepiece tokenizer.model, tokenizer_config.json with the Qwen3.5
chat template, and the corpus the tokenizer was trained on) are built by
`tools/train_demo_tokenizer.py`. This package knows nothing about how weights are initialised;
the engine builds the model from `demo_config()` and the seed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from ninfer.models.config import Qwen35Config

DEMO_DIR: Path = Path(__file__).resolve().parent / "assets"
demo_weights_seed = 0
DEMO_LABEL = "ninfer demo model (random weights: its text is noise)"

# The chat's system prompt on the demo model. A follow-up turn reuses what its conversation
# renders the same way again; Qwen3.5's chat template rewrites an earlier reply (it drops the
# reasoning block), so a reply is prefilled again and what a second turn can reuse is the first
# turn's prompt. A system prompt longer than two 64-token blocks makes that prompt span cache
# blocks, so the demo's second turn shows the cache at work, as a deployment with a system
# prompt would.
DEMO_SYSTEM_PROMPT = (
    "You are the ninfer demo model: a tiny network with the Qwen3.5 architecture and random "
    "weights, built into ninfer so that its engine and its hybrid prefix cache can be tried on "
    "any machine, without a download. Your replies are noise. This system prompt fills more "
    "than two 64-token blocks of the prefix cache, so from the second turn of a conversation "
    "on, the system prompt and the earlier messages are served from the cache and only the "
    "rest of the prompt is computed."
)
DEMO_MAX_TOKENS = 128  # its replies are noise: short ones keep a CPU chat quick


def demo_config() -> Qwen35Config:
    """The demo model's configuration, read from `DEMO_DIR/config.json`."""
    return Qwen35Config.from_file(DEMO_DIR / "config.json")


# Qwen3.5's vision tokens: their text and the config.json field that holds their id
VISION_TOKENS = {
    "<|vision_start|>": "vision_start_token_id",
    "<|vision_end|>": "vision_end_token_id",
    "<|image_pad|>": "image_token_id",
    "<|video_pad|>": "video_token_id",
}


def demo_vision_tokenizer():
    """The demo's tokenizer (`ninfer.tokenizer.Tokenizer`) with Qwen3.5's vision tokens added at
    the released ids (`ninfer.models.vision.TOKEN_IDS`), past its own vocabulary: the chat
    template's image placeholders then encode as they do with a vision checkpoint. The ids are
    rows of any Qwen3.5-sized embedding (a preset's, not the demo model's)."""
    from ninfer.models.vision import TOKEN_IDS
    from ninfer.tokenizer import Tokenizer

    config = json.loads((DEMO_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    added = config["added_tokens_decoder"]
    for text, field in VISION_TOKENS.items():
        added[str(TOKEN_IDS[field])] = {"content": text, "special": True}
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(DEMO_DIR / "tokenizer.model", tmp)
        (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        return Tokenizer.from_dir(tmp)
