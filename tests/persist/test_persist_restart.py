"""A conversation continued in a new process resumes from the saved Host tier (spec §5.5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("resume_script.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(path: Path, mode: str, stdin: str = "") -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(path), mode],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_resumes_from_the_saved_tier(tmp_path):
    path = tmp_path / "demo.hpc"
    first = _run(path, "first")
    assert first["cached_tokens"] == 0 and path.is_file()
    reply = json.dumps(first)
    second = _run(path, "second", reply)
    cold = _run(path, "cold", reply)
    # turn 1's endpoint snapshot (300 prompt + 24 generated - 1) came back from the file
    assert second["cached_tokens"] == 300 + 24 - 1
    assert second["restored_host_bytes"] > 0 and second["hits_host"] == 1
    assert cold["cached_tokens"] == 0
    assert second["token_ids"] == cold["token_ids"]
