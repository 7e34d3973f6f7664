"""Constants and checks shared by the server tests."""

from __future__ import annotations

import time

from tests.engine.engine_helpers import assert_idle

MODEL = "demo"
BODY_LIMIT = 1 << 20  # small, so the over-limit case is cheap to send
# 16 MiB of Host tier is 128 demo-model slabs; a snapshot with a tail takes 5, so the tests
# of one session together publish more than it holds, and it evicts (spec §9.3).
LLM_OPTIONS = dict(
    device="cpu",
    max_model_len=2048,
    kv_capacity=16384,
    host_cache_mib=16,
    max_concurrency=8,
    prefill_chunk=256,
    check_invariants=True,
)


def engine_idle(llm, timeout_s: float = 10.0) -> None:
    """Wait until the engine has no lane and no queued job; then check every cache invariant,
    and that nothing is pinned, reserved or held by a request any more (memory at baseline)."""
    deadline = time.monotonic() + timeout_s
    while llm.engine.busy():
        assert time.monotonic() < deadline, "requests still run on the engine"
        time.sleep(0.02)

    assert_idle(llm)
    assert llm.cache_stats().pages_active == 0
