"""Fixtures of the command-line tests (helpers: tests/cli/cli_util.py)."""

from __future__ import annotations

import sys

import pytest

from tests.cli.cli_util import Terminal


@pytest.fixture
def terminal(tmp_path):
    """Starts `python -m ninfer ARGS` on a pseudo-terminal; the chat's history file lives in
    this test's own data directory (`XDG_DATA_HOME`), shared by the terminals it starts."""
    opened: list[Terminal] = []
    data = {"XDG_DATA_HOME": str(tmp_path / "data")}

    def start(*args: str) -> Terminal:
        term = Terminal([sys.executable, "-m", "ninfer", *args], env=data)
        opened.append(term)
        return term

    yield start
    for term in opened:
        term.close()


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory):
    """The demo model written out as a Hugging Face-format checkpoint folder."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from ninfer.demo import DEMO_DIR, demo_config, demo_weights_seed
    from ninfer.models.presets import build_random_model

    path = tmp_path_factory.mktemp("checkpoint")
    model = build_random_model(demo_config(), torch.float32, "cpu", seed=demo_weights_seed)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    weights = {k: v.contiguous() for k, v in model.state_dict().items() if k not in tied}
    save_file(weights, str(path / "model.safetensors"))
    for name in ("config.json", "tokenizer.model", "tokenizer_config.json"):
        shutil.copy(DEMO_DIR / name, path / name)
    return path
