"""The flag <-> LLM keyword mapping and the small pieces the REPL draws with (no engine)."""

from __future__ import annotations

import inspect

import pytest

from ninfer.cli.chat_view import ReasoningSplitter, stats_table
from ninfer.cli.main import ENGINE_FLAGS, build_parser, engine_kwargs, open_llm
from ninfer.request import Metrics, RequestOutput, Usage

_FLAG_LIST = (
    "--model --device --dtype --kv-dtype --max-concurrency --prefill-chunk --max-model-len "
    "--kv-capacity --host-cache-mib --device-snapshot-slots --cache-taps-per-request "
    "--cache-tap-ladder --cache-tap-min-gap --prefix-cache-file --no-prefix-reuse "
    "--concurrent-prefill --no-compile --no-cuda-graphs --quantization --seed --speculative "
    "--num-speculative-tokens"
)
API_FLAGS = _FLAG_LIST.split()


def test_every_llm_option_is_a_flag_and_every_flag_an_option():
    from ninfer.llm import LLM

    # API.md's flags, plus the coalescing queue timeout (spec §12.2), which API.md leaves open,
    # and the switches of the overlapped decode, of the prefill graphs and the lone prompt's
    # pass size, the vision tower's output cache, the MTP draft's vocabulary and weights and
    # the FP8 decode GEMV's activations (engine details API.md does not name)
    extra = ["--pending-timeout-s", "--no-overlap-decode", "--prefill-graph-tokens",
             "--solo-prefill-chunk", "--encoder-cache-mib", "--draft-vocab",
             "--draft-quantization", "--fp8-decode"]  # fmt: skip
    assert sorted(f for f, _, _ in ENGINE_FLAGS) == sorted([*API_FLAGS, *extra])
    params = set(inspect.signature(LLM.__init__).parameters) - {"self"}
    assert {dest for _, dest, _ in ENGINE_FLAGS} <= params


@pytest.mark.parametrize("command", ["chat", "generate", "bench", "info"])
def test_each_subcommand_takes_the_engine_flags(command):
    extra = ["-i", "a", "-o", "b"] if command == "generate" else []
    argv = [command, *extra, "--max-concurrency", "2", "--no-prefix-reuse", "--kv-capacity",
            "4096", "--no-compile", "--cache-tap-ladder", "512", "--dtype", "float32"]  # fmt: skip
    kwargs = engine_kwargs(build_parser().parse_args(argv))
    assert kwargs == {"max_concurrency": 2, "prefix_reuse": False, "kv_capacity": 4096,
                      "compile": False, "cache_tap_ladder": 512, "dtype": "float32"}  # fmt: skip


def test_speculative_flags_parse_to_their_keywords():
    args = build_parser().parse_args(
        ["chat", "--speculative", "mtp", "--num-speculative-tokens", "2"]
    )
    assert engine_kwargs(args) == {"speculative": "mtp", "num_speculative_tokens": 2}


def test_flags_left_out_are_not_passed():
    assert engine_kwargs(build_parser().parse_args(["info"])) == {}
    args = build_parser().parse_args(["info", "--kv-capacity", "auto", "--concurrent-prefill"])
    assert engine_kwargs(args) == {"kv_capacity": "auto", "concurrent_prefill": True}


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 8])
def test_reasoning_splitter_handles_tags_split_across_deltas(cut):
    text = "plan the answer</think>\n\nThe answer<think>more</think> end"
    split = ReasoningSplitter(thinking=True)
    segments = []
    for i in range(0, len(text), cut):
        segments += split.feed(text[i : i + cut])
    segments += split.flush()
    reasoning = "".join(s for s, r in segments if r)
    answer = "".join(s for s, r in segments if not r)
    assert reasoning == "plan the answermore"
    assert answer == "The answer end"
    assert split.message() == {
        "role": "assistant", "content": "The answer end", "reasoning_content": "plan the answermore"
    }  # fmt: skip


def test_reasoning_splitter_without_thinking_keeps_partial_tag_text():
    split = ReasoningSplitter(thinking=False)
    assert split.feed("a <thi") == [("a ", False)]
    assert split.flush() == [("<thi", False)]
    assert split.message() == {"role": "assistant", "content": "a <thi"}


def test_stats_table_puts_tiers_side_by_side():
    from dataclasses import dataclass

    from rich.console import Console

    @dataclass
    class Stats:
        nodes: int = 5
        nodes_device: int = 4
        nodes_host: int = 1
        hits_device: int = 2
        write_through_bytes: int = 2048

    console = Console(width=100, record=True)
    console.print(stats_table(Stats()))
    text = console.export_text()
    assert "Device" in text and "Host" in text
    row = next(line for line in text.splitlines() if line.strip("│ ").startswith("nodes"))
    assert row.replace("│", " ").split() == ["nodes", "4", "1", "5"]
    assert "2.0 KiB" in text


def test_turn_line_has_the_four_figures():
    from ninfer.cli.chat_view import turn_line

    out = RequestOutput("r", [1], [2, 3], "x", "stop", usage=Usage(120, 2, 64),
                        metrics=Metrics(ttft_s=0.0123, decode_tokens_per_s=45.67))  # fmt: skip
    assert turn_line(out) == (
        "prompt 120 tok · cached 64 · TTFT 12 ms · decode 45.7 tok/s · 2 tok (stop)"
    )


def test_turn_line_shows_the_speculation_when_on():
    from ninfer.cli.chat_view import turn_line
    from ninfer.engine.speculative import SpeculationStats

    out = RequestOutput("r", [1], [2, 3], "x", "stop", usage=Usage(120, 2, 64),
                        metrics=Metrics(ttft_s=0.0123, decode_tokens_per_s=45.67))  # fmt: skip
    stats = SpeculationStats(verify_rows=10, drafted=30, accepted=21, emitted=31)
    assert turn_line(out, speculation=stats) == (
        "prompt 120 tok · cached 64 · TTFT 12 ms · decode 45.7 tok/s · "
        "MTP 3.10 tok/step, 70% accepted · 2 tok (stop)"
    )
    assert turn_line(out, speculation=SpeculationStats()) == turn_line(out)


def test_malformed_kv_capacity_is_a_clear_error(capsys):
    from ninfer.cli.main import main

    assert main(["info", "--kv-capacity", "lots"]) == 2
    assert '--kv-capacity must be "auto" or a number of tokens' in capsys.readouterr().err


def test_the_engine_thread_leaves_sigint_and_sigterm_to_the_main_thread():
    import signal
    import threading

    before = set(threading.enumerate())  # engines of other tests in this process may be alive
    llm = open_llm(build_parser().parse_args(["info", "--device", "cpu"]))
    try:
        new = set(threading.enumerate()) - before
        (engine,) = [t for t in new if t.name == "ninfer-engine"]
        with open(f"/proc/self/task/{engine.native_id}/status") as f:
            blocked = int(next(x for x in f if x.startswith("SigBlk")).split()[1], 16)
        for sig in (signal.SIGINT, signal.SIGTERM):
            assert blocked & (1 << (sig - 1)), sig
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        llm.close()


def _out(prompt: list[int], cached: int) -> RequestOutput:
    return RequestOutput("r", prompt, [9], "x", "stop", usage=Usage(len(prompt), 1, cached))


def test_reuse_note_says_what_was_reused_or_why_nothing():
    from ninfer.cli.chat_view import reuse_note

    history = list(range(200))
    assert reuse_note(_out(history, 0), None) == "new conversation"
    assert reuse_note(_out(history, 128), None) == "from an earlier conversation"
    assert reuse_note(_out(history, 0), None, cache_on=False) == "prefix cache off"
    previous = [*history[:150], 7, 7, 7]  # prompt, then the reply as generated
    follow = [*history[:150], 5, 5, 5, 5]  # the reply re-rendered differently
    assert reuse_note(_out(follow, 128), previous) == (
        "earlier turns; the last reply re-rendered by the template"
    )
    assert reuse_note(_out([*previous, 5], 128), previous) == "earlier turns"
    short = [*history[:21], 5, 5]
    assert reuse_note(_out(short, 0), [*history[:21], 7]) == (
        "history re-rendered: 21 tok shared, under one 64-token block"
    )
    assert reuse_note(_out(short, 0), []) == "nothing reusable"  # the last reply was stopped


def test_stats_summary_line():
    from types import SimpleNamespace

    from ninfer.cache.stats import CacheStats
    from ninfer.cli.chat_view import stats_summary

    stats = CacheStats(lookups=4, hits_device=2, hits_host=1, reuse_tokens=640,
                       prefill_tokens=300, device_block_bytes=3 << 20,
                       device_snapshot_bytes=1 << 20, host_block_bytes=2 << 20, restores=1,
                       restored_host_bytes=1 << 20)  # fmt: skip
    config = SimpleNamespace(kv_pages=64, kv_page_bytes=1 << 20, device_snapshot_slots=0,
                             state_image_bytes=0, host_cache_bytes=64 << 20,
                             host_tier=True)  # fmt: skip
    assert stats_summary(stats, config) == (
        "hit rate 75% (3 of 4 requests) · reused 640 tok, prefilled 300 tok · "
        "Device 4.0 MiB of 64.0 MiB · Host 2.0 MiB of 64.0 MiB · 1 restores (1.0 MiB)"
    )
    config.host_tier = False
    assert "Host off" in stats_summary(stats, config)
