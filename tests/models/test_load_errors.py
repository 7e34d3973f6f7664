"""A broken checkpoint fails at load with one line naming the file and the key, or the tensor:
a config.json value of the wrong type, a broken tokenizer_config.json, weights holding NaN or
infinity (which would only print `⁇` tokens)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer.cli.main import main
from ninfer.demo import DEMO_DIR, demo_config, demo_weights_seed
from ninfer.models.config import Qwen35Config
from ninfer.models.presets import build_random_model
from ninfer.models.weights import load_model
from ninfer.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The demo model as a checkpoint folder (a copy per test: `fresh`)."""
    path = tmp_path_factory.mktemp("demo-ckpt")
    model = build_random_model(demo_config(), torch.float32, "cpu", seed=demo_weights_seed)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    weights = {k: v.contiguous() for k, v in model.state_dict().items() if k not in tied}
    save_file(weights, str(path / "model.safetensors"))
    for name in ("config.json", "tokenizer.model", "tokenizer_config.json"):
        shutil.copy(DEMO_DIR / name, path / name)
    return path


@pytest.fixture
def fresh(checkpoint, tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(checkpoint, path)
    return path


def _edit_json(path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hidden_size", "big"),
        ("num_hidden_layers", 2.5),
        ("rms_norm_eps", "tiny"),
        ("max_position_embeddings", [1]),
        ("tie_word_embeddings", "yes"),
        ("head_dim", True),
    ],
)
def test_config_value_of_the_wrong_type_names_the_key(fresh, key, value):
    _edit_json(fresh / "config.json", lambda d: d.update({key: value}))
    with pytest.raises(ValueError) as e:
        Qwen35Config.from_file(fresh)
    text = str(e.value)
    assert str(fresh / "config.json") in text and repr(key) in text and "\n" not in text


def test_config_wrong_type_is_one_cli_line(fresh, capsys):
    _edit_json(fresh / "config.json", lambda d: d.update({"hidden_size": "big"}))
    assert main(["info", "--model", str(fresh), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'hidden_size'" in err and "config.json" in err and len(err.splitlines()) == 1
    assert "Traceback" not in err and "NINFER_TRACEBACK" not in err


def test_tokenizer_config_not_json_names_the_file(fresh):
    (fresh / "tokenizer_config.json").write_text('{"chat_template": "x", ')
    with pytest.raises(ValueError, match="tokenizer_config.json: not valid JSON"):
        Tokenizer.from_dir(fresh)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("added_tokens_decoder", "none"),
        ("eos_token", 7),
        ("chat_template", {"a": 1}),
    ],
)
def test_tokenizer_config_key_of_the_wrong_type_names_it(fresh, capsys, key, value):
    _edit_json(fresh / "tokenizer_config.json", lambda d: d.update({key: value}))
    with pytest.raises(ValueError) as e:
        Tokenizer.from_dir(fresh)
    assert "tokenizer_config.json" in str(e.value) and repr(key) in str(e.value)
    assert main(["info", "--model", str(fresh), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert repr(key) in err and len(err.splitlines()) == 1 and "NINFER_TRACEBACK" not in err


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_weights_with_nan_or_inf_are_refused_with_the_tensor_name(fresh, bad):
    file = fresh / "model.safetensors"
    tensors = load_file(str(file))
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name][3, 5] = bad
    save_file(tensors, str(file))
    with pytest.raises(ValueError, match=f"'{name}'.*NaN or infinite"):
        load_model(fresh, torch.float32, "cpu")


def test_overflow_in_the_load_dtype_is_named(fresh):
    file = fresh / "model.safetensors"
    tensors = load_file(str(file))
    name = "model.norm.weight"
    tensors[name][0] = 1e6  # finite in float32, inf in float16
    save_file(tensors, str(file))
    with pytest.raises(ValueError, match=f"'{name}'.*float16"):
        load_model(fresh, torch.float16, "cpu")
