"""The command line shared by the per-case device benchmarks (`bench_gdn_glue.py`):
`--cases PRESET:TOKENS,...` and `--out FILE`; measures the copy
bandwidth once, runs every case, writes all rows as one JSON list."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch

from ninfer import probe as bounds


def main(doc: str, default_cases: str, default_out: str,
         run_case: Callable[[str, int, float], list[dict]]) -> None:  # fmt: skip
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--cases", default=default_cases)
    ap.add_argument("--out", default=default_out)
    args = ap.parse_args()
    copy_bps = bounds.copy_bandwidth(torch.device("cuda"))
    rows: list[dict] = [{"copy_TBps": round(copy_bps / 1e12, 3)}]
    for case in args.cases.split(","):
        name, tokens = case.split(":")
        rows += run_case(name, int(tokens), copy_bps)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
