"""Per-turn TTFT of `ninfer bench ttft` (the cached engine, then the cold one, on the same
conversations), with a breakdown of every timed request: its forward passes (kind, new tokens,
cached context, seconds), the Host restore, the cache's counters that moved, and new files in the
Triton / FlashInfer JIT caches (a kernel compiled inside a timed turn). Prints one line per turn
and the passes under it; `--out` writes the whole record as JSON.

Pass kinds: `prefill-graph` (a captured bucket replayed), `decode-graph`, `split` (a mixed step
as two replays), `eager`; flags: `+tap` (a snapshot inside the pass: StateTap), `+restore` (a
Host restore hook: the pass waits per layer), `+gathered` (the gathered attention path). With
`--sync` (default) every pass is bracketed by a device synchronisation, so its seconds are its
own (the engine's TTFT then includes those syncs: compare turns with each other, not with
`ninfer bench` figures).

Usage (device machine, repo root):
    source tools/device/env.sh
    python3 tools/device/ttft_turns.py --preset 9B --prompt-tokens 8192 --turns 6 \
        [--trace chat] [--seed 0] [--no-sync] [--out "$OUT/ttft_turns.json"]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import torch

from ninfer.bench import ttft as ttft_mod
from ninfer.bench.suite import BenchSpec, load
from ninfer.engine.executor.runner import Runner

JIT_DIRS = [
    Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache")),
    Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home())) / ".cache" / "flashinfer",
]
STAT_KEYS = (
    "hits_device", "hits_host", "hits_root", "restores", "write_through_bytes",
    "snapshots_published", "taps_published", "slot_displaced", "device_evicted_backed",
)  # fmt: skip


def jit_files() -> int:
    return sum(len(files) for d in JIT_DIRS if d.is_dir() for _, _, files in os.walk(d))


class Recorder:
    """Wraps Runner.forward (every pass) and ttft._chat (every request)."""

    def __init__(self, sync: bool) -> None:
        self.sync = sync
        self.engine = "?"
        self.passes: list[dict] = []
        self.requests: dict[int, dict] = {}  # id(conversation) -> record, per engine
        self.by_engine: dict[str, dict[int, dict]] = {}
        self.llm = None

    def install(self) -> None:
        forward, chat, rec = Runner.forward, ttft_mod._chat, self

        def timed_forward(runner, rows, feed=None):
            kind = _kind(runner, rows, feed)
            planner = getattr(runner.ops, "attention_planner", None)
            gathered = getattr(planner, "gathered_passes", 0)
            if rec.sync:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = forward(runner, rows, feed)
            if rec.sync:
                torch.cuda.synchronize()
            if getattr(planner, "gathered_passes", 0) > gathered:
                kind += "+gathered"
            last = rows[-1]
            rec.passes.append({
                "kind": kind, "rows": len(rows), "new_tokens": sum(len(r.token_ids) for r in rows),
                "last_q": len(last.token_ids), "last_ctx": last.ctx_len,
                "s": time.perf_counter() - t0,
            })  # fmt: skip
            return out

        def recorded_chat(llm, conv, max_tokens):
            rec.llm = llm
            before, files, n = _stats(llm), jit_files(), len(rec.passes)
            t0 = time.perf_counter()
            out = chat(llm, conv, max_tokens)
            wall = time.perf_counter() - t0
            after = _stats(llm)
            first = [p for p in rec.passes[n:] if p["new_tokens"] > p["rows"] or p is rec.passes[n]]
            rec.by_engine.setdefault(rec.engine, {})[id(conv)] = {
                "prompt_tokens": out.usage.prompt_tokens,
                "cached_tokens": out.usage.cached_tokens,
                "ttft_s": out.metrics.ttft_s,
                "prefill_s": out.metrics.prefill_s,
                "restore_s": out.metrics.restore_s,
                "wall_s": wall,
                "new_jit_files": jit_files() - files,
                "prefill_passes": first,
                "cache": {k: after[k] - before[k] for k in STAT_KEYS if after[k] != before[k]},
            }
            return out

        Runner.forward = timed_forward
        ttft_mod._chat = recorded_chat


def _kind(runner, rows, feed) -> str:
    if runner.graphs is not None and runner.graphs.can_run(rows):
        kind = "decode-graph"
    elif feed is None and runner.prefill_graphs is not None:
        pg = runner.prefill_graphs
        if pg.can_run(rows):
            kind = "prefill-graph"
        elif len(rows) > 1 and runner.graphs is not None and runner.graphs.can_run(rows[:-1]):
            kind = "split" if pg.can_run(rows[-1:]) else "eager"
        else:
            kind = "eager"
    else:
        kind = "eager"
    if any(r.taps for r in rows):
        kind += "+tap"
    if any(r.before_layer is not None for r in rows):
        kind += "+restore"
    return kind


def _stats(llm) -> dict:
    st = dataclasses.asdict(llm.cache_stats())
    return {k: st.get(k, 0) for k in STAT_KEYS}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="9B", help="a preset, or 'demo' (the demo model)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--prompt-tokens", type=int, default=8192)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--trace", default="chat")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--no-sync", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    spec = BenchSpec(
        parts=["ttft"], preset=None if args.preset == "demo" else args.preset,
        prompt_tokens=[args.prompt_tokens], turns=args.turns, trace=args.trace, seed=args.seed,
        engine={"device": args.device},
    )  # fmt: skip
    loaded = load(spec)
    rec = Recorder(sync=not args.no_sync and args.device.startswith("cuda"))
    rec.install()

    def make_llm(**overrides):
        rec.engine = "cached" if overrides.get("prefix_reuse", True) else "cold"
        llm = loaded.make_llm(spec.engine, **overrides)
        startup = getattr(llm, "startup_s", 0.0)
        warm = llm.engine.startup.get("warm_up_s", 0.0)
        print(f"[{rec.engine}] engine ready in {startup:.2f} s (warm-up {warm:.2f} s)", flush=True)
        return llm

    sessions = ttft_mod.trace_sessions(args.trace, args.seed, args.turns, args.prompt_tokens)
    sent: list = []
    original_chat = ttft_mod._chat

    def keep_conv(llm, conv, max_tokens):
        if rec.engine == "cached":
            sent.append(conv)
        return original_chat(llm, conv, max_tokens)

    ttft_mod._chat = keep_conv
    result = ttft_mod.bench_ttft(make_llm, sessions, args.max_tokens)
    cached, cold = rec.by_engine.get("cached", {}), rec.by_engine.get("cold", {})
    timed = [c for c in sent if id(c) in cold]  # warm-up requests never reach the cold engine
    turns = []
    for row, conv in zip(result["turns"], timed, strict=False):
        hot, base = cached[id(conv)], cold[id(conv)]
        turns.append({"session": row["session"], "turn": row["turn"], "cached": hot, "cold": base})
        slower = " SLOWER THAN COLD" if hot["ttft_s"] > base["ttft_s"] else ""
        print(
            f"{row['session']} turn {row['turn']}: prompt {hot['prompt_tokens']} cached "
            f"{hot['cached_tokens']}  ttft cached {hot['ttft_s'] * 1e3:.1f} ms (restore "
            f"{hot['restore_s'] * 1e3:.1f}, jit files +{hot['new_jit_files']}) cold "
            f"{base['ttft_s'] * 1e3:.1f} ms (jit +{base['new_jit_files']}){slower}"
        )
        for label, r in (("cached", hot), ("cold", base)):
            parts = ", ".join(
                f"{p['kind']} {p['last_q']}@{p['last_ctx']} {p['s'] * 1e3:.1f} ms"
                for p in r["prefill_passes"]
            )
            print(f"    {label:6s} passes: {parts}")
        if hot["cache"]:
            print(f"    cache: {hot['cache']}")
    print(json.dumps(result["summary"]))
    if args.out:
        args.out.write_text(json.dumps({"summary": result["summary"], "turns": turns}, indent=1))


if __name__ == "__main__":
    main()
