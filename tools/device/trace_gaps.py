"""Where the GPU waits in a torch.profiler Chrome trace (`ninfer bench --profile DIR` writes
one per profiled block): device busy time against the span from the first to the last device
activity, the largest idle gaps with the kernels on either side, and what the host was doing
during each (the runtime calls and CPU ops that overlap it, longest first).

    python3 tools/device/trace_gaps.py DIR/prefill.json [--top 12] [--json OUT.json]

Prints one JSON object. Device activity = kernels, memcpys and memsets (`cat` kernel,
gpu_memcpy, gpu_memset); a `record_function` span's device-side copy is not activity.
"""

from __future__ import annotations

import argparse
import gzip
import json

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function")


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def analyse(events: list[dict], top: int) -> dict:
    dev = sorted((e for e in events if e.get("cat") in DEVICE_CATS), key=lambda e: e["ts"])
    host = [e for e in events if e.get("cat") in HOST_CATS]
    if not dev:
        return {"error": "no device activity in the trace"}
    first, end = dev[0]["ts"], dev[0]["ts"] + dev[0]["dur"]
    busy, gaps, prev = dev[0]["dur"], [], dev[0]["name"]
    for e in dev[1:]:
        start, stop = e["ts"], e["ts"] + e["dur"]
        if start > end:
            gaps.append((start - end, end, prev, e["name"]))
            busy += stop - start
        elif stop > end:
            busy += stop - end
        if stop > end:
            end, prev = stop, e["name"]
    span = end - first
    rows = []
    for gap, at, before, after in sorted(gaps, reverse=True)[:top]:
        lo, hi = at, at + gap
        over = [h for h in host if h["ts"] < hi and h["ts"] + h["dur"] > lo]
        over.sort(key=lambda h: min(hi, h["ts"] + h["dur"]) - max(lo, h["ts"]), reverse=True)
        rows.append({
            "gap_us": round(gap, 1),
            "at_ms": round((at - first) / 1e3, 3),
            "after": before[:70],
            "before": after[:70],
            "host": [f"{h['name'][:60]} ({h['dur']:.0f} us)" for h in over[:6]],
        })  # fmt: skip
    limits = {"<10us": 10, "10-100us": 100, "100us-1ms": 1e3, ">1ms": float("inf")}
    buckets = dict.fromkeys(limits, 0.0)
    for gap, *_ in gaps:
        buckets[next(k for k, hi in limits.items() if gap < hi)] += gap / 1e3
    host_first = min((h["ts"] for h in host), default=first)
    return {
        "device_span_ms": round(span / 1e3, 3),
        "device_busy_ms": round(busy / 1e3, 3),
        "idle_ms": round((span - busy) / 1e3, 3),
        "idle_ms_by_gap_size": {k: round(v, 3) for k, v in buckets.items()},
        "gaps": len(gaps),
        "lead_ms": round((first - host_first) / 1e3, 3),
        "top_gaps": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args()
    out = analyse(load(args.trace), args.top)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
