"""A request as the loop holds it (`Request`): what the client asked and how far it got.

A Request lives from `Engine.submit` to its final output. While it runs, the KV state gives it
a `KVLane` (engine/kv/lane.py: a state slot, a block table, the frontier); a suspension
(§9.5: the pool could not extend it) drops that lane and puts the Request back at the head of
the queue as it is; its next admission builds a new lane for it, which prefills what the
request knows, `tokens`:

    tokens     |<- prompt (the request's) ->|<- generated ------------------------------>|
               0                            gen_start = len(prompt)                 len(tokens)

Plain data, no tensors; mutated only by the engine thread, each field by one owner:
  - the client side (llm.py) builds it; `Engine.submit` stamps `t_submit`;
  - the loop (engine.py, outputs.py): `tokens` past the prompt, the sampler and detokenizer
    state, text and stream position, logprobs, timings, `finish_reason`, `suspensions`, and
    `blocks` again at a suspension (they then describe `tokens`);
  - the KV state (engine/kv/): `usage`, the request's cache figures, which add up over its
    admissions, and `coalesced`.
The length rule is `length_reached`; the entitlement reads `tokens_left`.
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
    # output boundaries (§7.7): token ids after which / before which the reply's state is
    # snapshotted between decode steps (`</think>`, `<tool_call>`); the chat template's
    output_after: tuple[int, ...] = ()
    output_before: tuple[int, ...] = ()


@dataclass(slots=True)
class CacheUsage:
    """A request's cache figures as its usage reports them, written by the KV state: the first
    admission's resume frontier and cached block prefix, and what every admission restored or
    inserted (a suspended request is admitted again)."""

    cached_tokens: int = 0  # the first admission's resume frontier
    cached_prefix_tokens: int = 0  # the first admission's longest cached block prefix
    created_prompt_tokens: int = 0  # prompt tokens in blocks the request inserted
    restored_host_bytes: int = 0
    restore_timing: Any = None  # the latest Host restore's ticket, for metrics.restore_s


@dataclass(slots=True)
class Request:
    """A request as submitted to the engine, and its progress. `sink` receives StreamDelta
    events (when `stream`) and then exactly one final RequestOutput."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    hints: PromptHints
    sink: queue.Queue
    stream: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)
    t_submit: float = 0.0
    error: str | None = None  # set before submission: finish at once with this error
    blocks: Any = None  # ninfer.cache.keys.PromptBlocks of `tokens`, built by Engine.submit
    coalesced: bool = False  # waited at least once for a prefilling sibling (§12.2)
    grammar: Any = None  # ninfer.structured.Grammar: structured_outputs, thinking budget; or None
    images: Any = None  # engine.images.PromptImages of a prompt with images, or None
    tokens: list[int] = field(default_factory=list)  # prompt + generated (set from `prompt`)
    detok: Any = None  # incremental detokenizer state (ninfer.detokenizer)
    generator: torch.Generator | None = None
    matcher: Any = None  # ninfer.structured.Matcher: the structured output's state, or None
    logprobs: list[dict[int, float]] | None = None
    text: str = ""  # detokenized text not yet streamed
    streamed_tokens: int = 0
    t_admit: float = 0.0  # the first admission's
    t_first: float = 0.0
    prefill_done_t: float = 0.0
    finish_reason: str | None = None
    suspensions: int = 0  # times the request was suspended for pages and resumed (§9.5)
    usage: CacheUsage = field(default_factory=CacheUsage)

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def gen_start(self) -> int:
        """Where the request's prompt ends: outputs, usage and max_tokens count from here."""
        return len(self.prompt)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.gen_start :]

    def tokens_left(self) -> int:
        """Output tokens max_tokens still allows."""
        return self.params.max_tokens - (len(self.tokens) - self.gen_start)

    def length_reached(self, max_model_len: int, pending: int = 0) -> bool:
        """The length rule: the request ends "length" once it has generated max_tokens or holds
        max_model_len tokens. `pending`: tokens sampled and not appended yet."""
        return self.tokens_left() <= pending or len(self.tokens) + pending >= max_model_len
