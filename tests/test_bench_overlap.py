"""`ninfer.bench.resume.restore_overlap` on hand-made Chrome traces: which stream is the restore
stream, its bytes, busy time and window, and the compute kernels inside that window."""

from __future__ import annotations

import json

from ninfer.bench.resume import restore_overlap


def _copy(ts, dur, nbytes, stream, name="Memcpy HtoD (Pinned -> Device)"):
    return {"ph": "X", "cat": "gpu_memcpy", "name": name, "ts": ts, "dur": dur,
            "args": {"stream": stream, "bytes": nbytes}}  # fmt: skip


def _kernel(ts, dur, stream):
    return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur,
            "args": {"stream": stream}}  # fmt: skip


def test_overlap_of_a_layered_restore(tmp_path):
    events = [
        _copy(100, 2, 64, stream=7),  # metadata on the compute stream: not the restore
        _copy(1000, 400, 4_000_000, stream=25),
        _copy(1450, 500, 5_000_000, stream=25),  # a 50 us gap: window 950, busy 900
        _copy(1200, 10, 1, stream=29, name="Memcpy DtoH (Device -> Pinned)"),
        _kernel(900, 200, stream=7),  # 100 us inside the window
        _kernel(1300, 100, stream=7),  # inside
        _kernel(1900, 300, stream=7),  # 50 us inside, ends 250 us after the restore
        _kernel(1500, 50, stream=25),  # on the restore stream: not compute
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1000, "dur": 5},
    ]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    o = restore_overlap(trace)
    assert o["copies"] == 2 and o["bytes"] == 9_000_000
    assert o["window_ms"] == 0.95 and o["busy_ms"] == 0.9
    assert abs(o["bytes_per_s"] - 9_000_000 / 950e-6) < 1
    assert o["kernels_during_restore"] == 3 and abs(o["kernel_ms_during_restore"] - 0.25) < 1e-9
    assert abs(o["first_kernel_after_start_ms"] - 0.3) < 1e-9
    assert abs(o["compute_end_after_restore_ms"] - 0.25) < 1e-9


def test_no_gpu_copies_gives_nothing(tmp_path):
    trace = tmp_path / "cpu.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1}]}))
    assert restore_overlap(trace) == {}
