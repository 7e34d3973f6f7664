"""Small shared types of the prefix-cache index: ids, residency, kinds, spans, errors.

Nothing here knows about tensors; every id is a plain int.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from ninfer.page import PAGE_SIZE

TOKEN_BYTES = 4  # packed int32 per token id
BLOCK_BYTES = PAGE_SIZE * TOKEN_BYTES  # 256 bytes of token ids per block

ROOT = 0  # node id of the tree root (depth -1, covers no tokens, never evicted)


class Residency(enum.IntEnum):
    """State of one copy (Device or Host) of a node, tail or image."""

    ABSENT = 0
    RESIDENT = 1
    FILLING = 2  # a transfer is writing it; readers wait, nobody frees it (§10.6)


class SnapshotKind(enum.IntEnum):
    """What a snapshot is (§5.3). Taps (TAP, BOUNDARY) follow their prompt's lineage: a deeper
    tap of the same prompt supersedes the shallower (§9.3). ENDPOINT, PROMPT_END and OUTPUT do
    not: they are where a request stopped, where its prompt ended before it generated, or a
    structural boundary of its reply, and they stay retained beside the prompt's taps, valued by
    GDSF like every other snapshot."""

    TAP = 0
    ENDPOINT = 1
    BOUNDARY = 2  # a tap at a client breakpoint or structural boundary (§7.1, §9.3)
    # the state right after the whole prompt, taken when the prompt's last pass ends (no split):
    # a later prompt that extends this one without the reply (a client that drops or rewrites
    # the generated text) resumes here
    PROMPT_END = 3
    # an output boundary (§7.7): the state at a structural point of the reply the chat template
    # re-renders (after `</think>`, before `<tool_call>`), taken between decode steps
    OUTPUT = 4

    @property
    def is_tap(self) -> bool:
        return self in (SnapshotKind.TAP, SnapshotKind.BOUNDARY)

    @property
    def tail_known(self) -> bool:
        """Taken where the lane knows its tail tokens already (the prompt's, or generated ones):
        it publishes once its anchor blocks commit, without the block holding its tail, and the
        endpoint's 64-token rule looks past it (§7.7)."""
        return self in (SnapshotKind.PROMPT_END, SnapshotKind.OUTPUT)


class Span(NamedTuple):
    """A Vision token span [begin, begin + length)."""

    begin: int
    length: int

    @property
    def end(self) -> int:
        return self.begin + self.length

    def strictly_inside(self, position: int) -> bool:
        """True when a frontier at `position` would split the span (§6.1.3)."""
        return self.begin < position < self.begin + self.length


class LaneError(RuntimeError):
    """A lane call out of protocol: unknown/duplicate lane, out-of-order commit, early publish."""


class StaleQuoteError(RuntimeError):
    """The cache changed since the quote was made (cache_epoch differs): quote again."""


def floor_page(x: int) -> int:
    return x - x % PAGE_SIZE


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
