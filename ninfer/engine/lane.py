"""A submitted request (`Request`) and an active request (`Lane`): plain data, no tensors.

A Lane is what admission builds from a Request: a physical state slot, a block table (`pages`),
and the frontier `computed` (tokens whose KV is in the pages and whose state is in the slot).

    tokens     |<------------- prompt (prompt_len) ------------->|<- generated ->|
    computed   0 ........ resumed ........ F ..... prefilled .... ^ frontier

A suspended request (§9.5: the pool could not extend it) comes back as its Request with `resume`,
the suspended Lane: its next admission prefills what the lane knew, tokens[:len(tokens)], so
the new lane's `prompt_len` is that length while `gen_start` stays where the request's own
prompt ended (outputs, usage and max_tokens count from there):

    tokens     |<- request prompt ->|<- generated before -->|<- generated after ->|
               0                    gen_start               prompt_len (resumed at F <= it)
    pages      [p0][p1][p2] ...   page b holds positions [64b, 64b + 64)
    committed  blocks [0, committed_blocks) are index nodes the lane pins (0 when disabled);
               `private[b]` says the lane owns pages[b] (a growth page, the partial tail, or a
               recomputed duplicate, design §7.5), otherwise the index owns it

Mutated only by the engine thread, each field by one owner: the KV state (engine/kv/: admission
builds the lane; then pages, private, committed_blocks, entitled_pages, slot, cached_tokens,
cached_prefix_tokens, the restore ticket, taps, pending, last_snapshot) and the loop (engine.py,
outputs.py: tokens, computed after admission, sampler and detokenizer state, text,
finish_reason, timings). The one shared step is `carry`, which the loop calls on a resumed lane:
it also adds the suspended lane's usage tallies (restored_host_bytes, created_prompt_tokens,
restore_timing, usage_cached) to those the KV state keeps.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from ninfer.request import SamplingParams


@dataclass(slots=True)
class PromptHints:
    """Tap hints of one prompt (token positions), design §7.1."""

    explicit: list[int] = field(default_factory=list)  # client breakpoints, cache_control
    structural: list[int] = field(default_factory=list)  # end of tools / system block
    opener: int | None = None  # start of the final assistant generation opener
    message_starts: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Request:
    """A request as submitted to the engine. `sink` receives StreamDelta events (when
    `stream`) and then exactly one final RequestOutput."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    hints: PromptHints
    sink: queue.Queue
    stream: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)
    t_submit: float = 0.0
    error: str | None = None  # set before submission: finish at once with this error
    blocks: Any = None  # ninfer.cache.keys.PromptBlocks (None when the cache is disabled)
    coalesced: bool = False  # waited at least once for a prefilling sibling (§12.2)
    # suspended (§9.5): the lane it resumes (tokens, sampler and detokenizer state, metrics);
    # `blocks` then describe resume.tokens
    resume: Lane | None = None

    def known_tokens(self) -> list[int]:
        """What an admission starts from: the prompt, or the suspended lane's tokens."""
        return self.prompt if self.resume is None else self.resume.tokens

    def tokens_left(self) -> int:
        """Output tokens still allowed: max_tokens less those generated before a suspension."""
        if self.resume is None:
            return self.params.max_tokens
        return self.params.max_tokens - (len(self.resume.tokens) - self.resume.gen_start)


@dataclass(slots=True)
class PendingTap:
    """A captured snapshot waiting for its anchoring blocks to commit (design §7.4)."""

    frontier: int
    snap_slot: int  # logical snapshot slot holding the image
    kind: int  # SnapshotKind: TAP, BOUNDARY or PROMPT_END
    tail_page: int | None = None  # cache-owned copy of the partial block (frontier % 64 != 0)


@dataclass(slots=True)
class Lane:
    job: Request
    lane_id: int  # the prefix index's lane handle (unique per admission)
    slot: int  # physical state slot
    tokens: list[int]  # prompt + generated
    prompt_len: int  # tokens known at admission: prefilled before the lane samples
    computed: int  # frontier: KV and state cover tokens[:computed]
    pages: list[int] = field(default_factory=list)
    private: list[bool] = field(default_factory=list)  # parallel to pages
    committed_blocks: int = 0  # blocks [0, committed_blocks) are index nodes the lane pins
    entitled_pages: int = 0  # reservation: pages this lane may still take without a check
    cached_tokens: int = 0  # this admission's resume frontier (the KV decisions read it)
    cached_prefix_tokens: int = 0  # this admission's longest cached block prefix
    usage_cached: tuple[int, int] | None = None  # a resumed request's usage: its first admission's
    # (cached_tokens, cached_prefix_tokens), which the client's usage reports
    created_prompt_tokens: int = 0  # prompt tokens in blocks this lane inserted (usage)
    restored_host_bytes: int = 0
    restore_ticket: Any = None  # Host restore the lane's first pass waits on, layer by layer
    restore_timing: Any = None  # the same ticket, kept for metrics.restore_s once landed
    resumed_endpoint: bool = False
    taps: list[tuple[int, bool]] = field(default_factory=list)  # (position, exact), ascending
    boundary_taps: set[int] = field(default_factory=set)  # tap positions published as Boundary
    pending: list[PendingTap] = field(default_factory=list)
    last_snapshot: int = 0  # frontier of the deepest snapshot on the lane's path
    detok: Any = None  # incremental detokenizer state (ninfer.detokenizer)
    generator: torch.Generator | None = None
    logprobs: list[dict[int, float]] | None = None
    text: str = ""  # detokenized text not yet streamed
    streamed_tokens: int = 0
    t_admit: float = 0.0
    t_first: float = 0.0
    prefill_done_t: float = 0.0
    finish_reason: str | None = None
    gen_start: int = -1  # where the request's prompt ends (-1: prompt_len, a fresh request)
    suspensions: int = 0  # times the request was suspended for pages and resumed (§9.5)

    def __post_init__(self) -> None:
        if self.gen_start < 0:
            self.gen_start = self.prompt_len

    def reported_cached(self) -> tuple[int, int]:
        """(cached_tokens, cached_prefix_tokens) as the request's usage reports them: its first
        admission's, however often it was suspended and resumed since."""
        return self.usage_cached or (self.cached_tokens, self.cached_prefix_tokens)

    def carry(self, old: Lane) -> None:
        """A resumed admission takes over the suspended lane's request state: sampler and
        detokenizer state, stream position, logprobs, timings and usage, so the client sees
        one uninterrupted request. Its own resume frontier (`cached_tokens`) stays: the KV
        decisions of this admission read it; usage reports the first admission's."""
        self.gen_start = old.gen_start
        self.suspensions = old.suspensions
        self.detok, self.generator, self.logprobs = old.detok, old.generator, old.logprobs
        self.text, self.streamed_tokens = old.text, old.streamed_tokens
        self.t_admit, self.t_first = old.t_admit, old.t_first
        self.prefill_done_t = old.prefill_done_t
        self.usage_cached = old.reported_cached()
        self.restored_host_bytes += old.restored_host_bytes
        self.created_prompt_tokens += old.created_prompt_tokens
        self.restore_timing = self.restore_timing or old.restore_timing

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_len

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.gen_start :]

    def private_pages(self) -> list[int]:
        return [p for p, mine in zip(self.pages, self.private, strict=True) if mine]
