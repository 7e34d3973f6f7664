"""Small things users hit (issue 39, item 3, and `ninfer serve`'s busy port): each fails with
one line naming what is wrong, before anything is built."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

import ninfer
from ninfer.cli import generate, serve
from ninfer.cli import main as cli_main
from ninfer.cli.main import build_parser, main
from tests.cli.cli_util import ninfer as run_ninfer


def _no_engine(*_a, **_k):
    raise AssertionError("the engine was built")


@pytest.fixture(autouse=True)
def _commands_imported():
    """Every command module imported before a test patches `open_llm` (a module that binds it
    at import would keep the patch)."""
    build_parser()


def test_generate_refuses_a_missing_output_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli_main, "open_llm", _no_engine)
    monkeypatch.setattr(generate, "open_llm", _no_engine)
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "hi"}\n')
    out = tmp_path / "missing" / "x.jsonl"
    assert main(["generate", "-i", str(src), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and str(out.parent) in err and len(err.splitlines()) == 1
    assert not out.parent.exists()


def test_generate_ctrl_c_says_how_many_lines_were_written(tmp_path, monkeypatch, capsys):
    from contextlib import nullcontext

    def two_then_interrupt(llm, jobs, writer, max_in_flight):
        for job in jobs[:2]:
            writer.write({"id": job.id, "text": "x", "finish_reason": "stop"})
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "open_llm", lambda args: object())
    monkeypatch.setattr(generate, "serving", nullcontext)
    monkeypatch.setattr(generate, "_run_streams", two_then_interrupt)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(f'{{"id": {i}, "prompt": "hi {i}"}}\n' for i in range(5)))
    out = tmp_path / "out.jsonl"
    assert main(["generate", "-i", str(src), "-o", str(out), "--quiet"]) == 130
    # the message as one line: the console wraps it at its width, inside a long path too
    err = capsys.readouterr().err.replace("\n", "")
    assert "interrupted" in err and "2 lines written" in err and str(out) in err
    assert len(out.read_text().splitlines()) == 2


def test_python_m_ninfer_without_arguments_lists_the_commands():
    r = run_ninfer(timeout=60)
    assert r.returncode == 2
    for command in ("chat", "generate", "bench", "info", "serve"):
        assert command in r.stdout
    assert "required" not in r.stderr


def test_dir_lists_the_public_names():
    names = dir(ninfer)
    assert "LLM" in names and "SamplingParams" in names and "RequestOutput" in names


def test_serve_on_a_busy_port_fails_before_the_model_loads(monkeypatch, capsys):
    monkeypatch.setattr(cli_main, "open_llm", _no_engine)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"port {port}" in err and "in use" in err and len(err.splitlines()) == 1


def test_served_model_name_takes_several():
    args = build_parser().parse_args(["serve", "--served-model-name", "demo", "gpt-4o-mini"])
    assert serve.model_names(args) == ["demo", "gpt-4o-mini"]
    args = build_parser().parse_args(["serve"])
    assert serve.model_names(args) == ["demo"]


def test_serve_on_a_busy_port_fails_before_importing_the_server():
    """The port is checked first: the process fails without importing torch or the server
    (seconds on a loaded machine), so the one line comes at once."""
    script = (
        "import sys; from ninfer.cli.main import main; code = main(sys.argv[1:]); "
        "print(code, 'torch' in sys.modules, 'ninfer.server.app' in sys.modules)"
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-c", script, "serve", "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert r.stdout.split() == ["2", "False", "False"], (r.stdout, r.stderr)
    assert f"port {port}" in r.stderr and len(r.stderr.splitlines()) == 1


@pytest.mark.parametrize("port", ["-1", "70000"])
def test_serve_refuses_a_port_out_of_range(monkeypatch, capsys, port):
    monkeypatch.setattr(cli_main, "open_llm", _no_engine)
    assert main(["serve", "--port", port]) == 2
    assert "--port" in capsys.readouterr().err


def test_generate_on_the_demo_answers_without_thinking(tmp_path, monkeypatch):
    """As `ninfer chat` and the server: a "messages" line on the demo model has thinking off
    unless the line turns it on."""
    from contextlib import nullcontext

    seen = {}

    def capture(llm, jobs, writer, max_in_flight):
        seen.update({job.id: job.chat_kwargs for job in jobs})

    monkeypatch.setattr(generate, "open_llm", lambda args: object())
    monkeypatch.setattr(generate, "serving", nullcontext)
    monkeypatch.setattr(generate, "_run_streams", capture)
    src = tmp_path / "in.jsonl"
    hi = '[{"role": "user", "content": "hi"}]'
    src.write_text(
        f'{{"id": "a", "messages": {hi}}}\n'
        f'{{"id": "b", "messages": {hi}, "enable_thinking": true}}\n'
        '{"id": "c", "prompt": "hi"}\n'
    )
    main(["generate", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), "--quiet"])
    assert seen == {"a": {"enable_thinking": False}, "b": {"enable_thinking": True}, "c": {}}
