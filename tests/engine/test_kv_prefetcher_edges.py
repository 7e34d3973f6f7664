"""The Prefetcher's batches (spec §6.6, ninfer/engine/kv/prefetcher.py): how many blocks one
batch copies (the index's plan, at most 256 and at most the spare room), one batch in flight
until it lands, the batches counted, no batch for an infeasible head or an empty plan, and,
through the engine, a prefetch whose Host copy raises rolled back without touching any state
slot; no batch and no restore ticket before the first one is issued. The unit tests use
stand-in parts that record what the Prefetcher asks of them."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest
from engine_helpers import assert_idle, greedy, rand_tokens, run

from ninfer.cache.records import Readiness
from ninfer.engine.kv.prefetcher import Prefetcher


class _Index:
    """Host-only path candidates; `plan_prefetch` takes up to `max_blocks` of them (the real
    index's default is 256)."""

    def __init__(self, candidates: int, room: int, readiness=Readiness.READY):
        self.host = object()
        self.lanes = {}
        self.room = room
        self.candidates = list(range(100, 100 + candidates))
        self.readiness = readiness
        self.evicted = [7, 8]
        self.plans: list[int] = []
        self.quotes = 0
        self.begun: list[tuple[list[int], list[int]]] = []
        self._ids = itertools.count(1)

    def prefetch_room(self) -> int:
        return self.room

    def quote(self, blocks, params):
        self.quotes += 1
        return SimpleNamespace(readiness=self.readiness, blocks=blocks)

    def plan_prefetch(self, quote, free_pages: int, max_blocks: int = 256):
        nodes = self.candidates[:max_blocks]
        self.plans.append(len(nodes))
        return SimpleNamespace(evicted_pages=self.evicted, nodes=nodes)

    def begin_prefetch(self, nodes, pages):
        self.begun.append((list(nodes), list(pages)))
        return SimpleNamespace(batch_id=next(self._ids))


class _Ticket:
    def __init__(self):
        self.synced = 0

    def synchronize(self):
        self.synced += 1


class _Transfer:
    def __init__(self):
        self.restores: list[tuple[int, _Ticket]] = []

    def restore(self, batch, lane_slot):
        ticket = _Ticket()
        self.restores.append((batch.batch_id, ticket))
        return ticket


class _Pool:
    def __init__(self):
        self.num_free = 0
        self.freed: list[int] = []
        self._next = itertools.count(0)

    def free(self, pages):
        self.freed.extend(pages)

    def alloc(self, n):
        return [next(self._next) for _ in range(n)]


def _prefetcher(index: _Index, headroom: int = 10_000):
    budget = SimpleNamespace(headroom=lambda: headroom, quote=lambda job: "params")
    pool, transfer = _Pool(), _Transfer()
    return Prefetcher(index, pool, budget, transfer), pool, transfer


def _head(rid: str):
    return SimpleNamespace(request_id=rid, blocks=("blocks", rid))


@pytest.mark.parametrize(("room", "copied"), [(5, 5), (255, 255), (256, 256), (1000, 256)])
def test_a_batch_copies_at_most_256_blocks_and_at_most_the_spare_room(room, copied):
    index = _Index(candidates=300, room=room)
    pf, pool, transfer = _prefetcher(index)
    assert pf.maybe_prefetch(_head("a")) == copied
    assert index.plans == [copied]
    assert index.begun == [(list(range(100, 100 + copied)), list(range(copied)))]
    assert pool.freed == [7, 8]  # the plan's evictions go back to the free list
    assert pf.batch_id == 1 and pf.batches == 1
    assert [b for b, _ in transfer.restores] == [1]


@pytest.mark.parametrize(
    ("headroom", "free", "backed", "room"),
    [(0, 5, 5, 0), (-3, 5, 5, 0), (9, 0, 0, 0), (9, 2, 3, 5), (4, 2, 3, 4), (1, 0, 7, 1)],
)
def test_spare_room_is_headroom_capped_by_free_and_host_backed_pages(headroom, free, backed, room):
    index = _Index(candidates=300, room=backed)
    pf, pool, _ = _prefetcher(index, headroom)
    pool.num_free = free
    assert pf.spare_room() == room
    # no room: not even a quote; any room: a batch of exactly that many blocks
    assert pf.maybe_prefetch(_head("a")) == room
    assert index.quotes == (1 if room else 0) and index.plans == ([room] if room else [])


def test_no_prefetch_without_a_host_tier_or_for_an_unkeyed_head():
    index = _Index(candidates=3, room=50)
    pf, _, transfer = _prefetcher(index)
    assert pf.maybe_prefetch(SimpleNamespace(request_id="a", blocks=None)) == 0
    index.host = None
    assert not pf.enabled()
    assert pf.maybe_prefetch(_head("b")) == 0
    assert index.quotes == 0 and transfer.restores == [] and pf.batches == 0


def test_one_batch_in_flight_until_it_lands_and_batches_are_counted():
    index = _Index(candidates=3, room=50)
    pf, pool, transfer = _prefetcher(index)
    assert not pf.settle()  # nothing in flight
    assert pf.maybe_prefetch(_head("a")) == 3
    assert pf.batch_id == 1
    assert pf.maybe_prefetch(_head("b")) == 0  # no second batch beside the first
    assert len(index.begun) == 1
    assert pf.settle()  # the next admission quote waits for it
    first_ticket = transfer.restores[0][1]
    assert first_ticket.synced == 1
    pf.landed(99)  # another restore batch landing changes nothing
    assert pf.batch_id == 1 and pf.ticket is first_ticket
    pf.landed(1)
    assert pf.batch_id is None and pf.ticket is None and not pf.settle()
    assert pf.maybe_prefetch(_head("b")) == 3
    assert pf.batch_id == 2 and pf.batches == 2
    assert pf.ticket is transfer.restores[1][1]


def test_no_batch_for_an_empty_plan():
    index = _Index(candidates=0, room=50)
    pf, pool, transfer = _prefetcher(index)
    assert pf.maybe_prefetch(_head("a")) == 0
    assert pool.freed == [7, 8]  # evictions the plan made are returned even so
    assert index.begun == [] and transfer.restores == []
    assert pf.batch_id is None and pf.batches == 0
    # nothing was copied and the room did not grow: the same head is not matched again
    assert pf.maybe_prefetch(_head("a")) == 0 and index.plans == [0]


def test_no_plan_for_a_permanently_infeasible_head():
    index = _Index(candidates=3, room=50, readiness=Readiness.PERMANENTLY_INFEASIBLE)
    pf, pool, transfer = _prefetcher(index)
    assert pf.maybe_prefetch(_head("a")) == 0
    assert index.plans == [] and transfer.restores == [] and pf.batches == 0
    assert pf.maybe_prefetch(_head("a")) == 0 and index.plans == []  # not retried


def test_a_prefetch_whose_host_copy_raises_is_rolled_back(make_llm):
    """The blocked head's prefetch copy raises: its entries are dropped from the Host tier and
    no lane's state slot is touched; the head is served by prefill with the same tokens."""
    rng = random.Random(21)
    llm = make_llm(
        host_cache_mib=4, kv_capacity=32 * 64, max_concurrency=1, device_snapshot_slots=2
    )
    kv_state = llm.engine.kv_state
    prompt = rand_tokens(rng, 500)
    first = run(llm, prompt, 20)
    for _ in range(5):  # other conversations push its blocks, tail and image off the Device
        run(llm, rand_tokens(rng, 600), 20)
    follow = prompt + first.token_ids + rand_tokens(rng, 30)
    blocker = rand_tokens(rng, 100)
    want = [
        o.token_ids
        for o in make_llm(prefix_reuse=False).generate([blocker, follow], [greedy(40), greedy(10)])
    ]
    inner = kv_state.transfer.inner
    real, failed = inner.restore, []

    def restore(batch, lane_slot):
        if batch.tail is None and batch.image is None:  # a prefetch batch: blocks only
            failed.append(len(batch.blocks))
            raise RuntimeError("injected Host copy fault")
        return real(batch, lane_slot)

    inner.restore = restore
    outs = llm.generate([blocker, follow], [greedy(40), greedy(10)])
    inner.restore = real
    assert failed == [8]
    assert [o.token_ids for o in outs] == want
    stats = llm.cache_stats()
    assert stats.host_faults == 1 and stats.prefetches == 0
    assert outs[1].usage.cached_tokens == 0 and outs[1].usage.restored_host_bytes == 0
    assert_idle(llm)


def test_a_new_prefetcher_has_no_batch_and_no_ticket_in_flight():
    """The in-flight pair (batch id, restore ticket) is (None, None) whenever no batch is in
    flight: at construction as after a batch lands; nothing is waited for until a batch is
    issued."""
    index = _Index(candidates=2, room=50)
    pf, _, transfer = _prefetcher(index)
    assert (pf.batch_id, pf.ticket, pf.batches) == (None, None, 0)
    assert not pf.settle()
    assert pf.maybe_prefetch(_head("a")) == 2
    assert (pf.batch_id, pf.ticket) == (1, transfer.restores[0][1])
    pf.landed(1)
    assert (pf.batch_id, pf.ticket, pf.batches) == (None, None, 1)
