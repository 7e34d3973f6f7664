"""Stand-ins for coalescing tests (ninfer/engine/kv/coalesce.py): cost models with exact
figures, jobs keyed by given block hashes, and sibling lanes part-way through their prompts."""

from __future__ import annotations

from engine_helpers import greedy

from ninfer.cache.cost import CacheCostModel
from ninfer.engine.kv.lane import KVLane
from ninfer.engine.request import PromptHints, Request

# 1 ms per token and 10 ms per chunk of 512: prefill_seconds(b, k) = 0.001 k + 0.01 ceil(k/512)
COST = CacheCostModel(1e-3, 0.0, 0.01, 512, 1e9, 0.0)
# only chunks cost: any 1..512 tokens cost exactly one chunk (10 ms), 513..1024 two
CHUNKS_ONLY = CacheCostModel(0.0, 0.0, 0.01, 512, 1e9, 0.0)


class _Blocks:
    vision_spans = ()

    def __init__(self, hashes):
        self.hashes = hashes


def keyed_job(rid: str, hashes: list[int], n: int) -> Request:
    """A job of `n` tokens whose prepared blocks carry `hashes`."""
    job = Request(rid, [0] * n, greedy(1), PromptHints(), sink=None)
    job.blocks = _Blocks(hashes)
    return job


def sibling(hashes: list[int], computed: int, prompt_len: int, rid: str = "sib") -> KVLane:
    """A lane of `keyed_job` that has prefilled `computed` of its `prompt_len` tokens."""
    job = keyed_job(rid, hashes, prompt_len)
    return KVLane(job, 1, 0, prompt_len, computed)
