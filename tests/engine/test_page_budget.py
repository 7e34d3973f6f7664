"""`PageBudget.grow_entitled`: the pages a speculating lane maps ahead only to speed up (the chain
run ahead's windows, `Stepper._draft`) come from its own entitlement and the free pages, so
they never take what another lane or an admission could claim (headroom) and never evict."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ninfer.engine.kv.pages import PageBudget
from ninfer.memory.kv_pool import KVPool
from ninfer.page import PAGE_SIZE


def _budget(pages: int) -> PageBudget:
    pool = KVPool(pages, 1, 1, 8, torch.float32, torch.device("cpu"))
    return PageBudget(pool, None, 64 * PAGE_SIZE)


def _lane(budget: PageBudget, mapped: int, entitled: int) -> SimpleNamespace:
    lane = SimpleNamespace(pages=budget.pool.alloc(mapped), private=[True] * mapped,
                           entitled_pages=0)  # fmt: skip
    budget.reserve(lane, entitled)
    return lane


def test_growth_within_the_entitlement_leaves_the_headroom_as_it_was():
    budget = _budget(10)
    lane = _lane(budget, 2, 3)
    other = _lane(budget, 1, 2)
    room = budget.headroom()
    assert budget.grow_entitled(lane, 3 * PAGE_SIZE + 5)  # 4 pages: 2 more from its 3
    assert len(lane.pages) == len(lane.private) == 4 and lane.entitled_pages == 1
    assert budget.headroom() == room and other.entitled_pages == 2
    assert budget.grow_entitled(lane, 2 * PAGE_SIZE)  # covered already: nothing mapped
    assert len(lane.pages) == 4


def test_growth_past_the_entitlement_maps_nothing():
    budget = _budget(10)
    lane = _lane(budget, 2, 1)
    room, free = budget.headroom(), budget.pool.num_free
    assert not budget.grow_entitled(lane, 4 * PAGE_SIZE)  # 2 more pages, 1 entitled
    assert len(lane.pages) == 2 and lane.entitled_pages == 1
    assert budget.headroom() == room and budget.pool.num_free == free
    assert budget.grow(lane, 4 * PAGE_SIZE)  # `grow` may take headroom
    assert len(lane.pages) == 4 and budget.headroom() == room - 1
