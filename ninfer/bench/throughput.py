"""Prefill and decode throughput through the public `LLM` API, beside their bounds.

    prefill   one request of T random tokens, max_tokens=1: tokens/s and FLOP/s achieved,
              against the matmul peak (bound seconds = prefill FLOPs / peak)
    decode    B requests decoding together, against the memory bound (bound step seconds =
              decode step bytes / HBM bandwidth; tokens/s = B / that). Two figures per batch:

      steady  measured over the steps in which every lane decodes. The B requests are streamed
              (`LLM.stream`, one consumer thread each, submitted together as `generate` does);
              the engine sends one delta per step per lane, so each generated token gets the
              time its delta arrived. The window runs from the last lane's first token to the
              first lane's last token; its steps are the tokens the first-finishing lane made in
              it, its seconds the time between that lane's tokens at its ends (`decode_window`).
              The run is `decode_tokens` plus the staggered start long (lanes are admitted one
              at a time, each prefilling while the earlier ones decode; with speculation a
              lane gains up to K + 1 tokens a step of it), so the window holds about
              `decode_tokens` tokens of the first-finishing lane; under MIN_WINDOW_STEPS it
              is reported as too short instead of a number.
      e2e     end to end: B requests of `decode_tokens` through
              `generate`, tokens generated after each one's first over the longest lane's
              first-token-to-finish time, so the staggered start (other lanes prefilling while
              this one decodes) is inside it.

Prompts are random token ids, each starting with a fresh random token, so no request finds the
previous one's prefix in the cache. Warm-ups are not counted: one prefill at each prompt length
(kernels autotune per shape) and one decode request before the decode batches; prefill reports
the best of `repeats` timed calls.
"""

from __future__ import annotations

import random
import time

from ninfer.bench import speculative
from ninfer.bench.model_math import ParamCounts, decode_step_bytes, prefill_flops
from ninfer.models.config import Qwen35Config
from ninfer.page import PAGE_SIZE

FIRST_ID = 16  # stay clear of the special tokens at the bottom of every vocabulary


def random_prompts(rng: random.Random, vocab: int, n: int, tokens: int) -> list[dict]:
    return [
        {"prompt_token_ids": [rng.randrange(FIRST_ID, vocab) for _ in range(tokens)]}
        for _ in range(n)
    ]


def bench_prefill(
    llm, cfg: Qwen35Config, prompt_tokens: list[int], bounds: dict, repeats: int = 2,
    seed: int = 0,
) -> list[dict]:  # fmt: skip
    rng = random.Random(seed)
    params = greedy(1)
    rows = []
    for tokens in prompt_tokens:
        # First at this length: kernels autotune per shape (Triton), so it is not counted.
        llm.generate(random_prompts(rng, cfg.vocab_size, 1, tokens), params)
        outs = [llm.generate(random_prompts(rng, cfg.vocab_size, 1, tokens), params)[0]
                for _ in range(repeats)]  # fmt: skip
        seconds = min(o.metrics.prefill_s or o.metrics.ttft_s for o in outs)
        flops = prefill_flops(cfg, tokens)
        bound_s = flops / bounds["matmul_flops_per_s"]
        rows.append({
            "prompt_tokens": tokens,
            "seconds": seconds,
            "ttft_s": min(o.metrics.ttft_s for o in outs),
            "tokens_per_s": tokens / seconds,
            "flops": flops,
            "flops_per_s": flops / seconds,
            "bound_seconds": bound_s,
            "fraction_of_bound": bound_s / seconds,
        })  # fmt: skip
    return rows


MIN_WINDOW_STEPS = 8  # fewer all-decoding steps than this: no steady-state figure


def decode_window(token_times: list[list[float]], min_steps: int = MIN_WINDOW_STEPS) -> dict:
    """The steps in which every lane decodes, from each lane's per-token arrival times.

    `token_times[i][k]`: when lane i's k-th generated token arrived (one token per step per
    lane while it decodes). The window starts with the step that gave the last lane its first
    token and ends with the first-finishing lane's last token. That lane (`ref`) counts the
    steps: with `a` its token of the starting step and `b` its last, the window is the b - a
    steps that made its tokens a+1..b (every lane decoding in each), in t[b] - t[a] seconds.

    Deltas of one step arrive close together but not at once (the engine sends them one lane
    after the other; each consumer thread wakes on its own), so `a` is ref's first token that
    arrived at most half a typical step (ref's median token gap) before the last lane's first
    token: ref's token of that same step may arrive just before it, ref's token of the step
    before arrived a whole (prefilling, so longer) step earlier. A token that arrives later than
    that slack only moves `a` later: the window then loses steps, but never takes in one in
    which a lane was still prefilling.

    Returns {"steps", "seconds", "step_seconds" (None when steps < min_steps), "note" (why
    there is no figure, else None)}.
    """
    empty = [i for i, t in enumerate(token_times) if not t]
    if not token_times or empty:
        note = f"lane(s) {empty} produced no token" if empty else "no lanes"
        return {"steps": 0, "seconds": 0.0, "step_seconds": None, "note": note}
    start = max(t[0] for t in token_times)  # the last lane's first token
    ref = min(range(len(token_times)), key=lambda i: token_times[i][-1])  # first to finish
    times = token_times[ref]
    if start > times[-1]:  # a lane finished before the last one started decoding
        most = most_at_once(token_times)
        note = (
            f"the lanes never all decoded at once (at most {most} of {len(token_times)}): "
            "fewer fit the KV pool or max_concurrency"
        )
        return {"steps": 0, "seconds": 0.0, "step_seconds": None, "note": note}
    b = len(times) - 1
    gaps = sorted(t1 - t0 for t0, t1 in zip(times, times[1:], strict=False))
    slack = gaps[len(gaps) // 2] / 2 if gaps else 0.0
    a = next((k for k, t in enumerate(times) if t >= start - slack), b)
    steps, seconds = b - a, times[b] - times[a]
    if steps < min_steps:
        note = (
            f"all-decoding window of {steps} steps (< {min_steps}): too short to measure; "
            "raise --decode-tokens"
        )
        return {"steps": steps, "seconds": seconds, "step_seconds": None, "note": note}
    return {"steps": steps, "seconds": seconds, "step_seconds": seconds / steps, "note": None}


def most_at_once(token_times: list[list[float]]) -> int:
    """The most lanes decoding at one time: lane i from its first token to its last."""
    edges = sorted((t, kind) for ts in token_times for t, kind in ((ts[0], 0), (ts[-1], 1)))
    now = most = 0
    for _, kind in edges:  # at equal times a start counts before an end (kind 0 < 1)
        now += 1 if kind == 0 else -1
        most = max(most, now)
    return most


def stream_batch(llm, prompts: list[dict], params) -> tuple[list[list[float]], list[str]]:
    """Every prompt streamed from its own thread, all released together (one batch, admitted
    FIFO as `generate`'s is): per lane the arrival time of each generated token, and the errors
    (a stream that raised, or whose deltas do not add up to its output)."""
    import threading

    from ninfer.request import StreamDelta

    times: list[list[float]] = [[] for _ in prompts]
    errors: list[str] = []
    go = threading.Barrier(len(prompts))

    def consume(i: int) -> None:
        go.wait()
        final = None
        try:
            for event in llm.stream(prompts[i], params):
                now = time.perf_counter()
                if isinstance(event, StreamDelta):
                    times[i].extend([now] * len(event.token_ids))
                else:
                    final = event
        except Exception as e:  # the request failed: reported with the row
            errors.append(f"{type(e).__name__}: {e}")
            return
        if final is None or len(final.token_ids) != len(times[i]):
            got = "no output" if final is None else f"{len(final.token_ids)} tokens"
            errors.append(f"stream: {len(times[i])} tokens in deltas, {got} in the output")

    threads = [
        threading.Thread(target=consume, args=(i,), daemon=True) for i in range(len(prompts))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times, errors


def staggered_steps(batch: int, prompt_tokens: int, prefill_chunk: int) -> int:
    """Steps before the last of `batch` lanes has its first token, at most: one lane prefills at
    a time, in chunks, and the next is admitted on the step after (a margin of one per lane)."""
    return (batch - 1) * (-(-prompt_tokens // prefill_chunk) + 1)


def bench_decode(
    llm, cfg: Qwen35Config, counts: ParamCounts, prompt_tokens: int, decode_tokens: int,
    batch_sizes: list[int], bounds: dict, itemsize: int, kv_itemsize: int, seed: int = 0,
    draft_acceptance: float | None = None, logprobs: int | None = None,
) -> list[dict]:  # fmt: skip
    """Decode throughput per batch size. With speculation on, each row also says the draft
    acceptance and the tokens per verify step; `draft_acceptance`: each draft position accepted
    with that probability until the first rejection (`bench.speculative.controlled_acceptance`),
    so the figure does not depend on what the random weights' head proposes. `logprobs`: every
    request asks for that many (with speculation, its verify rows are then accepted on the
    host, `Speculator._checked`)."""
    rng = random.Random(seed)
    llm.generate(random_prompts(rng, cfg.vocab_size, 1, prompt_tokens), greedy(decode_tokens))
    # The copy figure is HBM traffic per second (each copied byte read and written): a decode
    # step's traffic is its bytes read (writes are negligible), so that rate is the bound.
    read_bw = bounds["copy_bytes_per_s"]
    engine = llm.engine_config
    chunk, lanes = engine.scheduling.prefill_chunk, engine.memory.max_concurrency
    # a lane decoding through the staggered start gains up to K + 1 tokens a step
    speculator = llm.engine.speculator
    per_step = 1 if speculator is None else speculator.k + 1
    rows = []
    for batch in batch_sizes:
        e2e_prompts = random_prompts(rng, cfg.vocab_size, batch, prompt_tokens)
        stagger = per_step * staggered_steps(batch, prompt_tokens, chunk)
        steady_max = decode_tokens + 1 + stagger
        prompts = random_prompts(rng, cfg.vocab_size, batch, prompt_tokens)
        if draft_acceptance is not None and llm.engine.speculator is not None:
            control = speculative.controlled_acceptance(draft_acceptance, seed)
            llm.engine.speculator.control = control
        before = speculative.snapshot(llm)
        context = prompt_tokens + steady_max // 2  # the bound at the streamed run's middle
        step_bytes = decode_step_bytes(cfg, counts, batch, context, itemsize, kv_itemsize)
        bound_tps = batch * read_bw / step_bytes
        params = (greedy(decode_tokens, logprobs), greedy(steady_max, logprobs))
        e2e, errors = _end_to_end(llm, e2e_prompts, params[0], bound_tps)
        steady, stream_errors = _steady_state(llm, prompts, params[1], lanes, bound_tps)
        rows.append({"batch": batch, "prompt_tokens": prompt_tokens, "step_bytes": step_bytes,
                     "bound_tokens_per_s": bound_tps, "bound_step_seconds": step_bytes / read_bw,
                     **steady, **e2e, "errors": errors + stream_errors})  # fmt: skip
        if before is not None:
            rows[-1].update(speculative.stats_since(llm, before))
            rows[-1]["spec_draft_acceptance"] = draft_acceptance
    return rows


def _end_to_end(llm, prompts: list[dict], params, bound_tps: float):
    """Decode through generate(), the staggered start included: the row's e2e_* figures and the
    outputs' errors."""
    max_tokens = params.max_tokens
    outs = llm.generate(prompts, params)
    seconds = max(o.metrics.decode_s for o in outs)
    tokens = sum(max(len(o.token_ids) - 1, 0) for o in outs)
    tps = tokens / seconds if seconds > 0 else 0.0
    figures = {
        "e2e_max_tokens": max_tokens,
        "e2e_decode_seconds": seconds,
        "e2e_tokens_per_s": tps,
        "e2e_fraction_of_bound": tps / bound_tps,
    }
    return figures, [o.error for o in outs if o.error]


def _steady_state(llm, prompts: list[dict], params, lanes: int, bound_tps: float):
    """Decode streamed, long enough for about `max_tokens` all-decoding steps, timed over the
    steps in which every lane decodes (`decode_window`): the row's steady_* figures and the
    streams' errors. A batch over `lanes` never decodes all at once: no figure."""
    max_tokens = params.max_tokens
    times, errors = stream_batch(llm, prompts, params)
    window = decode_window(times)
    if len(prompts) > lanes:
        note = f"batch > max_concurrency {lanes}: never all decoding"
        window.update(step_seconds=None, note=note)
    elif window["step_seconds"] is None and all(times) and most_at_once(times) < len(prompts):
        pool = llm.engine_config.memory.kv_pages * PAGE_SIZE
        need = sum(len(p["prompt_token_ids"]) + max_tokens for p in prompts)
        window["note"] += f" (the KV pool holds {pool} tokens; the batch needs {need})"
    step_s = window["step_seconds"]
    tps = len(prompts) / step_s if step_s else None
    figures = {
        "steady_max_tokens": max_tokens,
        "steady_window_steps": window["steps"],
        "steady_window_seconds": window["seconds"],
        "steady_step_seconds": step_s,
        "steady_tokens_per_s": tps,
        "steady_fraction_of_bound": tps / bound_tps if tps else None,
        "steady_note": window["note"],
    }
    return figures, errors


def greedy(max_tokens: int, logprobs: int | None = None):
    """Greedy sampling of exactly `max_tokens` tokens (EOS ignored): every bench's params;
    `logprobs`: that many top logprobs a token too."""
    from ninfer.request import SamplingParams

    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=logprobs
    )
