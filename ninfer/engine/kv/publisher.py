"""Block commit, taps, publication and terminal settlement of a lane (design §7.4–§7.7, §9.3).

Tap realization against chunk boundaries (s = chunk start, e = chunk end, n = prompt length):

    exact tap p        the scheduler cut the chunk at p, so e == p: capture at e; in a chunk
                       that snapshots inside its pass, s < p < e: at p, in the pass (the
                       partial block's tail page is copied after the pass)
    flexible tap p     s < p < e in a chunk that snapshots inside its pass (`Slice.in_pass`):
                       at p, in the pass (the GDN layers write the state there into the slot
                       reserved here: `forward.StateTap`), one snapshot per position; in the
                       prompt's last page (p > n - 64): at the scheduler's `tail_at` in the
                       pass, or at s, before the chunk runs
                       otherwise s < p <= e < n: capture at e (a page boundary, no split);
                       s < p <= e == n (final chunk): capture at s, before the chunk runs
    prompt end n       after the pass that reaches n: capture at n (PROMPT_END; no split)
    output boundary f  between decode steps, at f = computed when the reply reaches a boundary
                       the chat template names (after `</think>`, before `<tool_call>`): OUTPUT
    capture            D2D copy lane slot -> a staging snapshot slot; a non-aligned frontier also
                       copies its partial block into a cache-owned tail page
    publication        deferred until blocks 0 .. f//64 - 1 (and f//64 for a tap's tail) are
                       committed; a finishing lane publishes what is left from its own last
                       page (§7.4)

Endpoint (finish, or cancel after prefilling something): F_end = computed; the lane's slot
itself becomes the snapshot image (slot ownership swap, no copy) and its partial last page
moves to the snapshot as the tail.

    positions  0      64*committed_blocks   F_end = computed   len(tokens)
               |-- committed blocks --|-- tail --|-- last sampled token (not computed)

The Publisher writes only the lanes it is handed and the cache's records through the index's
calls; it admits nothing and never grows a lane's pages (`PageBudget.grow`, the loop's call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ninfer.cache.common import SnapshotKind
from ninfer.cache.keys import pack_tokens
from ninfer.cache.records import CommitKind
from ninfer.engine.kv.counters import EngineCounters
from ninfer.engine.kv.lane import KVLane, PendingTap
from ninfer.engine.kv.pages import PageBudget
from ninfer.memory.kv_pool import KVPool
from ninfer.memory.state_pool import StatePool
from ninfer.memory.transfer import Transfer
from ninfer.page import PAGE_SIZE

if TYPE_CHECKING:
    from ninfer.cache.index import PrefixIndex


class Publisher:
    """Block commit, taps, publication and release of lanes (engine thread only). `index` is
    None when prefix reuse is off: then only `release` does anything (pages, reservation and
    state slot go back)."""

    def __init__(
        self,
        index: PrefixIndex | None,
        kv: KVPool,
        states: StatePool,
        budget: PageBudget,
        transfer: Transfer,
        counters: EngineCounters,
    ) -> None:
        self.index = index
        self.kv = kv
        self.states = states
        self.budget = budget
        self.transfer = transfer
        self.counters = counters

    def before_chunk(
        self, lane: KVLane, start: int, end: int, in_pass: bool = False, tail_at: int | None = None
    ) -> list[tuple[int, int]]:
        """Taps strictly inside the chunk, with `in_pass`: the (position, physical slot) pairs
        the pass writes the state into (a tap whose slot or tail page is not granted is
        skipped): exact taps at their positions (the scheduler cut the chunk at any it could
        not take so), flexible ones too, those in the prompt's last page at `tail_at`, or at
        the chunk's start. Without `in_pass`, the flexible taps of the prompt's final chunk are
        taken at its start."""
        if self.index is None or not lane.taps:
            return []
        n = lane.prompt_len
        if in_pass:
            inside = [(p, exact) for p, exact in lane.taps if start < p < end]
            lane.taps = [t for t in lane.taps if t not in inside]
            flexible = [p for p, exact in inside if not exact]
            at = {p for p in flexible if p <= n - PAGE_SIZE}
            if len(at) < len(flexible):  # the prompt's last page: a snapshot far enough below
                if tail_at is not None:
                    at.add(tail_at)
                elif start > lane.cached_tokens:
                    self._capture(lane, start, SnapshotKind.TAP)
            exact = {p for p, is_exact in inside if is_exact}
            reserve = self._reserve_in_pass
            got = [(p, reserve(lane, start, p, p in exact)) for p in sorted(at | exact)]
            return [(p, phys) for p, phys in got if phys is not None]
        if end != n:
            return []
        inside = [(p, exact) for p, exact in lane.taps if start < p <= end and not exact]
        if not inside:
            return []
        lane.taps = [t for t in lane.taps if t not in inside]
        if start > lane.cached_tokens:
            self._capture(lane, start, SnapshotKind.TAP)
        return []

    def _reserve_in_pass(self, lane: KVLane, start: int, f: int, exact: bool) -> int | None:
        """A pending tap at f whose image the next pass writes (no copy here): a page boundary,
        or an exact tap anywhere inside, whose partial block `after_advance` copies into the
        tail page taken here."""
        if not (start < f < lane.prompt_len and (exact or f % PAGE_SIZE == 0)):
            raise ValueError(f"in-pass tap at {f}: not a page boundary inside ({start}, n)")
        if f <= lane.last_snapshot:
            return None
        boundary = exact and f in lane.boundary_taps
        kind = SnapshotKind.BOUNDARY if boundary else SnapshotKind.TAP
        granted = self._grant(lane, f, kind)
        if granted is None:
            return None
        slot, tail = granted
        lane.pending.append(PendingTap(f, slot, kind, tail, tail_due=tail is not None))
        lane.last_snapshot = f
        return self.states.snap_phys[slot]

    def _grant(self, lane: KVLane, f: int, kind: int) -> tuple[int, int | None] | None:
        """A staging snapshot slot for frontier f and, off a page boundary, a page for its
        partial block: (slot, page or None), or None when either is refused (a refused page
        gives the slot back: the tap is skipped, `taps_skipped_no_page`)."""
        grant = self.index.allocate_snapshot_slot(lane.lane_id, f, kind)
        if grant is None:
            return None
        self.kv.free(grant.freed_pages)
        if not f % PAGE_SIZE:
            return grant.slot, None
        got = self.budget.take(1) if self.budget.headroom() >= 1 else None
        if got is None:
            self.index.free_snapshot_slot(lane.lane_id, grant.slot)
            self.counters.taps_skipped_no_page += 1
            return None
        return grant.slot, got[0]

    def _fill_tails(self, lane: KVLane) -> None:
        """The tail pages of in-pass taps off a page boundary that the last pass reached: the
        block's first f % 64 entries, queued after the pass that wrote them."""
        for tap in lane.pending:
            if tap.tail_due and tap.frontier <= lane.computed:
                f = tap.frontier
                self.kv.copy_prefix(lane.pages[f // PAGE_SIZE], tap.tail_page, f % PAGE_SIZE)
                tap.tail_due = False

    def after_advance(self, lane: KVLane) -> None:
        """After a pass moved `lane.computed`: commit full blocks, realize taps, publish."""
        if self.index is None:
            return
        self._fill_tails(lane)
        self._commit_blocks(lane)
        f = lane.computed
        if lane.taps and f <= lane.prompt_len:
            due = [(p, exact) for p, exact in lane.taps if p <= f]
            if due:
                lane.taps = [t for t in lane.taps if t not in due]
                if f < lane.prompt_len or any(exact and p == f for p, exact in due):
                    boundary = any(p in lane.boundary_taps for p, _ in due)
                    self._capture(lane, f, SnapshotKind.BOUNDARY if boundary else SnapshotKind.TAP)
        if f == lane.prompt_len and self._prompt_end_pays(lane):
            self._capture(lane, f, SnapshotKind.PROMPT_END)
        if f >= lane.prompt_len and self._output_boundary_pays(lane):
            self._capture(lane, f, SnapshotKind.OUTPUT)
        self._publish_ready(lane)

    def _prompt_end_pays(self, lane: KVLane) -> bool:
        """The prompt's end, reached by this pass: a later prompt that extends it without the
        reply resumes there. Not where a snapshot exists (a retry), and not within a block past
        a chat's generation opener: a chat that drops the reply diverges at the opener, which
        is tapped."""
        if lane.prompt_len <= lane.last_snapshot:
            return False
        opener = lane.request.hints.opener
        if opener is not None and lane.prompt_len - opener < PAGE_SIZE:
            return False
        f = lane.prompt_len
        return not self.index.has_snapshot(lane.lane_id, f, lane.tokens[f - f % PAGE_SIZE : f])

    def _output_boundary_pays(self, lane: KVLane) -> bool:
        """An output boundary at f = computed (§7.7): the token just computed is one the chat
        template re-renders the reply after (`</think>`: f is right after it), or the token
        just sampled one it re-renders before (`<tool_call>`: f is right before it; a step run
        ahead has computed that token already, so f is right after it). The next turn's history
        may diverge there, past every snapshot of the prompt. Only a block or more past the
        lane's deepest snapshot (nearer, that one serves nearly as well), and not where the
        cache holds a snapshot of the same tokens (a regenerated reply)."""
        hints, tokens, f = lane.request.hints, lane.tokens, lane.computed
        if not (hints.output_after or hints.output_before) or f - lane.last_snapshot < PAGE_SIZE:
            return False
        last = tokens[f - 1] if f > lane.prompt_len else None  # generated and computed
        sampled = tokens[f] if len(tokens) > f else None  # sampled, not computed yet
        after = (*hints.output_after, *hints.output_before)
        if last not in after and sampled not in hints.output_before:
            return False
        return not self.index.has_snapshot(lane.lane_id, f, tokens[f - f % PAGE_SIZE : f])

    def _commit_blocks(self, lane: KVLane) -> None:
        index = self.index
        while (lane.committed_blocks + 1) * PAGE_SIZE <= lane.computed:
            b = lane.committed_blocks
            data = pack_tokens(lane.tokens[b * PAGE_SIZE : (b + 1) * PAGE_SIZE])
            result = index.commit_block(lane.lane_id, b, data, lane.pages[b], _extra(lane, b))
            if result.kind != CommitKind.DUPLICATE:
                lane.private[b] = False  # the node owns the page from now on
            if result.kind == CommitKind.INSERTED and (b + 1) * PAGE_SIZE <= lane.prompt_len:
                lane.request.usage.created_prompt_tokens += PAGE_SIZE
            lane.committed_blocks += 1

    def _capture(self, lane: KVLane, f: int, kind: int) -> None:
        """Stage a snapshot of the lane's state at frontier f (= lane.computed now)."""
        if f <= lane.last_snapshot:
            return
        granted = self._grant(lane, f, kind)
        if granted is None:
            return
        slot, tail = granted
        if tail is not None:
            self.kv.copy_prefix(lane.pages[f // PAGE_SIZE], tail, f % PAGE_SIZE)
        self.states.tap(lane.slot, slot)
        lane.pending.append(PendingTap(f, slot, kind, tail))
        lane.last_snapshot = f

    @staticmethod
    def _publishable(lane: KVLane, tap: PendingTap) -> bool:
        """A tap waits for its anchor blocks and the block holding its tail (§7.4); a prompt
        end or an output boundary, whose tail tokens the lane knows, only for its anchor
        blocks."""
        blocks = tap.frontier // PAGE_SIZE
        if tap.frontier % PAGE_SIZE and not SnapshotKind(tap.kind).tail_known:
            blocks += 1
        return lane.committed_blocks >= blocks and not tap.tail_due

    def _publish(
        self,
        lane: KVLane,
        f: int,
        slot: int,
        kind: int,
        tail: int | None,
        finishing: bool = False,
    ):
        """Publish a staged snapshot; returns True when the index took the tail page."""
        r = f % PAGE_SIZE
        tail_tokens = lane.tokens[f - r : f] if r else ()
        result = self.index.publish_snapshot(
            lane.lane_id,
            f,
            slot,
            kind,
            tail_tokens=tail_tokens,
            tail_page=tail,
            finishing=finishing,
        )
        self.kv.free(result.freed_pages)
        if result.write is not None:
            self.transfer.write_snapshot(result.write, self.states.snap_phys[slot])
        return not result.duplicate

    def _publish_ready(self, lane: KVLane) -> None:
        keep: list[PendingTap] = []
        for tap in lane.pending:
            if not self._publishable(lane, tap):
                keep.append(tap)
                continue
            taken = self._publish(lane, tap.frontier, tap.snap_slot, tap.kind, tap.tail_page)
            if tap.tail_page is not None and not taken:
                self.kv.free([tap.tail_page])
        lane.pending = keep

    def _publish_finishing(self, lane: KVLane) -> None:
        """§7.4: a finishing lane publishes its pending taps from its own last page. A tap whose
        tail block never filled (a short reply ended inside it) has its tail tokens and tail page
        already; only its anchor blocks must be committed, as for an endpoint."""
        keep: list[PendingTap] = []
        for tap in lane.pending:
            anchored = lane.committed_blocks >= tap.frontier // PAGE_SIZE
            if not anchored or lane.computed < tap.frontier or tap.tail_due:
                keep.append(tap)
                continue
            taken = self._publish(
                lane, tap.frontier, tap.snap_slot, tap.kind, tap.tail_page, finishing=True
            )
            if tap.tail_page is not None and not taken:
                self.kv.free([tap.tail_page])
        lane.pending = keep

    def _drop_pending(self, lane: KVLane) -> None:
        self.counters.taps_dropped += len(lane.pending)
        for tap in lane.pending:
            self.index.free_snapshot_slot(lane.lane_id, tap.snap_slot)
            if tap.tail_page is not None:
                self.kv.free([tap.tail_page])
        lane.pending = []

    def _endpoint(self, lane: KVLane, suspend: bool = False) -> None:
        f = lane.computed
        # Measured against the deepest *published* snapshot on the path (a dropped tap is none).
        # A suspended lane resumes here whatever the gap: from an earlier snapshot it would
        # recompute its generated tokens by prefill instead of continuing the decoded state.
        worth = suspend and f > lane.last_snapshot
        if not worth and not self.index.endpoint_worthwhile(lane.lane_id, f):
            return
        if lane.request.finish_reason == "abort" and f <= lane.cached_tokens:
            return  # cancelled before any committed unit
        grant = self.index.allocate_snapshot_slot(lane.lane_id, f, SnapshotKind.ENDPOINT)
        if grant is None:
            return
        self.kv.free(grant.freed_pages)
        # The lane's image becomes the snapshot's (no copy); the lane leaves with the old slot.
        lane.slot = self.states.adopt_endpoint(lane.slot, grant.slot)
        b, r = divmod(f, PAGE_SIZE)
        tail = lane.pages[b] if r else None
        if tail is not None:
            lane.private[b] = False
        taken = self._publish(lane, f, grant.slot, SnapshotKind.ENDPOINT, tail)
        if tail is not None and not taken:
            lane.private[b] = True
        lane.last_snapshot = f

    def release(self, lane: KVLane, suspend: bool = False) -> None:
        """Terminal settlement (§7.7): endpoint snapshot, path release with write-through, free the
        lane's private pages, its reservation and its state slot. `suspend`: the lane will resume
        from its endpoint (§9.5), which is then published even less than 64 tokens past the
        lane's previous snapshot."""
        index = self.index
        if lane.restore_ticket is not None:  # released before its first pass: the slot and pages
            lane.restore_ticket.wait_all()  # may still be restore destinations (§6.5)
            lane.restore_ticket = None
        if index is not None:
            self._publish_ready(lane)
            if lane.request.finish_reason != "error":
                self._publish_finishing(lane)
            self._drop_pending(lane)
            if lane.request.finish_reason != "error":
                self._endpoint(lane, suspend)
            result = index.release(lane.lane_id)
            self.kv.free(result.freed_pages)
            if result.write is not None:
                self.transfer.write_blocks(result.write)
        self.kv.free(lane.private_pages())
        lane.pages, lane.private = [], []
        self.budget.unreserve(lane)
        self.states.release(lane.slot)


def _extra(lane: KVLane, b: int) -> int:
    """Block b's media key (`cache.keys.media_block_extras`): 0 past the prompt's keyed blocks
    (a later block inherits the images' identity through its parent)."""
    blocks = lane.request.blocks
    if blocks is None or b >= len(blocks.extras):
        return 0
    return blocks.extras[b]
