"""Device time of a torch.profiler Chrome trace summed by kernel name, largest first, with the
number of calls and the share of all kernel time (the bench's decode trace holds a 64-token
prefill too: its kernels are few and show as such).

    python3 results/h200-2026-12-07i/kernel_sums.py DIR/decode.json [--top 30]
"""

from __future__ import annotations

import argparse
import collections
import json


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    with open(args.trace) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    total = collections.Counter()
    calls = collections.Counter()
    for e in kernels:
        total[e["name"]] += e["dur"]
        calls[e["name"]] += 1
    all_us = sum(total.values())
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    print(f"kernels {len(kernels)}, {all_us / 1e3:.2f} ms of kernel time, span {span / 1e3:.2f} ms")
    for name, us in total.most_common(args.top):
        n = calls[name]
        share = 100 * us / all_us
        print(f"{us / 1e3:8.3f} ms {share:5.1f} % {n:6d} x {us / n:8.2f} us  {name[:100]}")


if __name__ == "__main__":
    main()
