"""Cached = cold: a seeded random mix of requests through one LLM with its prefix cache, every
request then run again cold and compared (`run_cached_cold`; a CI-sized run is
`tests/engine/test_cached_cold_fuzz.py`). From the command line, per seed, with every mismatch
(near-tie or suspect) printed with its figures; exit 1 on an error output, a logprob drift beyond
--noise or a suspect mismatch:

    python -m ninfer.bench.cached_cold --seeds 0 1 2 --rounds 10         # CPU, demo model
    python -m ninfer.bench.cached_cold --device cuda --noise 0.1 --tie 0.1   # bf16: wider
                                                    # (race gaps assume the CPU generator)

Each round submits a batch of requests at once (`LLM.submit`, `LLM.stream`): prompts cut from a
few shared roots plus a random tail, exact repeats and continuations (an earlier prompt, its
reply and a new tail) of earlier rounds' requests, some with cache breakpoints; chat
conversations over two long system prompts (new, repeated, or extended by a reply and a user
turn; rendered with the model's template, so its tap hints apply), when the model has a chat
template; random sampling
settings (greedy or seeded sampling with temperature, top-p, top-k, min-p; stop ids; EOS on or
off); some cancelled after a random number of stream deltas, or at once, or after a random
delay (queued, mid-prefill, mid-decode), some streams closed early. The cache persists across
rounds, so later rounds resume from what earlier ones cached.

The cold run is every request again, on a second LLM built with `prefix_reuse=False` (nothing is
cached, every prompt is computed in full). A request that completed must give the cold run's
tokens; one that was cancelled or closed early, a prefix of them. Every request asks for
logprobs (which changes no token), so a difference is measured where it starts (`Mismatch`):

    drift     the largest |cached - cold| logprob over the tokens both runs list, at every
              position up to and including the first differing one: fp32 noise when the cached
              run computed what the cold one did (other chunk bounds, other batch neighbours);
              a cache bug (a wrong restored state, a stale page) shows as a large drift
    cold_gap  the cold run's top-2 logprob margin there (greedy: a near-tie when it is small)
    race_gap  for a seeded sampled request, the margin of the draw between the two tokens:
              the draw is argmax(log p - log E) with E ~ Exp(1) from the request's generator
              (`ninfer.sampling`), so the margin is (lp_a - lp_b) / T - (log E_a - log E_b),
              E reproduced from the seed; a near-tie when it is small

Two checks follow (`Tolerance`, fp32 figures by default; a bf16 run needs wider ones):

  * every compared position's drift is within `noise`, mismatch or not (a drift beyond it is
    an error of the report: the cached run computed something else, whatever it sampled);
  * `classify` names each mismatch "near-tie" when the drift up to it is within `noise` and
    the decision that flipped had a margin within `tie` (greedy: the cold run's top-2 gap;
    seeded sampling: the race gap; a top-p / top-k / min-p request also when the race was not
    close: with equal logits to within the noise, the two runs then disagree only on the cut,
    whose threshold moved with that noise, a margin the listed logprobs cannot show), else
    "suspect" (a cache bug until shown otherwise).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import torch

from ninfer.cli.main import add_engine_flags, engine_kwargs
from ninfer.request import RequestOutput, SamplingParams, StreamDelta

LOGPROBS = 20  # top-k logprobs every request asks for (the most there are)
_WORDS = (  # chat text: each word a few tokens of the demo vocabulary
    "the", "cache", "keeps", "every", "prefix", "a", "request", "computed", "so", "that",
    "next", "one", "with", "same", "start", "resumes", "there", "instead", "of", "at", "root",
    "and", "only", "rest", "is", "prefilled", "again", "on", "device",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Tolerance:
    """fp32: other chunk bounds and batch neighbours move a logprob by a few 1e-6."""

    noise: float = 1e-4  # |cached - cold| logprob drift that rounding explains
    tie: float = 1e-4  # a decision margin (logprob units) that such a drift can flip


FP32 = Tolerance()


@dataclass(slots=True)
class FuzzRequest:
    round: int
    index: int
    prompt: list[int]
    breakpoints: list[int]
    params: SamplingParams
    mode: str  # "complete", "cancel" (LLM.cancel) or "close" (a stream closed early)
    stop_after: int  # deltas received before the cancel or the close
    cancel_delay_s: float = 0.0  # a cancel with stop_after 0: this long after the submission
    messages: list[dict] | None = None  # a conversation (`prompt` is its rendering)


@dataclass(slots=True)
class Outcome:
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None  # None: a closed stream (deltas carry none)
    finish_reason: str | None
    cached_tokens: int = 0


@dataclass(slots=True)
class Mismatch:
    request: FuzzRequest
    finish_reason: str | None
    cached_tokens: int
    position: int  # first differing token position in the reply
    cached_token: int | None  # None: the run ended there
    cold_token: int | None
    drift: float | None  # None: no cached logprobs (a closed stream)
    cold_gap: float | None
    race_gap: float | None  # sampled requests only
    kind: str = ""

    def describe(self) -> str:
        r, p = self.request, self.request.params
        sampling = "greedy" if p.greedy else (
            f"T={p.temperature} top_p={p.top_p} top_k={p.top_k} min_p={p.min_p} seed={p.seed}"
        )  # fmt: skip
        return (
            f"{self.kind}: round {r.round} request {r.index} ({r.mode}, {self.finish_reason}, "
            f"prompt {len(r.prompt)} tokens, cached {self.cached_tokens}, {sampling}, "
            f"max_tokens {p.max_tokens}) differs at reply position {self.position}: cached "
            f"{self.cached_token} cold {self.cold_token}; drift {_fmt(self.drift)}, cold top-2 "
            f"gap {_fmt(self.cold_gap)}, race gap {_fmt(self.race_gap)}"
        )


@dataclass(slots=True)
class FuzzReport:
    requests: int = 0
    compared: dict[str, int] = field(default_factory=dict)  # finish reason -> requests
    positions: int = 0  # reply positions compared with logprobs on both sides
    max_drift: float = 0.0  # over every compared position (the noise floor actually seen)
    mismatches: list[Mismatch] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def suspects(self) -> list[Mismatch]:
        return [m for m in self.mismatches if m.kind != "near-tie"]

    @property
    def ok(self) -> bool:
        return not self.errors and not self.suspects


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


class _Workload:
    """Seeded requests over shared roots; remembers earlier prompts and replies for repeats
    and continuations."""

    def __init__(self, rng: random.Random, vocab: int, roots: int, root_tokens: int, max_tokens,
                 chat=None):  # fmt: skip
        self.rng = rng
        self.chat = chat  # messages -> the rendered prompt (None: no conversations)
        self.vocab = vocab
        self.max_tokens = max_tokens
        self.roots = [self.tokens(root_tokens) for _ in range(roots)]
        self.seen: list[list[int]] = []  # earlier prompts, and prompts + replies
        self.chats: list[list[dict]] = []  # earlier conversations
        self.systems = [self.text(120) for _ in range(2)]

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(4, self.vocab - 60) for _ in range(n)]

    def text(self, words: int) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(words))

    def conversation(self) -> list[dict]:
        """A chat over one of two long system prompts: new, a repeat, or an earlier one with
        a reply and a new user turn."""
        rng = self.rng
        x = rng.random()
        if self.chats and x < 0.2:
            return list(rng.choice(self.chats))
        if self.chats and x < 0.5:
            return rng.choice(self.chats) + [
                {"role": "assistant", "content": self.text(rng.randrange(1, 30))},
                {"role": "user", "content": self.text(rng.randrange(1, 30))},
            ]
        system = {"role": "system", "content": rng.choice(self.systems)}
        return [system, {"role": "user", "content": self.text(rng.randrange(1, 60))}]

    def prompt(self) -> list[int]:
        rng = self.rng
        x = rng.random()
        if self.seen and x < 0.2:
            return list(rng.choice(self.seen))
        if self.seen and x < 0.4:
            return rng.choice(self.seen) + self.tokens(rng.randrange(1, 40))
        root = rng.choice(self.roots)
        return root[: rng.randrange(1, len(root) + 1)] + self.tokens(rng.randrange(0, 80))

    def params(self) -> SamplingParams:
        rng = self.rng
        kw: dict = dict(
            max_tokens=rng.randrange(1, self.max_tokens + 1),
            ignore_eos=rng.random() < 0.7,
            logprobs=LOGPROBS,
        )
        if rng.random() < 0.2:
            kw["stop_token_ids"] = self.tokens(3)
        if rng.random() < 0.5:
            return SamplingParams(temperature=0.0, **kw)
        return SamplingParams(
            temperature=rng.choice([0.5, 0.8, 1.0, 1.3]),
            top_p=rng.choice([1.0, 1.0, 0.9, 0.6]),
            top_k=rng.choice([-1, -1, 5, 50]),
            min_p=rng.choice([0.0, 0.0, 0.05]),
            seed=rng.randrange(2**32),
            **kw,
        )

    def remember(self, req: FuzzRequest, reply: list[int]) -> None:
        """Keep a completed request's prompt, prompt + reply and conversation for later rounds."""
        self.seen.append(req.prompt)
        self.seen.append(req.prompt + reply)
        if req.messages:
            self.chats.append(req.messages)

    def request(self, rnd: int, index: int) -> FuzzRequest:
        rng = self.rng
        messages = self.conversation() if self.chat and rng.random() < 0.25 else None
        prompt = self.chat(messages).token_ids if messages else self.prompt() or self.tokens(1)
        breakpoints: list[int] = []
        if not messages and rng.random() < 0.2:
            k = rng.randrange(1, 4)
            breakpoints = sorted({rng.randrange(1, len(prompt) + 1) for _ in range(k)})
        params = self.params()
        x = rng.random()
        mode = "complete" if x < 0.6 else ("cancel" if x < 0.85 else "close")
        stop_after = rng.randrange(0, params.max_tokens + 1) if mode != "complete" else 0
        delay = rng.uniform(0.0, 0.3) if rng.random() < 0.5 else 0.0
        return FuzzRequest(
            rnd, index, prompt, breakpoints, params, mode, stop_after, delay, messages
        )


def _renderer(llm):
    """messages -> the rendered prompt, or None when the model has no chat template."""
    try:
        llm.render_chat([{"role": "user", "content": "hi"}])
    except ValueError:
        return None
    return lambda messages: llm.render_chat(messages).prompt


def _prompt_input(req: FuzzRequest) -> dict:
    form = {"prompt_token_ids": req.prompt}
    if req.breakpoints:
        form["cache_breakpoints"] = req.breakpoints
    return form


def _run_round(llm, reqs: list[FuzzRequest], timeout_s: float) -> list[Outcome]:
    """Submit every request of a round at once; cancels and closes happen from the callbacks
    and the stream threads. Returns each request's outcome, in order."""
    round_ = _Round(llm, len(reqs))
    for i, req in enumerate(reqs):
        if req.mode == "close":
            t = threading.Thread(target=round_.close_early, args=(i, req), daemon=True)
            round_.threads.append(t)
            t.start()
        else:
            round_.submit(i, req)
    return round_.wait(timeout_s)


class _Round:
    """A round's requests in flight: each sets its outcome once and releases `done`."""

    def __init__(self, llm, n: int) -> None:
        self.llm = llm
        self.outcomes: list[Outcome | None] = [None] * n
        self.done = threading.Semaphore(0)
        self.threads: list[threading.Thread] = []  # stream readers and cancel timers

    def _finish(self, i: int, outcome: Outcome) -> None:
        self.outcomes[i] = outcome
        self.done.release()

    def submit(self, i: int, req: FuzzRequest) -> None:
        """Through `LLM.submit`; a "cancel" request is cancelled after `stop_after` deltas, or
        at once (or after `cancel_delay_s`) when that is 0."""
        llm, seen, box = self.llm, [0], []

        def on_event(event) -> None:
            if isinstance(event, StreamDelta):
                seen[0] += 1
                if req.mode == "cancel" and seen[0] == req.stop_after:
                    llm.cancel(box[0])
                return
            self._finish(i, _outcome(event))

        prompt = llm.render_chat(req.messages).prompt if req.messages else None
        prompt = prompt or llm.render_prompt(_prompt_input(req))
        rid = llm.submit(prompt, req.params, on_event=on_event)
        box.append(rid)
        if req.mode == "cancel" and req.stop_after == 0:
            if req.cancel_delay_s:  # at a moment the deltas do not mark: mid-prefill, queued
                timer = threading.Timer(req.cancel_delay_s, llm.cancel, (rid,))
                timer.daemon = True
                timer.start()
                self.threads.append(timer)
            else:
                llm.cancel(rid)

    def close_early(self, i: int, req: FuzzRequest) -> None:
        """Through `LLM.stream`, closed after `stop_after` deltas (a stream thread)."""
        got: list[int] = []
        final = None
        stream = self.llm.stream(req.messages or _prompt_input(req), req.params)
        for deltas, event in enumerate(stream, 1):
            if isinstance(event, RequestOutput):
                final = event
                break
            got += event.token_ids
            if deltas >= req.stop_after:
                break
        stream.close()
        self._finish(i, _outcome(final) if final else Outcome(got, None, "closed"))

    def wait(self, timeout_s: float) -> list[Outcome]:
        deadline = time.monotonic() + timeout_s
        for _ in self.outcomes:
            if not self.done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise TimeoutError("a round's requests did not all finish in time")
        for t in self.threads:
            t.join()
        return self.outcomes  # type: ignore[return-value]


def _outcome(out: RequestOutput) -> Outcome:
    return Outcome(out.token_ids, out.logprobs, out.finish_reason, out.usage.cached_tokens)


def _run_cold(cold_llm, reqs: list[FuzzRequest]) -> list[Outcome]:
    outs = cold_llm.generate([_prompt_input(r) for r in reqs], [r.params for r in reqs])
    return [_outcome(o) for o in outs]


def _drift(a: dict[int, float], b: dict[int, float]) -> float:
    common = a.keys() & b.keys()
    return max((abs(a[t] - b[t]) for t in common), default=0.0)


def _top2_gap(lp: dict[int, float]) -> float | None:
    top = sorted(lp.values(), reverse=True)
    return top[0] - top[1] if len(top) >= 2 else None


def race_gap(params: SamplingParams, step: int, vocab: int, a: tuple[int, float],
             b: tuple[int, float]) -> float:  # fmt: skip
    """The margin by which token a (logprob lp_a) beat token b in the seeded draw of reply
    position `step`: (lp_a - lp_b) / T - (log E_a - log E_b), with E the Exp(1) noise that
    `ninfer.sampling` draws from the request's generator at that step (one [vocab] fp32 draw per
    sampled step). The CPU generator's stream: a CUDA run's draws come from another one."""
    from ninfer.sampling import make_generator

    gen = make_generator(params.seed, "cpu")
    noise = torch.empty(vocab, dtype=torch.float32)
    for _ in range(step + 1):
        noise.exponential_(generator=gen)
    tiny = torch.finfo(torch.float32).tiny
    log_e = [math.log(max(float(noise[t]), tiny)) for t in (a[0], b[0])]
    return (a[1] - b[1]) / params.temperature - (log_e[0] - log_e[1])


def compare(req: FuzzRequest, hot: Outcome, cold: Outcome, vocab: int, report: FuzzReport,
            tol: Tolerance = FP32) -> Mismatch | None:  # fmt: skip
    """Check one request's cached outcome against its cold run (recording the drift seen, an
    error when it exceeds `tol.noise`); the first difference as a `Mismatch`, or None."""
    complete = hot.finish_reason in ("stop", "length")
    n, n_cold = len(hot.token_ids), len(cold.token_ids)
    pos = next((i for i in range(min(n, n_cold)) if hot.token_ids[i] != cold.token_ids[i]), None)
    if pos is None and (n > n_cold or (complete and n != n_cold)):
        pos = min(n, n_cold)  # the same tokens, but one run stopped where the other went on
    upto = n if pos is None else min(pos + 1, n)
    drift = None
    if hot.logprobs is not None and cold.logprobs is not None:
        k = min(upto, len(cold.logprobs))
        drifts = [_drift(hot.logprobs[i], cold.logprobs[i]) for i in range(k)]
        report.positions += k
        drift = max(drifts, default=0.0)
        report.max_drift = max(report.max_drift, drift)
        if drift > tol.noise:
            at = next(i for i, d in enumerate(drifts) if d > tol.noise)
            report.errors.append(
                f"round {req.round} request {req.index} ({req.mode}, cached "
                f"{hot.cached_tokens} of {len(req.prompt)}): logprobs {drift:.2e} off the cold "
                f"run's from reply position {at}"
            )
    if pos is None:
        return None
    hot_t = hot.token_ids[pos] if pos < n else None
    cold_t = cold.token_ids[pos] if pos < n_cold else None
    cold_lp = cold.logprobs[pos] if cold.logprobs and pos < len(cold.logprobs) else None
    hot_lp = hot.logprobs[pos] if hot.logprobs and pos < len(hot.logprobs) else None
    gap = _top2_gap(cold_lp) if cold_lp else None
    race = None
    if not req.params.greedy and hot_t is not None and cold_t is not None and cold_lp:
        lp_b = (hot_lp or {}).get(hot_t, cold_lp.get(hot_t))
        if lp_b is not None:
            race = race_gap(req.params, pos, vocab, (cold_t, cold_lp[cold_t]), (hot_t, lp_b))
    m = Mismatch(req, hot.finish_reason, hot.cached_tokens, pos, hot_t, cold_t, drift, gap, race)
    m.kind = classify(m, tol)
    return m


def classify(m: Mismatch, tol: Tolerance = FP32) -> str:
    """'near-tie' or 'suspect' (module docstring): the logprobs agree within `tol.noise` up to
    the differing position, and the decision there had a margin within `tol.tie` (greedy: the
    cold run's top-2 gap; sampled: the race gap, or a cut of the filters when the race itself
    was not close)."""
    if m.cached_token is None or m.cold_token is None:
        return "suspect"  # a run that stopped where the other went on, on the same tokens
    if m.drift is not None and m.drift > tol.noise:
        return "suspect"
    p = m.request.params
    if p.greedy:
        return "near-tie" if m.cold_gap is not None and m.cold_gap <= tol.tie else "suspect"
    if m.race_gap is not None and abs(m.race_gap) <= tol.tie:
        return "near-tie"
    filtered = p.top_p < 1.0 or p.top_k > 0 or p.min_p > 0.0
    return "near-tie" if filtered and m.drift is not None else "suspect"


def run_cached_cold(
    llm,
    cold_llm,
    rounds: int = 10,
    per_round: int = 40,
    seed: int = 0,
    roots: int = 4,
    root_tokens: int = 300,
    max_tokens: int = 16,
    round_timeout_s: float = 600.0,
    tol: Tolerance = FP32,
    out=sys.stdout,
) -> FuzzReport:
    """Run the fuzz: `rounds` rounds of `per_round` requests on `llm` (its prefix cache on;
    a Host tier and a small Device pool make evictions and restores part of it), each request
    then run on `cold_llm` (`prefix_reuse=False`, the same model). Returns the report;
    `report.ok` is False on an error output, a drift beyond `tol.noise` or a mismatch that is
    not a near-tie."""
    vocab = llm.model_config.vocab_size
    work = _Workload(random.Random(seed), vocab, roots, root_tokens, max_tokens, _renderer(llm))
    report = FuzzReport()
    t0 = time.perf_counter()
    for rnd in range(rounds):
        reqs = [work.request(rnd, i) for i in range(per_round)]
        hot = _run_round(llm, reqs, round_timeout_s)
        cold = _run_cold(cold_llm, reqs)
        for req, h, c in zip(reqs, hot, cold, strict=True):
            m = _tally(report, rnd, req, h, c, vocab, tol)
            if m is not None:
                print(f"[cached=cold] seed {seed} {m.describe()}", file=out, flush=True)
            if h.finish_reason in ("stop", "length") and c.finish_reason != "error":
                work.remember(req, h.token_ids)
        line = _round_line(seed, rnd, rounds, report, time.perf_counter() - t0)
        print(line, file=out, flush=True)
    report.seconds = time.perf_counter() - t0
    return report


def _tally(report: FuzzReport, rnd: int, req: FuzzRequest, hot: Outcome, cold: Outcome,
           vocab: int, tol: Tolerance) -> Mismatch | None:  # fmt: skip
    """Count one request's outcomes into `report`; returns its mismatch (recorded too) or None."""
    report.requests += 1
    if hot.finish_reason == "error" or cold.finish_reason == "error":
        report.errors.append(f"round {rnd} request {req.index}: an error output")
        return None
    report.compared[hot.finish_reason] = report.compared.get(hot.finish_reason, 0) + 1
    m = compare(req, hot, cold, vocab, report, tol)
    if m is not None:
        report.mismatches.append(m)
    return m


def _round_line(seed: int, rnd: int, rounds: int, report: FuzzReport, seconds: float) -> str:
    """The progress line after round `rnd`: the report's figures so far."""
    return (
        f"[cached=cold] seed {seed} round {rnd + 1}/{rounds}: {report.requests} requests, "
        f"{len(report.mismatches)} mismatches, max drift {report.max_drift:.2e}, "
        f"{seconds:.1f} s"
    )


def _args(argv: list[str] | None) -> argparse.Namespace:
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
    return ap.parse_args(argv)


def _seed_line(seed: int, report: FuzzReport, stats) -> str:
    return (
        f"seed {seed}: {report.requests} requests {report.compared}, {report.positions} "
        f"positions compared, max drift {report.max_drift:.2e}, {len(report.mismatches)} "
        f"mismatches ({len(report.suspects)} suspect), {len(report.errors)} errors, "
        f"{report.seconds:.0f} s; cache: hits {stats.hits_device} Device {stats.hits_host} "
        f"Host {stats.hits_root} none, {stats.reuse_tokens} tokens reused, "
        f"{stats.suspensions} suspensions, {stats.snapshots_published} snapshots published"
    )


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from ninfer.llm import LLM

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
        print(_seed_line(seed, report, stats))
        ok = ok and report.ok
        found += [{"seed": seed, **asdict(m)} for m in report.mismatches]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)
    print("cached = cold:", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
