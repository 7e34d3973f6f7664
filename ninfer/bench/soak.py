"""Soak: thousands of requests through one LLM, with random cancellations, Host tier on
(`run_soak`; a CI-sized run is `tests/engine/test_soak.py`). From the command line (exit 1 on any
failure):

    python -m ninfer.bench.soak                                  # CPU, demo model, 2000 requests
    python -m ninfer.bench.soak --device cuda --requests 20000   # the H200
    python -m ninfer.bench.soak --model /path/to/checkpoint --device cuda

Clients (threads) submit batches of requests that share a few long prefixes (so the prefix cache,
its Host tier, restores and evictions all work); a canceller thread cancels random live
requests (`LLM.cancel`), some before admission, some mid-decode. Every `check_every` steps the
engine checks the cache's invariants and the memory partition on its own thread. Every
`report_every` seconds a line: requests done, finish reasons, RSS, Device memory allocated,
pinned Host memory (the caching host allocator's, plus the Host tier's fixed slabs).

Checked at the end (`SoakReport.failures`): every request got exactly one final output ("stop",
"length" or "abort"; never "error"); repeats of a greedy request that ran to completion gave the
same tokens; the engine is idle with nothing pinned, reserved or leaked; memory is flat (RSS and
Device memory at the end within `max_growth_mib` of their value after the first quarter).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from ninfer.cli.main import add_engine_flags, engine_kwargs


@dataclass(slots=True)
class SoakReport:
    requests: int = 0
    outputs: int = 0
    reasons: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    mismatches: int = 0
    cancels_sent: int = 0
    invariant_checks: int = 0
    tolerated: Counter = field(default_factory=Counter)  # known invariant breaks seen
    steps: int = 0
    samples: list[dict] = field(default_factory=list)  # memory over time
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures


def rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_sample(llm) -> dict:
    cuda = llm.engine_config.memory.device.startswith("cuda")
    sample = {"t": time.perf_counter(), "rss": rss_bytes(), "device": 0, "pinned": 0}
    if cuda:
        sample["device"] = torch.cuda.memory_allocated()
        stats = getattr(torch.cuda, "host_memory_stats", None)
        if stats is not None:
            host = stats()
            sample["pinned"] = int(host.get("allocated_bytes.current", host.get("allocated", 0)))
    return sample


def _mib(n: int) -> str:
    return f"{n / 2**20:9.1f}"


def _workload(rng: random.Random, vocab: int, roots: list[list[int]], max_tokens: int):
    from ninfer.request import SamplingParams

    root = rng.choice(roots)
    cut = rng.randrange(len(root) // 2, len(root) + 1)
    prompt = root[:cut] + [rng.randrange(4, vocab - 4) for _ in range(rng.randrange(1, 40))]
    n = rng.randrange(1, max_tokens + 1)
    if rng.random() < 0.5:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    else:
        params = SamplingParams(max_tokens=n, temperature=0.8, top_p=0.9, seed=rng.randrange(99))
    return prompt, params


def run_soak(
    llm,
    requests: int = 2000,
    clients: int = 4,
    batch: int = 6,
    cancel_rate: float = 0.1,  # chance, every ~10 ms, to cancel one random live request
    check_every: int = 50,
    report_every: float = 5.0,
    max_tokens: int = 24,
    prefix_tokens: int = 600,
    seed: int = 0,
    max_growth_mib: float = 64.0,
    out=sys.stdout,
    tolerate: tuple[str, ...] = (),
) -> SoakReport:
    """Run the soak on `llm` (any LLM; a Host tier makes it meaningful). Returns the report;
    `report.failures` lists what went wrong (empty: passed). `tolerate`: invariant messages
    (substrings) of known, open bugs: counted in `report.tolerated` instead of failing the run;
    a stale GDSF value is then recomputed so that the other invariants stay checked."""
    vocab = llm.model_config.vocab_size
    rng = random.Random(seed)
    roots = [[rng.randrange(4, vocab - 4) for _ in range(prefix_tokens)] for _ in range(6)]
    soak = _Soak(llm, roots, batch, cancel_rate, max_tokens, seed, check_every, tolerate, out)
    soak.run(requests, clients, report_every)
    _final_checks(llm, soak.report, requests, max_growth_mib)
    return soak.report


class _Soak:
    """The threads of one soak (clients, canceller, memory sampler, the engine's step hook) and
    the state they share; the report's counters change only under `lock`, except the ones a
    single thread owns (`cancels_sent`: the canceller; `invariant_checks`, `tolerated`: the
    engine thread; `samples`: the sampler while the clients run)."""

    def __init__(
        self,
        llm,
        roots: list[list[int]],
        batch: int,
        cancel_rate: float,
        max_tokens: int,
        seed: int,
        check_every: int,
        tolerate: tuple[str, ...],
        out,
    ) -> None:
        self.llm = llm
        self.vocab = llm.model_config.vocab_size
        self.roots = roots  # the shared prefixes every prompt starts from
        self.batch = batch
        self.cancel_rate = cancel_rate
        self.max_tokens = max_tokens
        self.seed = seed
        self.out = out
        self.check_every = check_every
        self.tolerate = tolerate
        self.report = SoakReport()
        self.lock = threading.Lock()
        self.greedy_seen: dict[tuple, list[int]] = {}  # (prompt, max_tokens) -> first tokens
        self.done = threading.Event()  # the clients finished: the helper threads stop
        self.t0 = 0.0

    def run(self, requests: int, clients: int, report_every: float) -> None:
        """Split `requests` over `clients` threads, run them with the canceller and the
        sampler, and record the closing memory sample, the time and the step count."""
        engine = self.llm.engine  # the inspection seam: its step hook and step count
        engine.on_step = self.check
        per_client = [requests // clients + (i < requests % clients) for i in range(clients)]
        self.t0 = time.perf_counter()
        self.report.samples.append(memory_sample(self.llm))
        threads = [threading.Thread(target=self.client, args=a) for a in enumerate(per_client)]
        helpers = [
            threading.Thread(target=self.canceller),
            threading.Thread(target=self.sampler, args=(report_every, requests)),
        ]
        for t in threads + helpers:
            t.daemon = True
            t.start()
        for t in threads:
            t.join()
        self.done.set()
        for t in helpers:
            t.join()
        engine.on_step = None
        self.report.samples.append(memory_sample(self.llm))
        self.report.seconds = time.perf_counter() - self.t0
        self.report.steps = engine.steps

    def check(self, eng) -> None:
        """The step hook, on the engine thread at the start of a step: every `check_every`
        steps the cache's invariants and the memory partition; a tolerated message is counted
        and its stale GDSF values recomputed, then everything is checked again."""
        if eng.steps % self.check_every != 0:
            return
        try:
            eng.check_invariants()
        except AssertionError as e:
            known = [t for t in self.tolerate if t in str(e)]
            if not known:
                raise
            self.report.tolerated[known[0]] += 1
            eng.check_invariants(revalue=True)
        self.report.invariant_checks += 1

    def client(self, i: int, n: int) -> None:
        """Submit `n` requests in batches of 1..`batch` (one `generate` each) and record their
        outputs; the first repeat of a greedy request that ran to `length` must match."""
        report = self.report
        crng = random.Random(self.seed * 1000 + i)
        while n > 0 and not report.failures:
            k = min(n, crng.randrange(1, self.batch + 1))
            n -= k
            work = [_workload(crng, self.vocab, self.roots, self.max_tokens) for _ in range(k)]
            with self.lock:
                report.requests += k
            try:
                outs = self.llm.generate([w[0] for w in work], [w[1] for w in work])
            except Exception as e:  # noqa: BLE001 - recorded as a failure
                with self.lock:
                    report.failures.append(f"generate raised {e!r}")
                return
            with self.lock:
                report.outputs += len(outs)
                for (prompt, params), out in zip(work, outs, strict=True):
                    report.reasons[out.finish_reason] += 1
                    if out.finish_reason == "error":
                        report.errors.append(out.error or "")
                    if params.temperature == 0.0 and out.finish_reason == "length":
                        key = (tuple(prompt), params.max_tokens)
                        seen = self.greedy_seen.setdefault(key, out.token_ids)
                        if seen != out.token_ids:
                            report.mismatches += 1

    def canceller(self) -> None:
        llm = self.llm
        crng = random.Random(self.seed + 77)
        while not self.done.is_set():
            time.sleep(crng.uniform(0.0, 0.02))
            live = llm.live_request_ids()
            if live and crng.random() < self.cancel_rate and llm.cancel(crng.choice(live)):
                self.report.cancels_sent += 1

    def sampler(self, report_every: float, requests: int) -> None:
        while not self.done.wait(report_every):
            s = memory_sample(self.llm)
            self.report.samples.append(s)
            with self.lock:
                n, r = self.report.outputs, dict(self.report.reasons)
            print(
                f"[soak] {s['t'] - self.t0:7.1f} s  outputs {n:6d}/{requests}  {r}  RSS"
                f" {_mib(s['rss'])} MiB  Device {_mib(s['device'])} MiB  pinned"
                f" {_mib(s['pinned'])} MiB",
                file=self.out,
                flush=True,
            )


def _final_checks(llm, report: SoakReport, requests: int, max_growth_mib: float) -> None:
    fail = report.failures
    if report.outputs != requests:
        fail.append(f"lost requests: {requests} submitted, {report.outputs} answered")
    if report.errors:
        fail.append(f"{len(report.errors)} error outputs, first: {report.errors[0]}")
    if report.mismatches:
        fail.append(f"{report.mismatches} greedy repeats gave different tokens")
    if not report.reasons.get("abort") and report.cancels_sent:
        fail.append("cancellations were sent but no request ended abort")
    try:
        llm.settle()
        llm.check_idle()
    except AssertionError as e:
        fail.append(f"not idle at the end: {e or 'invariant broken'}")
    samples = report.samples
    if len(samples) >= 3:
        base = samples[max(1, len(samples) // 4)]
        last = samples[-1]
        for key in ("rss", "device", "pinned"):
            grew = (last[key] - base[key]) / 2**20
            if grew > max_growth_mib:
                fail.append(f"{key} grew {grew:.1f} MiB after the first quarter")


def _args(argv: list[str] | None) -> argparse.Namespace:
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
    return ap.parse_args(argv)


def _summary(report: SoakReport, stats) -> dict:
    """The report and the cache's counters as plain data (memory samples in MiB, seconds from
    the first sample)."""
    return {
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


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from ninfer.llm import LLM

    engine = engine_kwargs(args)
    with LLM(**engine) as llm:
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
    summary = _summary(report, stats)
    print(json.dumps({k: v for k, v in summary.items() if k != "memory_mib"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print("soak:", "PASSED" if report.ok else "FAILED")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
