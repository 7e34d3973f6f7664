"""Soak: thousands of requests through one LLM, with random cancellations, Host tier on
(`ninfer.bench.soak` runs it and says what is checked; exit 1 on any failure).

    python tools/soak.py                                  # CPU, demo model, 2000 requests
    python tools/soak.py --device cuda --requests 20000   # the H200
    python tools/soak.py --model /path/to/checkpoint --device cuda
"""

from __future__ import annotations

import argparse
import json
import sys

from ninfer.bench.soak import run_soak
from ninfer.cli.main import add_engine_flags, engine_kwargs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--cancel-rate", type=float, default=0.1)
    ap.add_argument("--check-every", type=int, default=50, help="steps between invariant checks")
    ap.add_argument("--report-every", type=float, default=5.0, help="seconds between lines")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--prefix-tokens", type=int, default=600)
    ap.add_argument("--max-growth-mib", type=float, default=64.0)
    ap.add_argument("--json", default=None, help="write the report here")
    ap.add_argument(
        "--tolerate", action="append", default=[], help="a known invariant message (repeatable)"
    )
    add_engine_flags(ap)  # `ninfer`'s engine flags; --seed also seeds the workload
    # a small Device pool and Host tier, so that evictions and restores happen
    ap.set_defaults(device="cpu", host_cache_mib=64, kv_capacity="16384")
    args = ap.parse_args(argv)
    from ninfer import LLM

    engine = engine_kwargs(args)
    llm = LLM(**engine)
    with llm:
        report = run_soak(
            llm,
            requests=args.requests,
            clients=args.clients,
            cancel_rate=args.cancel_rate,
            check_every=args.check_every,
            report_every=args.report_every,
            max_tokens=args.max_tokens,
            prefix_tokens=args.prefix_tokens,
            seed=engine.get("seed", 0),
            max_growth_mib=args.max_growth_mib,
            tolerate=tuple(args.tolerate),
        )
        stats = llm.cache_stats()
    summary = {
        "requests": report.requests,
        "outputs": report.outputs,
        "reasons": dict(report.reasons),
        "cancels_sent": report.cancels_sent,
        "invariant_checks": report.invariant_checks,
        "tolerated": dict(report.tolerated),
        "steps": report.steps,
        "seconds": round(report.seconds, 2),
        "restores": stats.restores,
        "hits_host": stats.hits_host,
        "device_evictions": stats.device_evicted_backed + stats.device_evicted_unbacked,
        "host_faults": stats.host_faults,
        "memory_mib": [
            {
                k: round(v / 2**20, 1) if k != "t" else round(v - report.samples[0]["t"], 1)
                for k, v in s.items()
            }
            for s in report.samples
        ],  # fmt: skip
        "failures": report.failures,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "memory_mib"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print("soak:", "PASSED" if report.ok else "FAILED")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
