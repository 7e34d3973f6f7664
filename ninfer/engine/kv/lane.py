"""A request's hold on the KV state while it runs (`KVLane`): plain data, no tensors.

Admission (admitter.py) builds a KVLane for a `Request` (engine/request.py): a physical state
slot, a block table (`pages`) and the frontier `computed` (tokens whose KV is in the pages and
whose state is in the slot). It prefills what the request knows at admission, `prompt_len`
tokens: the prompt, or for a request resumed after a suspension (§9.5) the prompt and what it
generated before (the request's `gen_start` stays at its own prompt's end):

    tokens     |<------------- known at admission (prompt_len) ------------>|<- generated ->|
    computed   0 ........ resumed ........ F ..... prefilled .... ^ frontier
    pages      [p0][p1][p2] ...   page b holds positions [64b, 64b + 64)
    committed  blocks [0, committed_blocks) are index nodes the lane pins (0 when disabled);
               `private[b]` says the lane owns pages[b] (a growth page, the partial tail, or a
               recomputed duplicate, design §7.5), otherwise the index owns it

The lane reads its request (tokens, hints, blocks, finish_reason) and never writes it but for
the request's cache figures (`Request.usage`). Every field is the KV state's (engine/kv/) but
`computed`, which the loop moves when it launches a pass over the lane's tokens (the pass
writes their KV and state in stream order). A suspension or the request's end releases the
lane (publisher.py); nothing of it is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ninfer.engine.request import Request


@dataclass(slots=True)
class PendingTap:
    """A captured snapshot waiting for its anchoring blocks to commit (design §7.4)."""

    frontier: int
    snap_slot: int  # logical snapshot slot holding the image
    kind: int  # SnapshotKind: TAP, BOUNDARY, PROMPT_END or OUTPUT
    tail_page: int | None = None  # cache-owned copy of the partial block (frontier % 64 != 0)
    # an in-pass tap off a page boundary: its tail page is filled once the pass has written
    # the block (`Publisher.after_advance`); not publishable before
    tail_due: bool = False


@dataclass(slots=True)
class KVLane:
    request: Request
    lane_id: int  # the prefix index's lane handle (unique per admission)
    slot: int  # physical state slot
    prompt_len: int  # tokens known at admission: prefilled before the lane samples
    computed: int  # frontier: KV and state cover tokens[:computed]
    pages: list[int] = field(default_factory=list)
    private: list[bool] = field(default_factory=list)  # parallel to pages
    committed_blocks: int = 0  # blocks [0, committed_blocks) are index nodes the lane pins
    entitled_pages: int = 0  # reservation: pages this lane may still take without a check
    cached_tokens: int = 0  # this admission's resume frontier (the KV decisions read it)
    cached_prefix_tokens: int = 0  # this admission's longest cached block prefix
    restore_ticket: Any = None  # Host restore the lane's first pass waits on, layer by layer
    resumed_endpoint: bool = False
    taps: list[tuple[int, bool]] = field(default_factory=list)  # (position, exact), ascending
    boundary_taps: set[int] = field(default_factory=set)  # tap positions published as Boundary
    pending: list[PendingTap] = field(default_factory=list)
    last_snapshot: int = 0  # frontier of the deepest snapshot on the lane's path

    @property
    def tokens(self) -> list[int]:
        """The request's tokens (prompt + generated)."""
        return self.request.tokens

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_len

    def private_pages(self) -> list[int]:
        return [p for p, mine in zip(self.pages, self.private, strict=True) if mine]
