"""`ninfer info` and `ninfer bench` on the demo model (tiny sizes), run in this process
(`ninfer.cli.main.main`, the console script's function) to spare interpreter start-ups."""

from __future__ import annotations

import json

import pytest

from ninfer.cli.main import main
from tests.cli.cli_util import ENGINE_FLAGS


class Run:
    def __init__(self, rc: int, captured) -> None:
        self.returncode, self.stdout, self.stderr = rc, captured.out, captured.err


@pytest.fixture
def ninfer(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")

    def run(*args: str, **_) -> Run:
        rc = main(list(args))
        return Run(rc, capsys.readouterr())

    return run


SPEC_14_2 = {  # describe() keys carrying the derived values of spec §14.2
    "host_cache_bytes", "device_snapshot_slots", "cache_taps_per_request", "cache_tap_ladder",
    "cache_tap_min_gap", "kv_pages", "kv_capacity_tokens", "prefill_chunk", "max_model_len",
    "dtype", "kv_dtype", "max_concurrency",
}  # fmt: skip


def test_info_json_has_every_derived_value_and_the_ledger(ninfer):
    run = ninfer("info", "--json", "--prefill-chunk", "64", "--cache-tap-min-gap", "128",
                 *ENGINE_FLAGS)  # fmt: skip
    assert run.returncode == 0, run.stderr
    info = json.loads(run.stdout)
    config, ledger = info["config"], info["memory_ledger"]
    assert set(config) >= SPEC_14_2
    assert config["prefill_chunk"] == 64 and config["cache_tap_min_gap"] == 128
    assert config["max_concurrency"] == 4 and config["host_cache_bytes"] == 64 << 20
    assert config["cache_tap_ladder"] == 4096  # max(4096, 2 * chunk)
    assert {"kv_pages", "kv_bytes", "state_slots_active", "host_bytes"} <= set(ledger)


def test_info_tables(ninfer):
    run = ninfer("info", *ENGINE_FLAGS)
    assert run.returncode == 0, run.stderr
    for words in ("engine configuration", "memory ledger", "tap_ladder_tokens", "max_new_taps",
                  "host_cache_budget_bytes", "64.0 MiB", "flag"):  # fmt: skip
        assert words in run.stdout
    assert "…" not in run.stdout  # captured (not a terminal): full width, nothing cut


def test_bad_configuration_is_one_clear_line(ninfer):
    run = ninfer("info", "--max-concurrency", "99")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith("ninfer info: error: max_concurrency")


def test_bench_all_on_the_demo_model(ninfer, tmp_path, monkeypatch):
    import functools

    from ninfer.bench import reuse, suite

    # The reuse part replays one of its traces here (the cheapest): that `all` runs it and
    # prints its table is the point; every trace's figures are tests/bench/test_reuse_bench.py's
    # (the six traces took about 50 s of this test's 75 s).
    monkeypatch.setattr(
        suite, "bench_reuse", functools.partial(reuse.bench_reuse, traces=("chat",))
    )
    out, png, prof = tmp_path / "b.json", tmp_path / "ttft.png", tmp_path / "prof"
    run = ninfer(
        "bench", "all", "--prompt-tokens", "16,160", "--decode-tokens", "8", "--batch-sizes",
        "1,2", "--turns", "2", "--json", str(out), "--plot", str(png), "--profile", str(prof),
        "--compare-hf", "--cache-prompt-tokens", "4096", "--cache-tree-blocks", "2000",
        *ENGINE_FLAGS,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr + run.stdout
    r = json.loads(out.read_text())
    assert set(r) >= {"meta", "bounds", "prefill", "decode", "ttft", "restore", "cache", "hf"}
    assert [row["trace"] for row in r["reuse"]["rows"]] == ["chat"]
    assert r["reuse"]["rows"][0]["theoretical"] > 0
    assert r["bounds"]["copy_bytes_per_s"] > 0 and r["bounds"]["matmul_flops_per_s"] > 0
    assert [row["prompt_tokens"] for row in r["prefill"]["rows"]] == [16, 160]
    for row in r["prefill"]["rows"]:
        assert row["tokens_per_s"] > 0 and row["bound_seconds"] > 0
    assert [row["batch"] for row in r["decode"]["rows"]] == [1, 2]
    for row in r["decode"]["rows"]:
        assert row["bound_tokens_per_s"] > 0 and not row["errors"] and not row["steady_note"]
        assert row["steady_tokens_per_s"] > 0 and row["steady_window_steps"] >= 8
        assert row["e2e_tokens_per_s"] > 0
    turns = r["ttft"]["turns"]
    assert len(turns) == 4  # 2 sessions x 2 turns
    assert all(t["ttft_cold_s"] > 0 and t["ttft_cached_s"] > 0 for t in turns)
    assert any(t["cached_tokens"] > 0 for t in turns)  # the shared system prompt is reused
    assert {"tap", "resume", "kv_offload", "kv_restore"} <= set(r["restore"])
    resumed = r["resume"]["rows"]
    assert [x["history_tokens"] for x in resumed] == [16, 16, 160, 160]
    assert all(x["ttft_cold_s"] > 0 and x["ttft_cached_s"] > 0 for x in resumed)
    for x in resumed[2:]:  # turn 1 was pushed off the Device: its blocks come back from the Host
        assert x["cached_tokens"] > 0 and x["restored_host_bytes"] > 0, x
    assert resumed[-1]["cache"]["hits_host"] == 2 and resumed[-1]["overlap"] == {}  # CPU trace
    assert (prof / "resume_160.json").stat().st_size > 0
    assert r["hf"]["greedy"]["agreeing_prefix"] == r["hf"]["greedy"]["tokens"]
    assert r["cache"]["tree_blocks"] == 2000
    assert png.stat().st_size > 0
    assert (prof / "decode.json").stat().st_size > 0 and r["decode"]["profile"]["top"]
    titles = ("of bound", "TTFT per turn", "resume from the Host tier",
              "transformers, same weights", "top kernels",
              "prefix reuse on seeded traces")  # fmt: skip
    for words in titles:
        assert words in run.stdout
    # To a pipe or a file the tables keep their full width: no cell is cut short.
    assert "…" not in run.stdout
    # The TTFT table shows every turn, as the plot does (a turn with nothing cached too: what
    # the cached run's snapshots cost it), under headings that say which figure each column is.
    block = run.stdout[run.stdout.index("TTFT per turn") :].split("\n\n")[0]
    head = next(line for line in block.splitlines() if "turn" in line and "┃" in line)
    assert [c.strip() for c in head.split("┃")[1:-1]] == [
        "turn", "prompt", "cached tokens", "TTFT cold", "TTFT cached", "speedup"
    ]  # fmt: skip
    rows = [line.split("│") for line in block.splitlines() if "#" in line and "│" in line]
    assert [int(cells[3]) for cells in rows] == [t["cached_tokens"] for t in turns]
    assert "not shown" not in block


def test_bench_decode_with_speculation(ninfer, tmp_path):
    """`bench decode --speculative mtp --draft-acceptance A` prints, per batch size, the tokens
    per verify step and the acceptance of a controlled draft; without A, the head's own."""
    out = tmp_path / "d.json"
    common = ("bench", "decode", "--prompt-tokens", "16", "--decode-tokens", "12",
              "--batch-sizes", "1,2", "--speculative", "mtp", "--num-speculative-tokens", "2",
              *ENGINE_FLAGS)  # fmt: skip
    run = ninfer(*common, "--draft-acceptance", "1", "--json", str(out))
    assert run.returncode == 0, run.stderr + run.stdout
    rows = json.loads(out.read_text())["decode"]["rows"]
    for row in rows:
        assert not row["errors"] and row["spec_draft_acceptance"] == 1.0
        assert row["spec_acceptance"] > 0.5 and 1.5 < row["spec_tokens_per_step"] <= 3
    assert "controlled draft a=1" in run.stdout and "tok/step" in run.stdout
    assert "ms/tok" in run.stdout and " tokens " in run.stdout  # steady: per token
    run = ninfer(*common, "--json", str(out))
    assert run.returncode == 0, run.stderr + run.stdout
    row = json.loads(out.read_text())["decode"]["rows"][0]
    assert row["spec_draft_acceptance"] is None and 1 <= row["spec_tokens_per_step"] <= 3
    assert "MTP head" in run.stdout


def test_no_bench_table_has_two_columns_with_one_heading():
    from ninfer.cli import bench_view

    with pytest.raises(AssertionError, match="two columns with one heading"):
        bench_view.table("t", ["a", "cached", "cached"], [])
    turns = [{"session": "s", "turn": t, "prompt_tokens": 200, "cached_tokens": c,
              "ttft_cold_s": 0.01, "ttft_cached_s": 0.02 if c == 0 else 0.005,
              "speedup": 0.5 if c == 0 else 2.0} for t, c in enumerate([0, 128, 192])]  # fmt: skip
    t = bench_view.ttft({"turns": turns, "summary": {"cache_hit_rate": 0.5}})
    assert [c.header for c in t.columns] == [
        "turn", "prompt", "cached tokens", "TTFT cold", "TTFT cached", "speedup"
    ]  # fmt: skip
    assert t.row_count == 3 and "not shown" not in t.title  # every turn, as the plot
    row = {
        "history_tokens": 16,
        "round": 1,
        "cached_tokens": 0,
        "ttft_cold_s": 1.0,
        "ttft_cached_s": 0.5,
        "speedup": 2.0,
        "restored_host_bytes": 0,
        "restore_s": 0,
    }
    row |= {"restore_bytes_per_s": 0, "link_bytes_per_s": 1e9, "restore_of_link": None}
    rows = [row]  # fmt: skip
    headings = [c.header for c in bench_view.resume({"rows": rows}).columns]
    assert len(set(headings)) == len(headings)


def test_info_over_a_checkpoint_folder(ninfer, demo_checkpoint):
    run = ninfer("info", "--json", "--model", str(demo_checkpoint), *ENGINE_FLAGS)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["config"]["model"] == str(demo_checkpoint)
    missing = ninfer("info", "--model", str(demo_checkpoint / "nowhere"))
    assert missing.returncode == 2 and "not a checkpoint folder" in missing.stderr


def test_info_shows_the_weights_quantised_at_load(ninfer):
    plain = json.loads(ninfer("info", "--json", *ENGINE_FLAGS).stdout)
    assert plain["weights"]["quantization"] == "none"
    assert plain["weights"]["dense_modules"] == []
    assert plain["config"]["quantization"] is None
    run = ninfer("info", "--json", "--quantization", "fp8", *ENGINE_FLAGS)
    assert run.returncode == 0, run.stderr
    info = json.loads(run.stdout)
    weights, dense = info["weights"], plain["weights"]
    assert info["config"]["quantization"] == "fp8"
    assert weights["quantization"].startswith("fp8 e4m3, 128x128 blocks")
    assert "layers.*.linear_attn.in_proj_a" in weights["dense_modules"]
    # the demo runs in fp32 on the CPU: FP8 reads about a quarter of its weight bytes
    per_token = "decode_weight_bytes_per_token"
    assert weights[per_token] < dense[per_token] / 2
    assert weights[per_token + "_bf16"] == dense[per_token] // 2
    table = ninfer("info", "--quantization", "fp8", *ENGINE_FLAGS).stdout
    for words in ("weights", "kept dense", "read per decode token in bf16"):
        assert words in table


def test_bad_quantization_is_one_clear_line(ninfer):
    run = ninfer("info", "--quantization", "int8")
    assert run.returncode == 2
    assert "quantization" in run.stderr.strip().splitlines()[-1]


def test_bench_fp8_at_load_bounds_the_fp8_bytes(ninfer, tmp_path):
    """`--quantization fp8` on the demo model: the decode bound counts the FP8 weight bytes
    (about a quarter of the fp32 ones here), and transformers runs the dequantised weights."""
    rows = {}
    for quant in ((), ("--quantization", "fp8")):
        out = tmp_path / f"b{len(quant)}.json"
        run = ninfer("bench", "decode", "--prompt-tokens", "16", "--decode-tokens", "8",
                     "--batch-sizes", "1", "--compare-hf", "--hf-max-prompt", "16",
                     "--no-baseline", "--json", str(out), *quant, *ENGINE_FLAGS)  # fmt: skip
        assert run.returncode == 0, run.stderr + run.stdout
        rows[bool(quant)] = json.loads(out.read_text())
    fp8, dense = rows[True], rows[False]
    assert fp8["meta"]["model"].endswith("fp8 at load")
    step = [r["decode"]["rows"][0]["step_bytes"] for r in (fp8, dense)]
    assert step[0] < step[1] / 2
    greedy = fp8["hf"]["greedy"]
    assert greedy["tokens"] > 0 and greedy["agreeing_prefix"] == greedy["tokens"]


def test_bench_prints_the_unquantized_baseline_beside(ninfer, tmp_path):
    """`--quantization fp8`: prefill and decode run again on the same shape unquantized, and
    the JSON holds both with the ratios, the table shows them side by side, each beside its
    own bound; `--no-baseline` skips it."""
    out = tmp_path / "q.json"
    args = ("bench", "prefill,decode", "--prompt-tokens", "16", "--decode-tokens", "8",
            "--batch-sizes", "1", "--quantization", "fp8", *ENGINE_FLAGS)  # fmt: skip
    run = ninfer(*args, "--json", str(out))
    assert run.returncode == 0, run.stderr + run.stdout
    r = json.loads(out.read_text())
    base = r["baseline"]
    assert base["meta"]["engine"]["quantization"] is None
    assert r["meta"]["model"].endswith("fp8 at load") and "fp8" not in base["meta"]["model"]
    dq, db = r["decode"]["rows"][0], base["decode"]["rows"][0]
    assert db["step_bytes"] > 2 * dq["step_bytes"]  # its bound counts the unquantized bytes
    assert db["quantized_speedup"] == pytest.approx(
        dq["steady_tokens_per_s"] / db["steady_tokens_per_s"]
    )
    pq, pb = r["prefill"]["rows"][0], base["prefill"]["rows"][0]
    assert pb["quantized_speedup"] == pytest.approx(pb["seconds"] / pq["seconds"])
    table = run.stdout[run.stdout.index("fp8 beside") :]
    assert "prefill 16" in table and "decode batch 1" in table
    run = ninfer(*args, "--no-baseline", "--json", str(out))
    assert run.returncode == 0 and "baseline" not in json.loads(out.read_text())
    assert "fp8 beside" not in run.stdout
