"""`python -m ninfer chat` on a pseudo-terminal, driven like a person at the keyboard."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time

import pytest

from tests.cli.cli_util import ENGINE_FLAGS, Screen

SYSTEM = "You are a terse assistant. " * 20  # > 2 blocks of 64 tokens: turn 2 reuses them
STATS = (
    r"prompt (?P<prompt>\d+) tok · cached (?P<cached>\d+)(?: \((?P<why>[^)]*)\))? · "
    r"TTFT \d+ ms · decode [\d.]+ tok/s · (?P<tok>\d+) tok"
)
PROMPT = r">>> "
HELP = r"(?s)/system TEXT.*?Multi-line input"


def test_chat_turns_stats_reset_and_ctrl_d(terminal):
    term = terminal("chat", "--max-tokens", "12", "--system", SYSTEM, *ENGINE_FLAGS)
    term.expect("Demo model: random weights, so its text is noise")
    term.expect(PROMPT)
    term.line("hello, what is a prefix cache?")
    first = term.expect(STATS)
    assert int(first["tok"]) == 12 and int(first["cached"]) == 0
    assert first["why"] == "new conversation"
    term.expect(PROMPT)
    term.line("and a second turn \\")  # a trailing backslash continues the message
    term.expect(r"\.\.\.")
    term.line("on two lines")
    second = term.expect(STATS)
    assert int(second["prompt"]) > int(first["prompt"])
    assert int(second["cached"]) >= 128  # the history is cached
    assert second["why"].startswith("earlier turns")
    term.expect(PROMPT)
    term.line("/stats")
    summary = term.expect(r"prefix cache: hit rate (\d+)% \(1 of 2 requests\) · reused (\d+) tok")
    assert summary[1] == "50" and int(summary[2]) == int(second["cached"])
    table = term.expect(r"(?s)by tier.*?Device.*?Host.*?nodes[ │]+(\d+)[ │]+(\d+)")
    assert int(table[1]) > 0
    term.expect("counters")
    term.line("/help")
    term.expect(HELP)
    term.line("/reset")
    term.expect("conversation reset")
    term.line('"""')
    term.line("a block")
    term.line("of text")
    term.line('"""')
    after_reset = term.expect(STATS)
    # the history is gone, the system prompt stays (and is served from the cache)
    assert int(after_reset["prompt"]) < int(second["prompt"])
    assert after_reset["why"] == "from an earlier conversation"
    term.expect(PROMPT)
    term.key_at_prompt("\x04")  # Ctrl+D at the prompt leaves
    term.expect("bye")
    assert term.wait() == 0


def test_the_quick_start_shows_the_cache_on_the_second_turn(terminal):
    """`ninfer chat` as the README's quick start runs it: the demo model with its defaults."""
    term = terminal("chat", *ENGINE_FLAGS)
    term.expect("Demo model: random weights")
    term.expect("thinking off, replies up to 128 tokens, system prompt set")
    term.expect(PROMPT)
    term.line("Hello, who are you?")
    first = term.expect(STATS)
    assert int(first["cached"]) == 0 and first["why"] == "new conversation"
    term.expect(PROMPT)
    term.line("Tell me more.")
    second = term.expect(STATS)
    assert int(second["cached"]) >= 128, second[0]  # the system prompt and the first message
    assert second["why"].startswith("earlier turns")
    term.expect(PROMPT)
    term.line("/exit")
    term.expect("bye")
    assert term.wait() == 0


def test_line_editing_and_history_across_runs(terminal, tmp_path):
    term = terminal("chat", "--max-tokens", "4", *ENGINE_FLAGS)
    term.expect(PROMPT)
    term.key_at_prompt("some words to throw away")
    term.send("\x15")  # Ctrl+U: the line goes, the prompt stays
    term.line("/help")  # the editor took it as typed after Ctrl+U: no "unknown command"
    term.expect(HELP)
    term.key_at_prompt("\x1b[A")  # Up: the previous message comes back
    term.send("\r")
    term.expect(HELP)
    for line in ('"""', "first line", "", "third line", '"""'):  # a blank line inside a block
        term.key_at_prompt(line + "\r")
    block = term.expect(STATS)
    term.key_at_prompt("/exit\r")
    term.expect("bye")
    assert term.wait() == 0
    history = (tmp_path / "data" / "ninfer" / "chat_history").read_text()
    assert '"""\nfirst line\n\nthird line\n"""' in history.replace("+", "")

    again = terminal("chat", "--max-tokens", "4", *ENGINE_FLAGS)  # a new run, the same history
    again.expect(PROMPT)
    again.key_at_prompt("\x1b[A")  # /exit
    again.send("\x1b[A")  # the block, recalled whole
    again.send("\r")
    recalled = again.expect(STATS)
    assert recalled["prompt"] == block["prompt"]  # the very same message, blank line included
    again.key_at_prompt("\x04")
    assert again.wait() == 0


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux as the terminal emulator")
def test_the_screen_keeps_the_prompt_through_ctrl_u_and_up(tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "TERM": "xterm-256color"}
    screen = Screen([sys.executable, "-m", "ninfer", "chat", "--max-tokens", "4", *ENGINE_FLAGS],
                    env)  # fmt: skip
    try:

        def last_line() -> str:
            return screen.screen().rstrip("\n").splitlines()[-1]

        screen.wait_for(r"(?m)^>>> $")
        # the engine's log line printed while the spinner ran sits on a line of its own
        screen.wait_for(r"(?m)^ninfer: engine ready in [\d.]+ s *$", timeout=1)
        screen.keys("throw this away")
        screen.wait_for(r">>> throw this away")
        screen.keys("C-u")
        time.sleep(0.5)
        assert last_line().rstrip() == ">>>"
        screen.keys("/help", "Enter")
        screen.wait_for(HELP)
        screen.wait_for(r"(?m)^>>> $")
        screen.keys("Up")
        time.sleep(0.5)
        assert last_line() == ">>> /help"
        screen.keys("C-u", '"""', "Enter", "one", "Enter", "Enter", "three", "Enter", '"""')
        time.sleep(0.5)
        lines = screen.screen().rstrip("\n").splitlines()[-5:]
        assert [x.rstrip() for x in lines] == ['>>> """', "... one", "...", "... three",
                                               '... """']  # fmt: skip
        screen.keys("Enter")
        screen.wait_for(STATS)
        screen.keys("C-d")
        screen.wait_for("EXIT=0")
    finally:
        screen.close()


STOPPED = (
    r"stopped after (\d+) tok · prompt (\d+) tok · cached (\d+) · TTFT \d+ ms · "
    r"partial reply kept"
)


def test_ctrl_c_stops_the_reply_and_keeps_it_in_the_history(terminal):
    term = terminal("chat", "--max-tokens", "20000", "--temperature", "0", *ENGINE_FLAGS)
    term.expect(PROMPT)

    def stopped_turn(message: str) -> tuple[int, int]:
        term.line(message)
        time.sleep(4)  # let the reply stream for a while
        term.send("\x03")
        stopped = term.expect(STOPPED)
        term.expect(PROMPT)
        return int(stopped[1]), int(stopped[2])  # tokens seen, prompt tokens

    n, first = stopped_turn("tell me a very long story")
    assert 30 <= n < 20000
    # The follow-up only has to show its prompt: its greedy reply may end on its own (EOS)
    # before the Ctrl+C, which then lands at the prompt; either way the turn's line names the
    # prompt's tokens ("stopped after ... · prompt N tok · cached" or "prompt N tok · cached").
    term.line("go on")
    time.sleep(4)
    term.send("\x03")
    follow = int(term.expect(r"prompt (\d+) tok · cached")[1])
    term.expect(PROMPT)
    # The follow-up's prompt holds the first message and the partial reply (re-tokenized from
    # its text: about n tokens, not exactly), then "go on" (a turn of a few tokens): without the
    # partial reply it would be the first prompt and those few tokens.
    assert follow >= first + n // 2 + 3, (n, first, follow)
    term.line("/system be brief")  # the chat still works after the interruptions
    term.expect("system prompt set; new conversation")
    term.line("/exit")
    term.expect("bye")
    assert term.wait() == 0


def test_ctrl_c_twice_at_the_prompt_leaves(terminal):
    term = terminal("chat", *ENGINE_FLAGS)
    term.expect(PROMPT)
    term.key_at_prompt("\x03")
    term.expect(r"Ctrl\+C again or Ctrl\+D to leave")
    term.expect(PROMPT)
    term.key_at_prompt("\x03")
    term.expect("bye")
    assert term.wait() == 0


def test_sigterm_saves_the_prefix_cache_and_the_next_chat_loads_it(terminal, tmp_path):
    path = tmp_path / "prefix.cache"
    flags = ("chat", "--max-tokens", "8", "--system", SYSTEM, "--prefix-cache-file", str(path))
    term = terminal(*flags, *ENGINE_FLAGS)
    term.expect(PROMPT)
    term.line("hello, what is a prefix cache?")
    term.expect(STATS)
    term.expect(PROMPT)
    os.kill(term.pid, signal.SIGTERM)  # an orderly stop: the Host tier is saved
    term.expect(r"prefix cache saved \| ")
    assert term.wait() != 0 and path.stat().st_size > 0
    term = terminal(*flags, *ENGINE_FLAGS)
    term.expect(r"prefix cache read \| ")
    term.expect(PROMPT)
    term.line("hello, what is a prefix cache?")
    again = term.expect(STATS)
    assert int(again["cached"]) > 0  # the same conversation resumes from the restored tier
    term.line("/exit")
    term.expect("bye")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux as the terminal emulator")
def test_generate_progress_bar_and_log_lines_do_not_collide(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"prompt": "hi", "max_tokens": 3}\n{"prompt": "yo", "max_tokens": 3}\n')
    argv = [sys.executable, "-m", "ninfer", "generate", "-i", str(src), "-o", str(dst)]
    screen = Screen([*argv, *ENGINE_FLAGS], {"TERM": "xterm-256color"})
    try:
        screen.wait_for("EXIT=0")
        text = screen.screen()
        assert re.search(r"(?m)^ninfer: engine ready in [\d.]+ s *$", text), text
        assert re.search(r"(?m)^generate .* 2/2 ", text), text
        assert "2 lines written to" in text
    finally:
        screen.close()


def test_chat_reads_a_pipe_with_the_same_multi_line_rules():
    from tests.cli.cli_util import ninfer

    script = 'hello\n"""\nfirst\n\nthird\n"""\nsecond \\\nline\n/exit\n'
    run = ninfer("chat", "--max-tokens", "3", *ENGINE_FLAGS, input=script)
    assert run.returncode == 0, run.stderr
    turns = [m.groupdict() for m in re.finditer(STATS, run.stdout)]
    assert len(turns) == 3  # the block and the continued line are one message each
    assert ">>>" not in run.stdout and "..." not in run.stdout  # no prompts for a pipe
    assert run.stdout.rstrip().endswith("bye")


@pytest.mark.parametrize(
    ("typed", "more", "message"),
    [
        ("hello", False, "hello"),
        ("a \\", True, "a "),
        ("a \\\nb", False, "a \nb"),
        ('"""', True, ""),
        ('"""\nx\n\ny', True, "x\n\ny"),
        ('"""\nx\n\ny\n"""', False, "x\n\ny"),
    ],
)
def test_when_a_typed_message_is_finished(typed, more, message):
    from ninfer.cli.terminal import message_text, needs_more

    assert needs_more(typed) is more
    assert message_text(typed) == message
