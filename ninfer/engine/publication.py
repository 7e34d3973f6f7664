"""Block commit, taps, publication and terminal settlement of a lane (spec §7.4–§7.7, §9.3).

Tap realization against chunk boundaries (s = chunk start, e = chunk end, n = prompt length):

    exact tap p        the scheduler cut the chunk at p, so e == p: capture at e
    flexible tap p     s < p <= e < n: capture at e (a page boundary, no split)
                       s < p <= e == n (final chunk): capture at s, before the chunk runs,
                       or at the scheduler's `tap_at` inside it (the pass's GDN layers copy
                       the state there: `forward.GdnSplit`; the slot is reserved here)
    capture            D2D copy lane slot -> a staging snapshot slot; a non-aligned frontier also
                       copies its partial block into a cache-owned tail page
    publication        deferred until blocks 0 .. f//64 - 1 (and f//64 for a tail) are committed;
                       a finishing lane publishes what is left from its own last page (§7.4)

Endpoint (finish, or cancel after prefilling something): F_end = computed; the lane's slot
itself becomes the snapshot image (slot ownership swap, no copy) and its partial last page
moves to the snapshot as the tail.

    positions  0      64*committed_blocks   F_end = computed   len(tokens)
               |-- committed blocks --|-- tail --|-- last sampled token (not computed)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ninfer.cache.common import SnapshotKind
from ninfer.cache.keys import pack_tokens
from ninfer.cache.records import CommitKind
from ninfer.engine.lane import Lane, PendingTap
from ninfer.forward import PAGE_SIZE

if TYPE_CHECKING:
    from ninfer.engine.cache_bridge import CacheBridge


def before_chunk(
    bridge: CacheBridge, lane: Lane, start: int, end: int, tap_at: int | None = None
) -> int | None:
    """Flexible taps inside the prompt's final chunk are taken at its start, or at `tap_at`
    inside the pass: then returns the physical slot the pass copies the state into (None when
    no snapshot slot is free: the tap is skipped)."""
    if end != lane.prompt_len or not lane.taps:
        return None
    inside = [(p, exact) for p, exact in lane.taps if start < p <= end and not exact]
    if not inside:
        return None
    lane.taps = [t for t in lane.taps if t not in inside]
    if tap_at is not None:
        return _reserve_in_pass(bridge, lane, start, tap_at)
    if start > lane.cached_tokens:
        _capture(bridge, lane, start, SnapshotKind.TAP)
    return None


def _reserve_in_pass(bridge: CacheBridge, lane: Lane, start: int, f: int) -> int | None:
    """A pending tap at page boundary f whose image the next pass writes (no copy here)."""
    if not (start < f < lane.prompt_len and f % PAGE_SIZE == 0):
        raise ValueError(f"in-pass tap at {f}: not a page boundary inside ({start}, n)")
    if f <= lane.last_snapshot:
        return None
    grant = bridge.index.allocate_snapshot_slot(lane.lane_id, f, SnapshotKind.TAP)
    if grant is None:
        return None
    bridge.kv.free(grant.freed_pages)
    lane.pending.append(PendingTap(f, grant.slot, SnapshotKind.TAP))
    lane.last_snapshot = f
    return bridge.states.snap_phys[grant.slot]


def after_advance(bridge: CacheBridge, lane: Lane) -> None:
    """After a pass moved `lane.computed`: commit full blocks, realize taps, publish."""
    _commit_blocks(bridge, lane)
    f = lane.computed
    if lane.taps and f <= lane.prompt_len:
        due = [(p, exact) for p, exact in lane.taps if p <= f]
        if due:
            lane.taps = [t for t in lane.taps if t not in due]
            if f < lane.prompt_len or any(exact and p == f for p, exact in due):
                boundary = any(p in lane.boundary_taps for p, _ in due)
                _capture(bridge, lane, f, SnapshotKind.BOUNDARY if boundary else SnapshotKind.TAP)
    _publish_ready(bridge, lane)


def _commit_blocks(bridge: CacheBridge, lane: Lane) -> None:
    index = bridge.index
    while (lane.committed_blocks + 1) * PAGE_SIZE <= lane.computed:
        b = lane.committed_blocks
        data = pack_tokens(lane.tokens[b * PAGE_SIZE : (b + 1) * PAGE_SIZE])
        result = index.commit_block(lane.lane_id, b, data, lane.pages[b])
        if result.kind != CommitKind.DUPLICATE:
            lane.private[b] = False  # the node owns the page from now on
        if result.kind == CommitKind.INSERTED and (b + 1) * PAGE_SIZE <= lane.prompt_len:
            lane.created_prompt_tokens += PAGE_SIZE
        lane.committed_blocks += 1


def _capture(bridge: CacheBridge, lane: Lane, f: int, kind: int) -> None:
    """Stage a snapshot of the lane's state at frontier f (= lane.computed now)."""
    if f <= lane.last_snapshot:
        return
    grant = bridge.index.allocate_snapshot_slot(lane.lane_id, f, kind)
    if grant is None:
        return
    bridge.kv.free(grant.freed_pages)
    tail = None
    if f % PAGE_SIZE:
        got = bridge.budget.take(1) if bridge.budget.headroom() >= 1 else None
        if got is None:
            bridge.index.free_snapshot_slot(lane.lane_id, grant.slot)
            bridge.counters.taps_skipped_no_page += 1
            return
        tail = got[0]
        bridge.kv.copy_prefix(lane.pages[f // PAGE_SIZE], tail, f % PAGE_SIZE)
    bridge.states.tap(lane.slot, grant.slot)
    lane.pending.append(PendingTap(f, grant.slot, kind, tail))
    lane.last_snapshot = f


def _publishable(lane: Lane, tap: PendingTap) -> bool:
    blocks = tap.frontier // PAGE_SIZE + (1 if tap.frontier % PAGE_SIZE else 0)
    return lane.committed_blocks >= blocks


def _publish(
    bridge: CacheBridge,
    lane: Lane,
    f: int,
    slot: int,
    kind: int,
    tail: int | None,
    finishing: bool = False,
):
    """Publish a staged snapshot; returns True when the index took the tail page."""
    r = f % PAGE_SIZE
    tail_tokens = lane.tokens[f - r : f] if r else ()
    result = bridge.index.publish_snapshot(
        lane.lane_id, f, slot, kind, tail_tokens=tail_tokens, tail_page=tail, finishing=finishing
    )
    bridge.kv.free(result.freed_pages)
    if result.write is not None:
        bridge.transfer.write_snapshot(result.write, bridge.states.snap_phys[slot])
    return not result.duplicate


def _publish_ready(bridge: CacheBridge, lane: Lane) -> None:
    keep: list[PendingTap] = []
    for tap in lane.pending:
        if not _publishable(lane, tap):
            keep.append(tap)
            continue
        taken = _publish(bridge, lane, tap.frontier, tap.snap_slot, tap.kind, tap.tail_page)
        if tap.tail_page is not None and not taken:
            bridge.kv.free([tap.tail_page])
    lane.pending = keep


def _publish_finishing(bridge: CacheBridge, lane: Lane) -> None:
    """§7.4: a finishing lane publishes its pending taps from its own last page. A tap whose
    tail block never filled (a short reply ended inside it) has its tail tokens and tail page
    already; only its anchor blocks must be committed, as for an endpoint."""
    keep: list[PendingTap] = []
    for tap in lane.pending:
        if lane.committed_blocks < tap.frontier // PAGE_SIZE or lane.computed < tap.frontier:
            keep.append(tap)
            continue
        taken = _publish(
            bridge, lane, tap.frontier, tap.snap_slot, tap.kind, tap.tail_page, finishing=True
        )
        if tap.tail_page is not None and not taken:
            bridge.kv.free([tap.tail_page])
    lane.pending = keep


def _drop_pending(bridge: CacheBridge, lane: Lane) -> None:
    bridge.counters.taps_dropped += len(lane.pending)
    for tap in lane.pending:
        bridge.index.free_snapshot_slot(lane.lane_id, tap.snap_slot)
        if tap.tail_page is not None:
            bridge.kv.free([tap.tail_page])
    lane.pending = []


def _endpoint(bridge: CacheBridge, lane: Lane, suspend: bool = False) -> None:
    f = lane.computed
    # Measured against the deepest *published* snapshot on the path (a dropped tap is none).
    # A suspended lane resumes here whatever the gap: from an earlier snapshot it would
    # recompute its generated tokens by prefill instead of continuing the decoded state.
    worth = suspend and f > lane.last_snapshot
    if not worth and not bridge.index.endpoint_worthwhile(lane.lane_id, f):
        return
    if lane.finish_reason == "abort" and f <= lane.cached_tokens:
        return  # cancelled before any committed unit
    grant = bridge.index.allocate_snapshot_slot(lane.lane_id, f, SnapshotKind.ENDPOINT)
    if grant is None:
        return
    bridge.kv.free(grant.freed_pages)
    # The lane's image becomes the snapshot's (no copy); the lane leaves with the old slot.
    lane.slot = bridge.states.adopt_endpoint(lane.slot, grant.slot)
    b, r = divmod(f, PAGE_SIZE)
    tail = lane.pages[b] if r else None
    if tail is not None:
        lane.private[b] = False
    taken = _publish(bridge, lane, f, grant.slot, SnapshotKind.ENDPOINT, tail)
    if tail is not None and not taken:
        lane.private[b] = True
    lane.last_snapshot = f


def release(bridge: CacheBridge, lane: Lane, suspend: bool = False) -> None:
    """Terminal settlement (§7.7): endpoint snapshot, path release with write-through, free the
    lane's private pages, its reservation and its state slot. `suspend`: the lane will resume
    from its endpoint (§9.5), which is then published even less than 64 tokens past the
    lane's previous snapshot."""
    index = bridge.index
    if lane.restore_ticket is not None:  # released before its first pass: the slot and pages
        lane.restore_ticket.wait_all()  # may still be restore destinations (§6.5)
        lane.restore_ticket = None
    if index is not None:
        _publish_ready(bridge, lane)
        if lane.finish_reason != "error":
            _publish_finishing(bridge, lane)
        _drop_pending(bridge, lane)
        if lane.finish_reason != "error":
            _endpoint(bridge, lane, suspend)
        result = index.release(lane.lane_id)
        bridge.kv.free(result.freed_pages)
        if result.write is not None:
            bridge.transfer.write_blocks(result.write)
    bridge.kv.free(lane.private_pages())
    lane.pages, lane.private = [], []
    bridge.budget.unreserve(lane)
    bridge.states.release(lane.slot)
