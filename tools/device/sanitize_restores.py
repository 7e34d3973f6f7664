"""A short concurrent run with Host restores, for `compute-sanitizer --tool memcheck` on CUDA.

8 requests at once over the small CUDA test model (tests/engine/engine_helpers.CUDA_TINY shapes,
random bf16 weights): a first round, other conversations that push its prefixes off the Device
(write-through to the Host tier), then the follow-ups of the first round, restored from the Host
on the restore stream while other lanes decode, with random cancellations; one injected
raising restore copy part-way through a batch (engine/faults.py rolls it back). Prints one JSON
line and exits 0 when every request ended as expected.

    source tools/device/env.sh
    compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \\
        python3 tools/device/sanitize_restores.py [--no-graphs]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "engine"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    args = ap.parse_args()
    from engine_helpers import CUDA_TINY, rand_tokens

    from ninfer.llm import LLM
    from ninfer.models.presets import build_random_model
    from ninfer.request import SamplingParams

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = build_random_model(CUDA_TINY, dtype, args.device, seed=5)
    llm = LLM.from_model(
        model, device=args.device, max_concurrency=8, kv_capacity=40 * 64, host_cache_mib=64,
        device_snapshot_slots=4, prefill_chunk=128, cuda_graphs=not args.no_graphs,
        compile=False, check_invariants=True,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    rng = random.Random(1)
    inner = llm.engine.kv_state.transfer.inner
    real_views, real_restore = inner._views, inner.restore
    state = {"in": False, "n": 0, "injected": 0}

    def restore(*a, **k):
        state["in"] = True
        try:
            return real_restore(*a, **k)
        finally:
            state["in"] = False

    def views(c):
        if state["in"] and not state["injected"]:
            state["n"] += 1
            if state["n"] == 3:
                state["injected"] = 1
                raise RuntimeError("injected restore fault")
        return real_views(c)

    inner.restore, inner._views = restore, views
    reasons: dict[str, int] = {}
    for _ in range(args.rounds):
        prompts = [rand_tokens(rng, rng.randrange(60, 300)) for _ in range(8)]
        first = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        for _ in range(10):
            llm.generate([{"prompt_token_ids": rand_tokens(rng, 300)}], params)
        follow = [p + o.token_ids + [5, 6] for p, o in zip(prompts, first, strict=True)]
        streams = [llm.stream({"prompt_token_ids": p}, params) for p in follow]
        for i, s in enumerate(streams):
            if i % 3 == 2:
                s.close()  # cancelled: some before admission, some mid-restore
        for s in streams:
            for event in s:
                if hasattr(event, "finish_reason"):
                    reasons[event.finish_reason] = reasons.get(event.finish_reason, 0) + 1
    llm.settle()
    stats = llm.cache_stats()
    llm.close()
    if args.device == "cuda":
        torch.cuda.synchronize()
    ok = "error" not in reasons and stats.restores > 0
    print(json.dumps({"reasons": reasons, "restores": stats.restores, "host_faults":
                      stats.host_faults, "injected": state["injected"], "ok": ok}))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
