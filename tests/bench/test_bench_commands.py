"""The bench modules run as commands (`python -m ninfer.bench.NAME`), each at a tiny size on the
demo model: their flags parse, the engine flags reach the engine, and the report they write
holds the run's figures."""

from __future__ import annotations

import json

from ninfer.bench import cached_cold, soak, structured


def test_soak_command_writes_its_report(tmp_path, capsys):
    out = tmp_path / "soak.json"
    argv = ["--requests", "30", "--clients", "2", "--max-tokens", "4", "--prefix-tokens", "100"]
    assert soak.main([*argv, "--report-every", "100", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["requests"] == report["outputs"] == 30
    assert report["failures"] == [] and report["memory_mib"]
    assert "soak: PASSED" in capsys.readouterr().out


def test_cached_cold_command_writes_every_mismatch(tmp_path, capsys):
    out = tmp_path / "mismatches.json"
    argv = ["--seeds", "0", "1", "--rounds", "1", "--per-round", "4", "--max-tokens", "4"]
    assert cached_cold.main([*argv, "--root-tokens", "80", "--json", str(out)]) == 0
    assert isinstance(json.loads(out.read_text()), list)
    lines = capsys.readouterr().out.splitlines()
    assert [x.split(":")[0] for x in lines if x.startswith("seed ")] == ["seed 0", "seed 1"]
    assert lines[-1] == "cached = cold: PASSED"


def test_structured_command_prints_both_figures(capsys):
    argv = ["--batch", "2", "--constrained", "1", "--prompt-tokens", "8", "--decode-tokens", "24"]
    structured.main([*argv, "--repeat", "1"])
    result = json.loads(capsys.readouterr().out)
    assert (result["batch"], result["constrained_lanes"]) == (2, 1)
    assert len(result["runs"]["all_free"]) == len(result["runs"]["constrained"]) == 1
