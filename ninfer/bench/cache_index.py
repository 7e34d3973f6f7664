"""CPU benchmark of the index's hot paths (design §6.1, §7.1, §9.3): hashing and matching a long
prompt against a large tree, planning its taps, Host victim selection among many snapshots.

Pure Python, importable by the CLI (`ninfer bench`) and wrapped by tools/bench_cache.py.
"""

from __future__ import annotations

import functools
import gc
import random
import statistics
import time
from collections.abc import Callable

from ninfer.cache.common import BLOCK_BYTES, ROOT, ceil_div
from ninfer.cache.cost import CacheCostModel
from ninfer.cache.index import PrefixIndex
from ninfer.cache.keys import PromptBlocks, block_hashes, hash_blocks, pack_tokens, split_blocks
from ninfer.cache.records import CacheConfig, Quote, QuoteParams
from ninfer.cache.taps import HintKind, Tap, TapConfig, TapHint, plan_taps
from ninfer.page import PAGE_SIZE


def _time(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    """min / median milliseconds of `repeats` calls, with the cyclic GC paused while timing
    (a full collection over a million tree nodes would land in whichever call it hits)."""
    runs = []
    for _ in range(repeats):
        gc.disable()
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) * 1e3)
        gc.enable()
    return {"min_ms": round(min(runs), 4), "median_ms": round(statistics.median(runs), 4)}


def _empty_index(tree_blocks: int, snapshots: int) -> PrefixIndex:
    """An empty index whose Host tier holds `tree_blocks` blocks and `snapshots` + 1 images."""
    slab = 4096
    image_slabs = 2
    host_slabs = tree_blocks + (snapshots + 1) * (image_slabs + 1)
    return PrefixIndex(
        CacheConfig(
            slab_bytes=slab,
            image_bytes=image_slabs * slab,
            host_cache_bytes=host_slabs * slab,
            device_snapshot_slots=9,
            host_chunk_bytes=1 << 40,
            taps=TapConfig(),
        ),
        CacheCostModel.h200(),
    )


def build_tree(
    prompt_data: bytes, tree_blocks: int, snapshots: int, seed: int = 0
) -> tuple[PrefixIndex, float]:
    """A Host-only tree of `tree_blocks` nodes: the prompt's own path plus branches hanging off
    it at random depths, `snapshots` snapshots (some on the prompt path, the rest at branch
    ends). Returns the index and the build time in seconds."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    gc.disable()  # a million long-lived nodes: generational GC would rescan them repeatedly
    main_blocks = len(prompt_data) // BLOCK_BYTES
    ix = _empty_index(tree_blocks, snapshots)
    path = []
    parent = ROOT
    for b in range(min(main_blocks, tree_blocks)):
        parent = ix.load_block(parent, prompt_data[b * BLOCK_BYTES : (b + 1) * BLOCK_BYTES])
        path.append(parent)
    on_path = max(1, min(snapshots // 20, len(path) // 64))  # one every 4096 tokens or so
    branches = snapshots - on_path
    remaining = tree_blocks - len(path)
    ends = []
    for i in range(branches):
        length = remaining // (branches - i)
        remaining -= length
        node = path[rng.randrange(len(path))]
        for _ in range(length):
            node = ix.load_block(node, rng.randbytes(BLOCK_BYTES))
        ends.append(node)
    step = max(1, len(path) // on_path)
    anchors = [path[min(len(path), (k + 1) * step) - 1] for k in range(on_path)] + ends
    # unique (a zero-length branch ends on the path), parents first: cheap linking
    anchors = sorted(dict.fromkeys(anchors), key=lambda nid: ix.blocks.tree.nodes[nid].depth)
    for nid in anchors:
        ix.load_snapshot(nid, b"", hits=rng.randrange(3))
    gc.enable()
    return ix, time.perf_counter() - t0


def run_cache_bench(
    n_tokens: int = 240_000,
    tree_blocks: int = 1_000_000,
    snapshots: int = 1_300,
    repeats: int = 20,
    seed: int = 0,
) -> dict:
    """Measure on this CPU; returns a JSON-able dict of sizes and timings (n_tokens >= 128)."""
    if n_tokens < 2 * PAGE_SIZE:
        raise ValueError(f"n_tokens must be at least {2 * PAGE_SIZE}")
    rng = random.Random(seed)
    tokens = [rng.randrange(1, 150_000) for _ in range(n_tokens)]
    data = pack_tokens(tokens)
    ix, build_s = build_tree(data, tree_blocks, snapshots, seed)
    gc.collect()
    gc.freeze()  # the tree is long-lived: keep it out of later collections (as an engine should)
    hashes = block_hashes(data)
    prompt = PromptBlocks(data, n_tokens, hashes)
    ent = ceil_div(n_tokens + 4096, PAGE_SIZE)
    params = QuoteParams(ent, free_pages=ent, total_pages=4 * ent)
    q = ix.quote(prompt, params)
    plan = _tap_plan(ix, q, n_tokens)
    taps = plan()
    revalue = _time(lambda: _revalue_all(ix), max(3, repeats // 4))
    return {
        "prompt_tokens": n_tokens,
        "prompt_blocks": len(hashes),
        "tree_blocks": len(ix.blocks.tree),
        "snapshots": len(ix.snapshots),
        "build_tree_s": round(build_s, 2),
        "matched_blocks": len(q.match.path),
        "candidates": len(q.match.candidates),
        "chosen_frontier": q.frontier,
        **_time_prompt_paths(ix, tokens, prompt, params, repeats),
        "plan_taps": _time(plan, repeats),
        "taps": [(t.position, t.placement.name, t.priority) for t in taps],
        "host_victim_scan": _time(ix.host_tier.victim, repeats),
        "host_revalue_all": revalue,
    }


def _time_prompt_paths(
    ix: PrefixIndex, tokens: list[int], prompt: PromptBlocks, params: QuoteParams, repeats: int
) -> dict[str, dict[str, float]]:
    """`_time` of each step from the prompt's token ids to its quote, by name."""
    data, n_tokens = prompt.data, prompt.n_tokens
    return {
        "pack_tokens": _time(lambda: pack_tokens(tokens), repeats),
        "split_and_hash": _time(lambda: hash_blocks(split_blocks(data)), repeats),
        "match": _time(lambda: ix.match(prompt), repeats),
        "quote_match_and_choice": _time(lambda: ix.quote(prompt, params), repeats),
        "hash_match_choice": _time(lambda: _hash_match_choose(ix, data, n_tokens, params), repeats),
    }


def _hash_match_choose(ix: PrefixIndex, data: bytes, n_tokens: int, params: QuoteParams) -> Quote:
    """A quote from the packed prompt alone: splitting and hashing included."""
    blocks = split_blocks(data)
    p = PromptBlocks(data, n_tokens, hash_blocks(blocks), blocks=blocks)
    return ix.quote(p, params)


def _tap_plan(ix: PrefixIndex, q: Quote, n_tokens: int) -> Callable[[], list[Tap]]:
    """plan_taps for the quoted prompt: a message boundary every 2000 tokens, one structural
    boundary, the opener, the snapshots the match met."""
    hints = [TapHint(p, HintKind.MESSAGE) for p in range(1000, n_tokens, 2000)]
    hints += [TapHint(900, HintKind.STRUCTURAL), TapHint(n_tokens - 40, HintKind.OPENER)]
    existing = [ix.snapshot(s).frontier for s in q.match.candidates]
    return functools.partial(plan_taps, n_tokens, q.frontier, hints, existing, (), TapConfig())


def _revalue_all(ix: PrefixIndex) -> None:
    for sid in ix.snapshots.by_id:
        ix.host_tier.mark(sid)
    ix.host_tier.flush()
