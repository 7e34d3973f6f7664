"""A long conversation resumed from the Host tier: the cached turn's time to first token against
a cold prompt of the same length, the restore's rate against the measured pinned link, and (with
a profile) how much of the first prefill pass ran while the restore was still copying.

For each history length H, on a fresh engine with a Host tier whose Device KV pool holds one
conversation of that size but not two:

    turn 1        H random tokens, `reply` generated; release writes its blocks, tail and
                  endpoint image through to the Host.
    push          an unrelated prompt exactly as long as the next turn: its TTFT is the cold
                  figure (nothing of it is cached), and its pages push turn 1 off the Device.
                  Before the push and before the next turn the engine settles (`LLM.settle`):
                  write-through has landed, as it has after any user's think time, so neither
                  request waits for the previous one's copy to free its pages.
    turn 2        turn 1 + its reply + `new` tokens: resumes at turn 1's endpoint, restoring the
                  path's KV pages (layer by layer) and, if displaced, the state image from the
                  Host; its first prefill pass waits per layer (design §6.5).

`rounds` push/turn pairs are measured (the conversation grows by `reply + new` tokens each);
with a profile directory the last turn runs under torch.profiler and the trace is read back for
the overlap: the restore stream's copies (bytes, busy time, window) and the compute kernels that
ran inside that window. CPU runs report the same rows; restores there are synchronous memcpys
(restore_s is 0.0 and there is no overlap to show).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ninfer.bench.profiling import profiled
from ninfer.bench.throughput import FIRST_ID, greedy
from ninfer.page import PAGE_SIZE
from ninfer.probe import release_memory

# KV pool room beyond one conversation (the resumed tail's copy-on-write page)
SLACK_TOKENS = PAGE_SIZE


def engine_overrides(
    cfg, history: int, new: int, reply: int, rounds: int, itemsize: int = 2, kv_itemsize: int = 2
) -> dict:
    """LLM keyword arguments for one history length: a KV pool of one conversation, a Host tier
    for every block the rounds write through (with room for their snapshot images)."""
    longest = history + rounds * (reply + new)
    kv_tokens = -(-(longest + reply + SLACK_TOKENS) // PAGE_SIZE) * PAGE_SIZE  # whole pages
    kv_token_bytes = cfg.kv_bytes_per_token(kv_itemsize)
    image = cfg.state_image_bytes(itemsize)
    # push prompts are written through too: every round's, turn 1's and the live turn's blocks
    host = (rounds + 1.5) * (longest + 64 * 4) * kv_token_bytes + 24 * image
    return {
        "kv_capacity": kv_tokens,
        "max_model_len": kv_tokens,
        "max_concurrency": 1,
        "host_cache_mib": int(host / 2**20) + 64,
        "device_snapshot_slots": 2,
    }


def bench_resume(
    make_llm: Callable[..., object],
    cfg,
    histories: list[int],
    bounds: dict,
    new: int = 64,
    reply: int = 8,
    rounds: int = 2,
    seed: int = 0,
    profile_dir: Path | None = None,
    itemsize: int = 2,
    kv_itemsize: int = 2,
) -> dict:
    """`make_llm(**overrides)` builds an engine (a context manager). `bounds`: machine_bounds.
    `itemsize` / `kv_itemsize`: bytes per element of the model and KV dtypes (pool sizing)."""
    turns = _Turns(
        random.Random(seed), cfg.vocab_size, greedy(reply), new, rounds,
        bounds.get("link_bytes_per_s", 0.0), profile_dir,
    )  # fmt: skip
    rows = []
    for history in histories:
        sizing = engine_overrides(cfg, history, new, reply, rounds, itemsize, kv_itemsize)
        with make_llm(**sizing) as llm:
            rows += turns.run(llm, history)
            stats = llm.cache_stats()
        rows[-1]["cache"] = {
            "hits_host": stats.hits_host,
            "restores": stats.restores,
            "device_evicted_backed": stats.device_evicted_backed,
        }
        release_memory()
    return {"rows": rows, "new_tokens": new, "reply_tokens": reply}


@dataclass(slots=True)
class _Turns:
    """bench_resume's requests on one engine: turn 1, then `rounds` push / turn pairs; one
    random stream across the history lengths."""

    rng: random.Random
    vocab: int
    params: object  # greedy(reply)
    new: int
    rounds: int
    link: float  # measured Host-to-Device bytes/s (0.0: unknown)
    profile_dir: Path | None

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(FIRST_ID, self.vocab) for _ in range(n)]

    def send(self, llm, prompt: list[int]):
        out = llm.generate([{"prompt_token_ids": prompt}], self.params)[0]
        if out.error:
            raise RuntimeError(f"bench resume: request failed: {out.error}")
        return out

    def run(self, llm, history: int) -> list[dict]:
        """One row per round; the last round profiled when there is a profile directory."""
        self.send(llm, self.tokens(64))  # warm-up: first passes, allocator
        conv = self.tokens(history)
        first = self.send(llm, conv)
        conv += first.token_ids
        rows = []
        for r in range(self.rounds):
            conv += self.tokens(self.new)
            llm.settle()  # the last turn is on the Host, as after a user's think time
            cold = self.send(llm, self.tokens(len(conv)))
            llm.settle()  # ...and so is the push: admission need not wait for its copy
            traced = self.profile_dir is not None and r == self.rounds - 1
            prof: dict = {}
            with profiled(f"resume_{history}", prof, self.profile_dir if traced else None):
                hot = self.send(llm, conv)
            conv += hot.token_ids
            row = self.row(history, r, cold, hot, traced)
            if traced:
                row["overlap"] = restore_overlap(Path(prof["profile"]["trace"]))
            rows.append(row)
        return rows

    def row(self, history: int, r: int, cold, hot, traced: bool) -> dict:
        """The cached turn `hot` against the push `cold` of the same length."""
        restore_s, nbytes, link = hot.metrics.restore_s, hot.usage.restored_host_bytes, self.link
        return {
            "history_tokens": history,
            "round": r,
            "prompt_tokens": hot.usage.prompt_tokens,
            "cached_tokens": hot.usage.cached_tokens,
            "ttft_cold_s": cold.metrics.ttft_s,
            "ttft_cached_s": hot.metrics.ttft_s,
            "speedup": cold.metrics.ttft_s / hot.metrics.ttft_s,
            "restored_host_bytes": nbytes,
            "restore_s": restore_s,
            "restore_bytes_per_s": nbytes / restore_s if restore_s else None,
            "link_bytes_per_s": link,
            "restore_of_link": nbytes / restore_s / link if restore_s and link else None,
            "profiled": traced,
        }


def restore_overlap(trace: Path) -> dict:
    """From a Chrome trace: the restore stream (the stream that received the most Host-to-Device
    bytes), its copies' bytes, busy time and window, and the compute kernels (other streams)
    that overlapped that window. Empty without GPU events (a CPU trace)."""
    events = json.loads(trace.read_text()).get("traceEvents", [])
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")]
    h2d = [e for e in gpu if e["cat"] == "gpu_memcpy" and "HtoD" in e.get("name", "")]
    if not h2d:
        return {}
    per_stream: dict = defaultdict(int)
    for e in h2d:
        per_stream[e.get("args", {}).get("stream")] += e.get("args", {}).get("bytes", 0)
    stream = max(per_stream, key=per_stream.get)
    copies = [e for e in h2d if e.get("args", {}).get("stream") == stream]
    t0 = min(e["ts"] for e in copies)
    t1 = max(e["ts"] + e["dur"] for e in copies)
    busy = sum(e["dur"] for e in copies)
    kernels = [e for e in gpu if e["cat"] == "kernel" and e.get("args", {}).get("stream") != stream]
    inside = [k for k in kernels if k["ts"] < t1 and k["ts"] + k["dur"] > t0]
    overlap_us = sum(min(t1, k["ts"] + k["dur"]) - max(t0, k["ts"]) for k in inside)
    after = [k for k in kernels if k["ts"] >= t0]
    window_s = (t1 - t0) / 1e6
    return {
        "trace": str(trace),
        "copies": len(copies),
        "bytes": per_stream[stream],
        "window_ms": window_s * 1e3,
        "busy_ms": busy / 1e3,
        "bytes_per_s": per_stream[stream] / window_s if window_s else None,
        "kernels_during_restore": len(inside),
        "kernel_ms_during_restore": overlap_us / 1e3,
        "first_kernel_after_start_ms": (min(k["ts"] for k in after) - t0) / 1e3 if after else None,
        "compute_end_after_restore_ms": (max(k["ts"] + k["dur"] for k in after) - t1) / 1e3
        if after
        else None,
    }
