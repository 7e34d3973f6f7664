"""Where a process stalls: runs a module (as `python -m` would) with two observers and writes
what they saw as JSON when the process exits.

    python -m ninfer.bench.stalls OUT.json ninfer serve --device cpu ...

- every garbage collection's generation and pause (`gc.callbacks`; those over 5 ms listed);
- a watcher thread that wakes every millisecond: a wake more than `STALL_S` late means no
  Python thread could run it (the GIL was held, or the process was paused), so it records the
  lateness and, for each other thread, the innermost frames it finds on waking (the holder is
  most often still in the function whose C call held the lock).

Times are `time.perf_counter()` (CLOCK_MONOTONIC: comparable across processes on Linux).
The bystander benchmark (`ninfer.bench.bystander --stall-trace OUT.json`) runs the server so.
"""

from __future__ import annotations

import atexit
import gc
import json
import runpy
import sys
import threading
import time
import traceback

STALL_S = 0.03
GC_LISTED_S = 0.005  # collections shorter than this are only counted
TICK_S = 0.001
MAX_STALLS = 200
FRAMES = 6


class _Observer:
    def __init__(self, path: str) -> None:
        self.path = path
        self.gc_pauses: list[tuple[float, int, float]] = []  # (end, generation, seconds)
        self.stalls: list[dict] = []
        self._gc_start = 0.0
        self._stop = threading.Event()

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            now = time.perf_counter()
            self.gc_pauses.append((now, info["generation"], now - self._gc_start))

    def watch(self) -> None:
        me = threading.get_ident()
        last = time.perf_counter()
        while not self._stop.wait(TICK_S):
            now = time.perf_counter()
            late = now - last - TICK_S
            last = now
            if late > STALL_S and len(self.stalls) < MAX_STALLS:
                names = {t.ident: t.name for t in threading.enumerate()}
                frames = {
                    names.get(ident, str(ident)): [
                        f"{f.filename}:{f.lineno} {f.name}"
                        for f in traceback.extract_stack(frame)[-FRAMES:]
                    ]
                    for ident, frame in sys._current_frames().items()
                    if ident != me
                }
                self.stalls.append(
                    {"t": round(now, 3), "late_ms": round(late * 1e3, 1), "threads": frames}
                )

    def write(self) -> None:
        self._stop.set()
        summary = {
            "gc": [
                {"t": round(end, 3), "generation": gen, "ms": round(pause * 1e3, 2)}
                for end, gen, pause in self.gc_pauses
                if pause > GC_LISTED_S
            ],
            "gc_count": len(self.gc_pauses),
            "stalls": self.stalls,
        }
        with open(self.path, "w") as f:
            json.dump(summary, f, indent=1)


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: python -m ninfer.bench.stalls OUT.json MODULE [ARGS...]")
    observer = _Observer(sys.argv[1])
    gc.callbacks.append(observer.on_gc)
    threading.Thread(target=observer.watch, name="stall-watch", daemon=True).start()
    atexit.register(observer.write)
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
