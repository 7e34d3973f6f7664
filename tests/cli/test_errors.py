"""What a user sees when something is wrong: one line naming the file or the flag, no traceback,
a non-zero exit; and the help a new user reads (every flag explained, `--version`)."""

from __future__ import annotations

import re
import shutil

import pytest

from ninfer.cli.main import ENGINE_FLAGS, build_parser, main
from tests.cli.cli_util import ENGINE_FLAGS as SMALL


@pytest.fixture
def broken_copy(demo_checkpoint, tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(demo_checkpoint, path)
    return path


def one_error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("ninfer ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
         "not a valid safetensors file (Error while deserializing header"),
        (lambda p: p.write_bytes(b"garbage" * 10), "not a valid safetensors file"),
    ],
)  # fmt: skip
def test_a_corrupt_safetensors_file_is_one_line_naming_it(capsys, broken_copy, damage, words):
    weights = broken_copy / "model.safetensors"
    damage(weights)
    line = one_error_line(capsys, ["info", "--model", str(broken_copy), *SMALL])
    assert line.startswith(f"ninfer info: error: {weights}: ") and words in line


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{\n"model_type": \n', "config.json: not valid JSON (Expecting value: line 3 column 1"),
        ("[1, 2]", "config.json: expected a JSON object, got list"),
        ('{"model_type": "llama"}', "config.json: "),
    ],
)
def test_a_broken_config_json_is_one_line_naming_it(capsys, broken_copy, text, words):
    (broken_copy / "config.json").write_text(text)
    line = one_error_line(capsys, ["info", "--model", str(broken_copy), *SMALL])
    assert line.startswith(f"ninfer info: error: {broken_copy / 'config.json'}: ")
    assert words in line


def test_version(capsys):
    from ninfer import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"ninfer {__version__}"


def test_every_flag_has_help_and_no_help_cites_a_document(capsys):
    parser = build_parser()
    for flag, _, opts in ENGINE_FLAGS:
        assert opts.get("help"), f"{flag} has no help text"
    subparsers = parser._subparsers._group_actions[0].choices
    for command in ("chat", "generate", "bench", "info"):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        text = capsys.readouterr().out
        for cited in (r"\bspec\b", r"API\.md", "§"):  # (not --speculative, a flag's name)
            assert not re.search(cited, text), (command, cited)
        for action in subparsers[command]._actions:
            assert action.help, f"ninfer {command} {action.option_strings} has no help text"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["chat", "--max-tokens", "0"], "argument --max-tokens: must be an integer >= 1, got 0"),
        (["chat", "--temperature", "-1"], "argument --temperature: must be >= 0 (0 is greedy)"),
        (["chat", "--top-p", "1.5"], "argument --top-p: must be in (0, 1], got 1.5"),
        (["generate", "-i", "a", "-o", "b", "--temperature", "nan"], "must be a finite number"),
    ],
)
def test_sampling_flags_are_checked_before_the_model_loads(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and words in capsys.readouterr().err


def test_bench_plot_without_matplotlib_fails_at_once(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    no_plot = lambda name, *a: None if name == "matplotlib" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", no_plot)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "ttft", "--plot", "x.png"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "argument --plot: needs matplotlib, which is not installed" in err
    assert "pip install 'ninfer[plot]'" in err


def test_any_other_failure_is_one_line_too(capsys, broken_copy, monkeypatch):
    (broken_copy / "tokenizer.json").write_text("{}")  # preferred over tokenizer.model
    monkeypatch.delenv("NINFER_TRACEBACK", raising=False)
    line = one_error_line(capsys, ["info", "--model", str(broken_copy), *SMALL])
    assert line.startswith("ninfer info: error: ") and "NINFER_TRACEBACK=1 shows where" in line
    monkeypatch.setenv("NINFER_TRACEBACK", "1")
    with pytest.raises(Exception, match="Model missing"):
        main(["info", "--model", str(broken_copy), *SMALL])
