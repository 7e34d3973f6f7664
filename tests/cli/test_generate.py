"""`python -m ninfer generate` end to end on the demo model: good and bad lines, resume."""

from __future__ import annotations

import json

from tests.cli.cli_util import ENGINE_FLAGS, ninfer

LINES = [
    '{"prompt": "hello world", "max_tokens": 5, "temperature": 0}',
    '{"id": "toks", "prompt_token_ids": [11, 12, 13, 14], "max_tokens": 3}',
    "this is not json",
    '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "enable_thinking": false}',
    '{"prompt": "x", "temperature": -1}',
    '{"max_tokens": 3}',
    '{"prompt_token_ids": [999999], "max_tokens": 2}',
    "",
    '{"id": "toks", "prompt": "same id again"}',
    '{"prompt": "hello world", "max_tokens": 5, "temperature": 0, "top_k": 3, "stop": ["zz"]}',
]
GOOD = {1, "toks", 4, 10}
BAD = {3: "invalid JSON", 5: "temperature", 6: "exactly one of", 7: "vocabulary"}


def read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generate_good_and_bad_lines_then_resume(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(LINES) + "\n")
    run = ninfer("generate", "-i", str(src), "-o", str(dst), *ENGINE_FLAGS)
    assert run.returncode == 0, run.stderr
    records = read(dst)
    by_id: dict = {}
    for rec in records:
        by_id.setdefault(json.dumps(rec["id"]), []).append(rec)
    good = [r for r in records if "error" not in r]
    assert {r["id"] for r in good} == GOOD
    for rec in good:
        assert set(rec) >= {"id", "text", "token_ids", "finish_reason", "usage", "metrics"}
        assert rec["finish_reason"] in ("stop", "length")
        assert 1 <= rec["usage"]["completion_tokens"] == len(rec["token_ids"])
        assert rec["usage"]["prompt_tokens"] > 0 and rec["metrics"]["ttft_s"] > 0
    (toks,) = [r for r in by_id['"toks"'] if "error" not in r]
    assert toks["usage"]["prompt_tokens"] == 4
    for line_id, words in BAD.items():
        (rec,) = by_id[str(line_id)]
        assert words in rec["error"] and rec["finish_reason"] == "error"
    duplicate = [r for r in by_id['"toks"'] if "error" in r]
    assert len(duplicate) == 1 and "duplicate id" in duplicate[0]["error"]
    # The same greedy prompt twice gives the same tokens (line 10 adds a top_k, still greedy).
    assert by_id["1"][0]["token_ids"] == by_id["10"][0]["token_ids"]

    again = ninfer("generate", "-i", str(src), "-o", str(dst), *ENGINE_FLAGS)
    assert again.returncode == 0, again.stderr
    assert "skipping 9 ids" in again.stderr
    assert read(dst) == records  # nothing rewritten, nothing lost


def test_generate_resumes_only_missing_ids_after_a_torn_line(tmp_path, demo_checkpoint):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": f"question {i}",
                                         "max_tokens": 2}) for i in range(4)))  # fmt: skip
    done = {"id": "q1", "text": "earlier", "token_ids": [], "finish_reason": "stop"}
    dst.write_text(json.dumps(done) + '\n{"id": "q2", "te')  # a run killed mid-write
    model = ["--model", str(demo_checkpoint)]  # a checkpoint folder, not the embedded demo
    run = ninfer("generate", "-i", str(src), "-o", str(dst), "--quiet", *model, *ENGINE_FLAGS)
    assert run.returncode == 0, run.stderr
    lines = dst.read_text().splitlines()
    assert json.loads(lines[0]) == done and lines[1] == '{"id": "q2", "te'
    new = [json.loads(line) for line in lines[2:]]
    assert sorted(r["id"] for r in new) == ["q0", "q2", "q3"]
    assert all("error" not in r for r in new)
