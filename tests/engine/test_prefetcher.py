"""Prefetching the blocked FIFO head's Host-only path (spec §6.6) through the engine."""

from __future__ import annotations

import random

from engine_helpers import assert_idle, greedy, rand_tokens, run

BUNDLE = 16384  # one block (or tail) slab of the tiny model
IMAGE = 8448  # one state image


def _scenario(make_llm, prefetch: bool):
    """A conversation whose blocks only the Host still holds comes back while a long request
    holds the only lane: its follow-up waits as the FIFO head."""
    rng = random.Random(21)
    llm = make_llm(
        host_cache_mib=4, kv_capacity=32 * 64, max_concurrency=1, device_snapshot_slots=2
    )
    kv_state = llm.engine.kv_state
    if not prefetch:
        kv_state.prefetcher.maybe_prefetch = lambda job: 0
    prompt = rand_tokens(rng, 500)
    first = run(llm, prompt, 20)
    for _ in range(5):  # other conversations push its blocks, tail and image off the Device
        run(llm, rand_tokens(rng, 600), 20)
    index = kv_state.index
    follow = prompt + first.token_ids + rand_tokens(rng, 30)
    path = llm.engine.call(lambda: index.match(_blocks(follow)).path)
    assert len(path) == 8 and all(index.node(n).device_state == 0 for n in path)
    blocker = rand_tokens(rng, 100)
    outs = llm.generate([blocker, follow], [greedy(40), greedy(10)])
    return llm, outs, follow


def _blocks(tokens):
    from ninfer.cache.keys import prepare_prompt

    return prepare_prompt(tokens)


def test_blocked_head_finds_its_path_on_the_device(make_llm):
    llm, outs, follow = _scenario(make_llm, prefetch=True)
    base, base_outs, _ = _scenario(make_llm, prefetch=False)
    out, base_out = outs[1], base_outs[1]
    assert out.usage.cached_tokens == base_out.usage.cached_tokens == 519
    # without prefetch the admission restores 8 path blocks + tail + image; with it, the path
    # was copied while the head waited behind the blocker, so only the tail and image remain
    assert base_out.usage.restored_host_bytes == 8 * BUNDLE + BUNDLE + IMAGE
    assert out.usage.restored_host_bytes == BUNDLE + IMAGE
    stats, base_stats = llm.cache_stats(), base.cache_stats()
    assert stats.prefetched_blocks == 8 and stats.prefetches == 1
    assert base_stats.prefetched_blocks == 0 and base_stats.prefetches == 0
    assert stats.hits_host == base_stats.hits_host == 1
    assert [o.token_ids for o in outs] == [o.token_ids for o in base_outs]
    assert_idle(llm)
    assert_idle(base)


class _Room:
    """Stand-in parts: only what Prefetcher reads to decide whether to try."""

    def __init__(self):
        from types import SimpleNamespace

        self.free, self.backed = 2, 3
        self.index = SimpleNamespace(host=object(), lanes={}, prefetch_room=lambda: self.backed)
        self.kv = SimpleNamespace(num_free=0)
        self.budget = SimpleNamespace(headroom=lambda: 100)

    def sync(self):
        self.kv.num_free = self.free


def test_same_head_is_retried_only_after_a_copy_or_more_room():
    from types import SimpleNamespace

    from ninfer.engine.kv.prefetcher import Prefetcher

    room = _Room()
    pf = Prefetcher(room.index, room.kv, room.budget, transfer=None)
    copies = iter([4, 0, 0, 0])
    tried = []

    def fake(job, room):
        tried.append(room)
        return next(copies)

    pf._prefetch = fake
    head = SimpleNamespace(request_id="a", blocks=object())
    room.sync()
    assert pf.maybe_prefetch(head) == 4  # first attempt: room 2 + 3
    pf.batch_id = 7  # in flight: no second batch beside it
    assert pf.maybe_prefetch(head) == 0 and tried == [5]
    pf.landed(7)
    assert pf.maybe_prefetch(head) == 0 and tried == [5, 5]  # the last attempt copied: retry
    assert pf.maybe_prefetch(head) == 0 and tried == [5, 5]  # copied nothing, same room
    room.backed = 4
    assert pf.maybe_prefetch(head) == 0 and tried == [5, 5, 6]  # the room grew
    room.index.lanes = {1: SimpleNamespace(activated=False)}  # an open admission
    other = SimpleNamespace(request_id="b", blocks=object())
    assert pf.maybe_prefetch(other) == 0 and tried == [5, 5, 6]
    room.index.lanes = {}
    assert pf.maybe_prefetch(other) == 0 and tried == [5, 5, 6, 6]  # a new head: try


def test_head_arriving_during_overlapped_decode_is_prefetched(make_llm):
    """The follow-up arrives while the only lane is in its (overlapped) decode, so every step
    until the blocker finishes is an overlapped one: the head's Host-only path is prefetched
    during those steps all the same."""
    rng = random.Random(21)
    llm = make_llm(
        host_cache_mib=4, kv_capacity=32 * 64, max_concurrency=1, device_snapshot_slots=2
    )
    prompt = rand_tokens(rng, 500)
    first = run(llm, prompt, 20)
    for _ in range(5):
        run(llm, rand_tokens(rng, 600), 20)
    follow = prompt + first.token_ids + rand_tokens(rng, 30)
    blocker = llm.stream(rand_tokens(rng, 100), greedy(60))
    for _ in range(5):  # the blocker decodes now
        next(blocker)
    (out,) = llm.generate([follow], greedy(10))
    rest = list(blocker)
    assert rest and rest[-1].finish_reason == "length"
    assert llm.engine.overlapped_steps > 20
    stats = llm.cache_stats()
    assert stats.prefetches == 1 and stats.prefetched_blocks == 8
    assert out.usage.cached_tokens == 519 and out.usage.restored_host_bytes == BUNDLE + IMAGE
    assert_idle(llm)
