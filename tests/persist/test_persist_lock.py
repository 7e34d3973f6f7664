"""`prefix_cache_file` hardening: only a regular file (or none) is accepted, without ever opening
the path to look (a FIFO would hang); one engine at a time holds a file (an exclusive lock for
its lifetime); temporary names are unique and a killed save's temporaries are removed at start;
an LLM that is never closed still saves at exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from ninfer import LLM, SamplingParams
from ninfer.persist.cache_file import PrefixCacheFile
from ninfer.persist.lock import lock_path
from ninfer.persist.payload import save_file, stale_temps

OPTS = dict(device="cpu", max_concurrency=2, kv_capacity=4096, host_cache_mib=4)
PARAMS = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def _construct_with_timeout(path, seconds: float = 120.0):
    """LLM(prefix_cache_file=path) in a thread: (exception or None); fails if it hangs."""
    result: dict = {}

    def build():
        try:
            LLM(prefix_cache_file=str(path), **OPTS).close()
            result["exc"] = None
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result["exc"] = e

    t = threading.Thread(target=build, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"LLM(prefix_cache_file={path}) hangs"
    return result["exc"]


def test_a_character_device_is_refused_and_left_alone():
    exc = _construct_with_timeout("/dev/null")
    assert isinstance(exc, ValueError) and "character device" in str(exc)
    assert "prefix_cache_file" in str(exc)
    assert Path("/dev/null").is_char_device()


def test_a_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "cache.hpc"
    os.mkfifo(fifo)
    exc = _construct_with_timeout(fifo)
    assert isinstance(exc, ValueError) and "FIFO" in str(exc)


def test_a_directory_is_refused(tmp_path):
    (tmp_path / "cache.hpc").mkdir()
    exc = _construct_with_timeout(tmp_path / "cache.hpc")
    assert isinstance(exc, ValueError) and "directory" in str(exc)


def test_one_engine_at_a_time_holds_a_file(tmp_path):
    path = tmp_path / "cache.hpc"
    first = LLM(prefix_cache_file=str(path), **OPTS)
    first.generate([[5, 6, 7] * 30], PARAMS)
    with pytest.raises(ValueError, match="in use by another engine"):
        LLM(prefix_cache_file=str(path), **OPTS)
    first.close()
    assert path.is_file()  # saved at close, then released
    second = LLM(prefix_cache_file=str(path), **OPTS)
    assert second.cache_stats().snapshots_host >= 1  # it read the first engine's file
    second.close()


def test_a_lock_held_by_another_process_is_refused(tmp_path):
    path = tmp_path / "cache.hpc"
    code = textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(lock_path(path))!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, str(os.getpid()).encode())
        print("locked", flush=True)
        sys.stdin.read()
    """)
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=f"pid {holder.pid}"):
            PrefixCacheFile(path, {}).acquire()
    finally:
        holder.stdin.close()
        holder.wait(30)
    PrefixCacheFile(path, {}).acquire().release()  # free again once that process is gone
    assert not lock_path(path).exists()  # deleted at release


def test_stale_temporaries_are_removed_at_start(tmp_path):
    path = tmp_path / "cache.hpc"
    stale = [tmp_path / ".cache.hpc.tmp-4242-abcd1234", tmp_path / f".cache.hpc.tmp-{os.getpid()}"]
    other = tmp_path / ".other.hpc.tmp-4242-abcd1234"
    for p in [*stale, other]:
        p.write_bytes(b"partial")
    f = PrefixCacheFile(path, {}).acquire()
    assert not any(p.exists() for p in stale) and other.exists()
    assert stale_temps(path) == []
    f.release()


def test_temporary_names_are_unique(tmp_path, monkeypatch):
    from ninfer.cache.host_pool import SlabGeometry
    from ninfer.memory.host_slabs import HostSlabs

    slabs = HostSlabs(SlabGeometry(1, 4096, 4096, 2, 2, 4096, 1), pin=False)
    seen: list[str] = []
    real = os.replace

    def spy(src, dst):
        seen.append(os.path.basename(src))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    for _ in range(3):
        save_file(tmp_path / "a.hpc", slabs, [0, 1], lambda sums: b"h" * 16, lambda: False)
    assert len(set(seen)) == 3 and all(n.startswith(".a.hpc.tmp-") for n in seen)
    assert stale_temps(tmp_path / "a.hpc") == []  # each renamed away


def test_a_save_refuses_a_path_that_became_a_device(tmp_path):
    from ninfer.cache.host_pool import SlabGeometry
    from ninfer.memory.host_slabs import HostSlabs

    slabs = HostSlabs(SlabGeometry(1, 4096, 4096, 2, 2, 4096, 1), pin=False)
    fifo = tmp_path / "b.hpc"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="FIFO"):
        save_file(fifo, slabs, [0], lambda sums: b"h" * 16, lambda: False)
    assert stale_temps(fifo) == []


def test_an_llm_never_closed_saves_at_exit(tmp_path):
    path = tmp_path / "cache.hpc"
    code = textwrap.dedent(f"""
        from ninfer import LLM, SamplingParams
        LLM_HELD = LLM(prefix_cache_file={str(path)!r}, device="cpu", max_concurrency=2,
                       kv_capacity=4096, host_cache_mib=4)
        LLM_HELD.generate([[5, 6, 7] * 30], SamplingParams(max_tokens=4, temperature=0))
        print("served", flush=True)
    """)  # no close(): the module global lives until the interpreter exits
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "served" in out.stdout
    assert path.is_file() and path.stat().st_size > 0, out.stderr[-2000:]
    assert stale_temps(path) == []
