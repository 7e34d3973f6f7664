"""Cached = cold under a random mix of requests (`ninfer.bench.cached_cold` runs it and says what
is compared): per seed, rounds of requests through one LLM with its prefix cache, each request
then run again on an LLM without one. Prints every mismatch (near-tie or suspect) with its
figures; exit 1 on an error output, a logprob drift beyond --noise or a suspect mismatch.

    python tools/fuzz_cached_cold.py --seeds 0 1 2 --rounds 10        # CPU, demo model
    python tools/fuzz_cached_cold.py --device cuda --noise 0.1 --tie 0.1   # bf16: wider
                                                       # (race gaps assume the CPU generator)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from ninfer.bench.cached_cold import FP32, Tolerance, run_cached_cold
from ninfer.cli.main import add_engine_flags, engine_kwargs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="workload seeds")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=40, help="requests submitted together")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--root-tokens", type=int, default=300, help="length of the shared roots")
    ap.add_argument(
        "--check-invariants", action="store_true", help="check the cache after every step"
    )
    ap.add_argument("--noise", type=float, default=FP32.noise, help="logprob drift allowed")
    ap.add_argument("--tie", type=float, default=FP32.tie, help="a near-tie's largest margin")
    ap.add_argument("--json", default=None, help="write every mismatch (with its request) here")
    add_engine_flags(ap)
    # a small Device pool and Host tier, so that evictions and restores happen
    ap.set_defaults(device="cpu", host_cache_mib=64, kv_capacity="8192", device_snapshot_slots=8)
    args = ap.parse_args(argv)
    from ninfer import LLM

    engine = engine_kwargs(args)
    ok, found = True, []
    for seed in args.seeds:
        with (
            LLM(**engine, check_invariants=args.check_invariants) as llm,
            LLM(**{**engine, "prefix_reuse": False}) as cold,
        ):
            report = run_cached_cold(
                llm,
                cold,
                rounds=args.rounds,
                per_round=args.per_round,
                seed=seed,
                root_tokens=args.root_tokens,
                max_tokens=args.max_tokens,
                tol=Tolerance(args.noise, args.tie),
            )
            stats = llm.cache_stats()
        suspects = len(report.suspects)
        print(
            f"seed {seed}: {report.requests} requests {report.compared}, {report.positions} "
            f"positions compared, max drift {report.max_drift:.2e}, {len(report.mismatches)} "
            f"mismatches ({suspects} suspect), {len(report.errors)} errors, "
            f"{report.seconds:.0f} s; cache: hits {stats.hits_device} Device {stats.hits_host} "
            f"Host {stats.hits_root} none, {stats.reuse_tokens} tokens reused, "
            f"{stats.suspensions} suspensions, {stats.snapshots_published} snapshots published"
        )
        ok = ok and report.ok
        found += [{"seed": seed, **asdict(m)} for m in report.mismatches]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)
    print("cached = cold:", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
