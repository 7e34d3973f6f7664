"""Constants and checks shared by the server tests."""

from __future__ import annotations

import time

MODEL = "demo"
BODY_LIMIT = 1 << 20  # small, so the over-limit case is cheap to send


def engine_idle(llm, timeout_s: float = 10.0) -> None:
    """Wait until the engine has no lane and no queued job; then check every cache invariant,
    and that nothing is pinned, reserved or held by a request any more (memory at baseline)."""
    engine = llm._engine
    deadline = time.monotonic() + timeout_s
    while engine.call(lambda: len(engine.lanes) + len(engine.waiting)):
        assert time.monotonic() < deadline, "requests still run on the engine"
        time.sleep(0.02)

    def check() -> bool:
        bridge = engine.bridge
        assert bridge.budget.reserved == 0
        bridge.check_invariants([])
        assert bridge.kv.num_free + len(bridge.cached_pages()) == bridge.kv.num_pages
        assert bridge.states.num_free_active == bridge.states.active_slots
        index = bridge.index
        assert not index.lanes and not index.batches
        for node in index.tree.nodes.values():
            assert node.active_refs == 0 and node.restore_pins == 0, node
        for snap in index.snaps.values():
            assert snap.restore_pins == 0, snap
        return True

    assert engine.call(check)
    assert llm.cache_stats().pages_active == 0
