"""`python -m ninfer.bench.spec_table` on the demo model (CPU): plain decode and each
controlled acceptance per context and batch size, in the table and the JSON rows; more
tokens per verify step at a higher acceptance."""

from __future__ import annotations

import json

from ninfer.bench import spec_table


def test_spec_table_rows_and_table(tmp_path, capsys):
    out = tmp_path / "t.json"
    spec_table.main([
        "--contexts", "32", "--batch-sizes", "1,2", "--acceptance", "0.1,0.9",
        "--decode-tokens", "20", "--draft-tokens", "3", "--json", str(out),
    ])  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    keys = [(r["engine"], r["batch"], r.get("spec_draft_acceptance")) for r in rows]
    assert keys == [("plain", 1, None), ("plain", 2, None), ("mtp", 1, 0.1), ("mtp", 2, 0.1),
                    ("mtp", 1, 0.9), ("mtp", 2, 0.9)]  # fmt: skip
    assert all(not r["errors"] and r["context"] == 32 for r in rows)
    per_step = {(r["batch"], r["spec_draft_acceptance"]): r["spec_tokens_per_step"]
                for r in rows if r["engine"] == "mtp"}  # fmt: skip
    for batch in (1, 2):  # 1 + a + a^2 + a^3: 1.11 at a = 0.1, 3.44 at 0.9
        assert per_step[batch, 0.1] < 1.6 < 2.6 < per_step[batch, 0.9]
    printed = capsys.readouterr().out
    assert "MTP speculative decode against plain decode" in printed
    assert printed.count("plain") >= 2 and "0.9" in printed
    # each row is printed as it is measured, before the table (a time box keeps them)
    lines = [line for line in printed.splitlines() if line.startswith("row: ")]
    assert len(lines) == 6 and "engine=mtp a=0.9" in lines[-1]
    assert printed.index(lines[-1]) < printed.index("MTP speculative decode against")


def test_spec_table_refuses_bad_values(capsys):
    import pytest

    bads = (["--acceptance", "1.5"], ["--batch-sizes", "0"], ["--draft-tokens", "9"],
            ["--logprobs", "-1"])  # fmt: skip
    for bad in bads:
        with pytest.raises(SystemExit):
            spec_table.main(bad)
        assert "error" in capsys.readouterr().err


def test_a_staggered_start_leaves_a_steady_window_at_high_acceptance(tmp_path):
    """Prompts of several prefill chunks: lanes start one after another, the early ones
    decoding through the later ones' prefill at up to K + 1 tokens a step. Every row still
    gets its all-decoding window (the run is long enough in tokens, not only in steps)."""
    out = tmp_path / "t.json"
    spec_table.main([
        "--contexts", "192", "--prefill-chunk", "64", "--batch-sizes", "3",
        "--acceptance", "0.9", "--decode-tokens", "10", "--draft-tokens", "3",
        "--json", str(out),
    ])  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [r["engine"] for r in rows] == ["plain", "mtp"]
    for r in rows:
        assert not r["errors"] and r["steady_step_seconds"] is not None, r["steady_note"]
        assert r["steady_window_steps"] >= 8


def test_logprobs_rows_speculate_at_the_acceptance_asked(tmp_path):
    """`--logprobs 2`: every request asks for logprobs, so its verify rows are accepted on the
    host (the path grammars take too); the rows still reach the acceptance asked for."""
    out = tmp_path / "t.json"
    spec_table.main([
        "--contexts", "32", "--batch-sizes", "2", "--acceptance", "0.9", "--decode-tokens",
        "20", "--draft-tokens", "3", "--logprobs", "2", "--json", str(out),
    ])  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [r["engine"] for r in rows] == ["plain", "mtp"] and not any(r["errors"] for r in rows)
    assert rows[1]["spec_tokens_per_step"] > 2.6
