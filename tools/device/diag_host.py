"""Where the host time of a prefill pass and of a graph-replayed decode step goes (cProfile).

Builds one preset like `bench_engine.py` (random bf16 weights, fused, compiled, graphs), then
prints the top functions by own time and by cumulative time for one eager prefill pass of
`--prefill` tokens and for `--steps` decode steps at batch 1, with the wall time of each.
A host synchronisation shows up as time inside `.tolist()` / `.item()` / `synchronize`.

    python3 tools/device/diag_host.py --model 9B --prefill 1024 --steps 200
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_engine as be  # noqa: E402

from ninfer.engine.executor.runner import Row  # noqa: E402
from ninfer.page import PAGE_SIZE  # noqa: E402


def report(title: str, prof: cProfile.Profile, wall: float, n: int) -> None:
    print(f"\n===== {title}: {wall * 1e3 / n:.3f} ms per call (n={n}) =====", flush=True)
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).strip_dirs().sort_stats(key).print_stats(28)
        print("\n".join(s.getvalue().splitlines()[4:40]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="9B")
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    ns = argparse.Namespace(fuse=True, skinny=True)
    ppr = -(-(1024 + 2 * args.steps + 16) // PAGE_SIZE)  # warm-up + two timed runs
    pages = max(8 * ppr, -(-args.prefill // PAGE_SIZE)) + 3
    model, cache, runner = be.build(args.model, True, ns, 8, pages, max(ppr, 64))
    rows = [Row(list(range(5, 5 + args.prefill)), 0, 0, list(range(-(-args.prefill // 64))),
                be.GREEDY)]  # fmt: skip
    for _ in range(2):
        runner.step(rows)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(3):
        runner.step(rows)
    torch.cuda.synchronize()
    prof.disable()
    report(f"{args.model} prefill {args.prefill}", prof, time.perf_counter() - t0, 3)

    drows = be.decode_rows(1, 1024, ppr)

    def advance():
        out = runner.step(drows)
        drows[0].token_ids, drows[0].ctx_len = [out.tokens[0]], drows[0].ctx_len + 1

    for _ in range(5):
        advance()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        advance()
    plain = (time.perf_counter() - t0) / args.steps
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(args.steps):
        advance()
    prof.disable()
    print(f"\ndecode step without the profiler: {plain * 1e3:.3f} ms")
    report(f"{args.model} decode b1", prof, time.perf_counter() - t0, args.steps)


if __name__ == "__main__":
    main()
