"""`python -m ninfer generate` end to end on the demo model: good and bad lines, re-runs that
retry what failed, standard output, and a directory as the output."""

from __future__ import annotations

import json
import re

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
    '{"prompt": "hello", "max_token": 4}',
    '{"prompt": "hello", "temperature": "hot"}',
    '{"prompt": "hello", "temperature": 1, "seed": 18446744073709551616}',
    '{"prompt": "hello", "max_tokens": 3, "logprobs": true}',
    '{"prompt": "hello world", "max_tokens": 5, "temperature": 1, "seed": 7}',
]
GOOD = {1, "toks", 4, 10, 15}
BAD = {
    3: "invalid JSON",
    5: "temperature must be",
    6: "exactly one of",
    7: "vocabulary",
    11: 'unknown field "max_token" (did you mean "max_tokens"?); known fields: prompt,',
    12: '"temperature" must be a finite number, got "hot" (a string)',
    13: '"seed" must be an integer from 0 to 2**64-1',
    14: '"logprobs" must be an integer (top-k per token) or null, got true (a boolean)',
}


def flat(text: str) -> str:
    """The messages with their line breaks as spaces: the terminal width wraps a message that
    names a long path (a pytest-xdist worker's temporary directory, say) anywhere."""
    return " ".join(text.split())


def read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generate_good_and_bad_lines_then_a_rerun_retries_the_bad(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(LINES) + "\n")
    run = ninfer("generate", "-i", str(src), "-o", str(dst), *ENGINE_FLAGS)
    assert run.returncode == 1, run.stderr  # lines failed: not a clean exit
    said = flat(run.stderr)
    assert "5 finished, 9 failed" in said and "a re-run retries them" in said
    records = read(dst)
    assert len(records) == 14  # one record per non-blank line
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
    (toks,) = by_id['"toks"']  # the repeated id has no record of its own
    assert toks["usage"]["prompt_tokens"] == 4 and "error" not in toks
    for line_id, words in BAD.items():
        (rec,) = by_id[str(line_id)]
        assert words in rec["error"] and rec["finish_reason"] == "error"
        assert rec["line"] == line_id
    (duplicate,) = by_id["null"]
    assert duplicate["line"] == 9
    assert 'duplicate id "toks" (first on line 2)' in duplicate["error"]
    # The same greedy prompt twice gives the same tokens (line 10 adds a top_k, still greedy).
    assert by_id["1"][0]["token_ids"] == by_id["10"][0]["token_ids"]
    # A seeded line ran beside the bad ones, untouched by them: line 15 again gives its tokens.
    seeded = tmp_path / "seeded.jsonl"
    seeded.write_text(LINES[-1] + "\n")
    alone = ninfer("generate", "-i", str(seeded), "-o", "-", "--quiet", *ENGINE_FLAGS)
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["token_ids"] == by_id["15"][0]["token_ids"]

    again = ninfer("generate", "-i", str(src), "-o", str(dst), *ENGINE_FLAGS)
    assert again.returncode == 1, again.stderr
    assert "skipping 5 lines already finished" in flat(again.stderr)
    assert "removed 9 failed or unfinished records" in flat(again.stderr)
    rerun = read(dst)
    assert rerun[:5] == good  # the finished records stay, in place and unchanged
    assert sorted(map(json.dumps, rerun[5:])) == sorted(
        json.dumps(r) for r in records if "error" in r
    )  # the failed lines ran again: one record each, not one more per run


def test_a_rerun_retries_errored_and_torn_lines_and_keeps_finished_ones(tmp_path, demo_checkpoint):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": f"question {i}",
                                         "max_tokens": 2}) for i in range(5)))  # fmt: skip
    done = {"id": "q1", "text": "earlier", "token_ids": [], "finish_reason": "stop"}
    failed = {"id": "q3", "finish_reason": "error", "error": "the engine has failed"}
    aborted = {"id": "q4", "text": "", "token_ids": [], "finish_reason": "abort"}
    dst.write_text("\n".join(map(json.dumps, [done, failed, aborted])) + '\n{"id": "q2", "te')
    model = ["--model", str(demo_checkpoint)]  # a checkpoint folder, not the embedded demo
    run = ninfer("generate", "-i", str(src), "-o", str(dst), "--quiet", *model, *ENGINE_FLAGS)
    assert run.returncode == 0, run.stderr
    assert "removed 3 failed or unfinished records" in flat(run.stderr)
    lines = dst.read_text().splitlines()
    assert json.loads(lines[0]) == done
    new = [json.loads(line) for line in lines[1:]]
    assert sorted(r["id"] for r in new) == ["q0", "q2", "q3", "q4"]
    assert all("error" not in r and r["finish_reason"] in ("stop", "length") for r in new)


def test_output_to_stdout_and_a_directory_as_output(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1, "prompt": "hi", "max_tokens": 2}\n{"id": 2, "prompt": "yo"}\n')
    run = ninfer("generate", "-i", str(src), "-o", "-", "--max-tokens", "3", *ENGINE_FLAGS)
    assert run.returncode == 0, run.stderr
    out = [json.loads(line) for line in run.stdout.splitlines()]  # only records on stdout
    assert sorted(r["id"] for r in out) == [1, 2]
    assert {r["id"]: r["usage"]["completion_tokens"] for r in out} == {1: 2, 2: 3}
    assert "2 lines written to standard output: 2 finished" in flat(run.stderr)
    assert not (tmp_path / "-").exists()

    folder = tmp_path / "results"
    folder.mkdir()
    bad = ninfer("generate", "-i", str(src), "-o", str(folder), *ENGINE_FLAGS)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        f"ninfer generate: error: -o {folder}: is a directory; give a file path (or - for stdout)"
    )
    missing = ninfer("generate", "-i", str(tmp_path / "nope.jsonl"), "-o", "-", *ENGINE_FLAGS)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().endswith("nope.jsonl: No such file or directory")
    zero = ninfer("generate", "-i", str(src), "-o", "-", "--max-tokens", "0")
    assert zero.returncode == 2 and "--max-tokens: must be an integer >= 1, got 0" in zero.stderr


def test_response_format_lines_give_documents_of_their_schema(tmp_path):
    """Structured outputs through `ninfer generate` (issue 39, item 1): a messages line with
    OpenAI's `response_format`, a prompt line with vLLM's `structured_outputs`; a schema the
    guard refuses fails that line alone, naming the keyword."""
    digit = {"type": "integer", "minimum": 0, "maximum": 9}
    schema = {
        "type": "object",
        "properties": {"n": digit, "s": {"enum": ["a", "b"]}},
        "required": ["n", "s"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    overlapping = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    lines = [
        {"id": "json", "messages": [{"role": "user", "content": "JSON"}], "max_tokens": 60,
         "seed": 1, "response_format": fmt},
        {"id": "re", "prompt": "x", "max_tokens": 20, "seed": 2,
         "structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}},
        {"id": "bad", "prompt": "x", "max_tokens": 5, "response_format":
         {"type": "json_schema", "json_schema": {"name": "y", "schema": overlapping}}},
    ]  # fmt: skip
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = ninfer("generate", "-i", str(src), "-o", "-", "--quiet", *ENGINE_FLAGS)
    assert run.returncode == 1, run.stderr  # the refused line failed
    by_id = {rec["id"]: rec for rec in map(json.loads, run.stdout.splitlines())}
    doc = json.loads(by_id["json"]["text"])
    assert by_id["json"]["finish_reason"] == "stop"
    assert doc["n"] in range(10) and doc["s"] in ("a", "b") and set(doc) == {"n", "s"}
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", by_id["re"]["text"])
    assert "oneOf" in by_id["bad"]["error"] and by_id["bad"]["finish_reason"] == "error"
    # the error names the field the line used, not the engine's internal one
    assert "response_format.json_schema.schema: " in by_id["bad"]["error"]
    assert "structured_outputs" not in by_id["bad"]["error"]
