"""A `prefix_cache_file` that names something else (a typo, a swapped flag: notes, a config, a
model's weights) is never replaced: `LLM(...)` refuses to start with one line naming the path and
what the file looks like, `ninfer` exits non-zero before the model loads, and a file swapped in
during the session is neither read nor saved over. A ninfer cache file (even a damaged one), an
empty file or no file at all is still taken (tests/persist/test_persist_engine.py)."""

from __future__ import annotations

import json
import logging
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from persist_helpers import add_chain, add_snapshot, file_for, make_tier

from ninfer.cli.main import main
from ninfer.llm import LLM
from ninfer.persist.cache_file import resolve_path
from ninfer.persist.identify import foreign
from ninfer.persist.tables import MAGIC

SAFETENSORS_HEAD = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
FILES = {
    "notes.txt": (b"meeting notes: buy milk\n" * 40, "960 B, text"),
    "config.json": (json.dumps({"model_type": "qwen3_5", "layers": 8}).encode(), "JSON"),
    "model.safetensors": (
        struct.pack("<Q", len(SAFETENSORS_HEAD)) + SAFETENSORS_HEAD.encode() + bytes(8),
        "safetensors",
    ),
    "blob.bin": (bytes(range(256)) * 20, "5.1 kB, binary"),
}


def _not_ours(data: bytes) -> bool:
    return bool(data) and data[: len(MAGIC)] != MAGIC[: len(data)]


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=6000).filter(_not_ours))
def test_any_file_that_is_not_a_cache_file_is_refused_and_kept(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("foreign") / "c.hpc"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"^prefix_cache_file: .* is not a ninfer prefix cache"):
        resolve_path(path)
    assert path.read_bytes() == data


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=300), st.integers(0, len(MAGIC)))
def test_a_cache_file_damaged_or_cut_short_is_still_ours(tmp_path_factory, rest, cut):
    path = tmp_path_factory.mktemp("ours") / "c.hpc"
    path.write_bytes(MAGIC[:cut] + (rest if cut == len(MAGIC) else b""))
    assert foreign(path) is None
    assert resolve_path(path) == path


@pytest.mark.parametrize("name", sorted(FILES))
def test_llm_refuses_a_foreign_file_naming_it_and_what_it_looks_like(tmp_path, name):
    data, looks = FILES[name]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError) as refused:
        LLM(device="cpu", host_cache_mib=4, prefix_cache_file=str(path))
    message = str(refused.value)
    assert message.startswith(f"prefix_cache_file: {str(path)!r} is not a ninfer prefix cache")
    assert looks in message and "\n" not in message
    assert path.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no lock, no temporary left


def test_ninfer_serve_exits_with_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import ninfer.models.presets as presets

    def no_load(*_args, **_kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(presets, "build_random_model", no_load)
    path = tmp_path / "notes.txt"
    data, looks = FILES["notes.txt"]
    path.write_bytes(data)
    argv = ["serve", "--port", "0", "--device", "cpu", "--host-cache-mib", "4"]
    assert main([*argv, "--prefix-cache-file", str(path)]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ninfer serve: error: prefix_cache_file: {str(path)!r} is not")
    assert looks in lines[0]
    assert path.read_bytes() == data


def _tier_with_a_snapshot():
    tier = make_tier(10)
    add_snapshot(tier, add_chain(tier, 1, 2)[-1], hits=1)
    return tier


def test_a_file_swapped_in_during_the_session_is_neither_read_nor_saved_over(tmp_path, caplog):
    path = tmp_path / "cache.hpc"
    cache = file_for(path)
    assert cache.save(_tier_with_a_snapshot()) is not None
    path.write_text("notes written over the cache file\n")
    with caplog.at_level(logging.WARNING, logger="ninfer.cache"):
        assert cache.load(make_tier(10)) == 0
        assert cache.save(_tier_with_a_snapshot()) is None
    assert path.read_text() == "notes written over the cache file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.hpc"]
    read, saved = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "not a ninfer prefix cache file (34 B, text)" in read and "neither read" in read
    assert "not saved" in saved and "left as it is" in saved
