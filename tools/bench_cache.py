"""Benchmark the prefix-cache index on this CPU (thin wrapper over ninfer.bench.cache_index).

python tools/bench_cache.py [--tokens 240000] [--tree-blocks 1000000] [--snapshots 1300]
"""

from __future__ import annotations

import argparse
import json

from ninfer.bench.cache_index import run_cache_bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=240_000)
    ap.add_argument("--tree-blocks", type=int, default=1_000_000)
    ap.add_argument("--snapshots", type=int, default=1_300)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    result = run_cache_bench(args.tokens, args.tree_blocks, args.snapshots, args.repeats)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
