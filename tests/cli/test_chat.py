"""`python -m ninfer chat` on a pseudo-terminal, driven like a person at the keyboard."""

from __future__ import annotations

import os
import signal
import time

from tests.cli.cli_util import ENGINE_FLAGS

SYSTEM = "You are a terse assistant. " * 20  # > 2 blocks of 64 tokens: turn 2 reuses them
STATS = r"prompt (\d+) tok · cached (\d+) · TTFT \d+ ms · decode [\d.]+ tok/s · (\d+) tok"
PROMPT = r">>> "


def test_chat_turns_stats_reset_and_ctrl_d(terminal):
    term = terminal("chat", "--max-tokens", "12", "--system", SYSTEM, *ENGINE_FLAGS)
    term.expect("Demo model: random weights, so its text is noise")
    term.expect(PROMPT)
    term.line("hello, what is a prefix cache?")
    first = term.expect(STATS)
    assert int(first[3]) == 12 and int(first[2]) == 0
    term.expect(PROMPT)
    term.line("and a second turn \\")  # a trailing backslash continues the message
    term.expect(r"\.\.\. ")
    term.line("on two lines")
    second = term.expect(STATS)
    assert int(second[1]) > int(first[1]) and int(second[2]) >= 128  # the history is cached
    term.expect(PROMPT)
    term.line("/stats")
    table = term.expect(r"(?s)prefix cache.*?Device.*?Host.*?nodes[ │]+(\d+)[ │]+(\d+)")
    assert int(table[1]) > 0
    term.expect("counters")
    term.line("/help")
    term.expect(r"(?s)/system TEXT.*?Multi-line input")
    term.line("/reset")
    term.expect("conversation reset")
    term.line('"""')
    term.line("a block")
    term.line("of text")
    term.line('"""')
    after_reset = term.expect(STATS)
    assert int(after_reset[1]) < int(second[1])  # the history is gone, the system prompt stays
    term.expect(PROMPT)
    term.key_at_prompt("\x04")  # Ctrl+D at the prompt leaves
    term.expect("bye")
    assert term.wait() == 0


def test_ctrl_c_stops_the_reply_and_the_chat_goes_on(terminal):
    term = terminal("chat", "--max-tokens", "20000", *ENGINE_FLAGS)
    term.expect(PROMPT)
    term.line("tell me a very long story")
    time.sleep(1.5)  # let the reply stream for a while
    term.send("\x03")
    stopped = term.expect(r"stopped after (\d+) tok · TTFT \d+ ms · partial reply kept")
    assert 0 < int(stopped[1]) < 20000
    term.expect(PROMPT)
    term.line("/system be brief")  # the chat still works after the interruption
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
    assert int(again[2]) > 0  # the same conversation resumes from the restored tier
    term.line("/exit")
    term.expect("bye")
