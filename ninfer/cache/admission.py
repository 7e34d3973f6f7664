"""Admission arithmetic (design §6.1-§6.3): lookup, choice of source, capacity.

Read-only: match and quote never mutate the index. Candidates are the root, the deepest valid
snapshot s*, and the deepest snapshot whose image, tail and path are all Device-resident,
s_dev. The cheapest (restore + prefill seconds, ties: fewer bytes) is tried first, then s_dev,
then the root, until one fits:

 position   0            64a        F              n             n + output window
            |-- path ----|-- tail --|-- prompt rest --|-- growth -->|
 pages      shared (a)   private COW          entitlement - ceil(F / 64)
 need = host_only_path_blocks + host_only_tail + (F % 64 != 0) + entitlement - ceil(F / 64)
 fits iff need <= free_pages + evictable (evictable without this admission's own path/tail)

`free_pages` is what the caller may count on: the engine passes free minus the pages it has
reserved for active lanes, unclamped, so the check is the engine's own need <= free +
evictable - reserved. `evictable` counts exactly what eviction frees (`evictable_pages`): not
an unbacked node whose subtree is pinned, which eviction skips.
"""

from __future__ import annotations

from itertools import repeat

from ninfer.cache.blocks import BlockStore
from ninfer.cache.common import BLOCK_BYTES, ROOT, Residency, ceil_div
from ninfer.cache.cost import CacheCostModel
from ninfer.cache.device_lru import DeviceEntry, EntryKind
from ninfer.cache.keys import PromptBlocks
from ninfer.cache.records import (
    CacheConfig,
    MatchResult,
    Quote,
    QuoteParams,
    Readiness,
    SourceCost,
)
from ninfer.cache.snapshot_store import SnapshotStore
from ninfer.page import PAGE_SIZE

_ABSENT, _RESIDENT, _FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING


class _PathStats:
    """Prefix statistics of the matched path at each node that anchors snapshots."""

    __slots__ = ("host_only", "in_lru", "filling", "all_device")

    def __init__(self, host_only: int, in_lru: int, filling: bool, all_device: bool):
        self.host_only, self.in_lru = host_only, in_lru
        self.filling, self.all_device = filling, all_device


class Admission:
    """The §6 arithmetic over the block and snapshot stores. Owns nothing and mutates nothing;
    PrefixIndex passes what depends on its lanes and batches (the blocked nodes, the epoch)."""

    def __init__(
        self,
        config: CacheConfig,
        cost: CacheCostModel,
        blocks: BlockStore,
        snapshots: SnapshotStore,
    ) -> None:
        self.config, self.cost = config, cost
        self.blocks, self.snapshots = blocks, snapshots

    def match(self, prompt: PromptBlocks) -> MatchResult:
        """§6.1 lookup. Mutates nothing."""
        path, cands, _ = self._walk_prompt(prompt)
        return _match_result(path, cands)

    def _walk_prompt(self, prompt: PromptBlocks, blocked: set[int] | frozenset = frozenset()):
        """Walk the tree along the prompt; returns (path, [(snapshot, stats at its anchor)]
        deepest first, root stats). `blocked`: LRU nodes eviction skips (not counted in_lru)."""
        n = prompt.n_tokens
        limit = min((n - 1) // PAGE_SIZE if n > 0 else 0, len(prompt.hashes))
        data, hashes, extras = prompt.data, prompt.hashes, prompt.extras
        tree = self.blocks.tree
        by_hash = tree._by_hash.get
        path: list[int] = []
        anchored = []  # (depth, node, stats) for nodes holding snapshots
        parent = ROOT
        host_only = in_lru = 0
        filling, all_device = False, True
        root = tree.root
        root_stats = _PathStats(0, 0, False, True)
        if root.snapshots:
            anchored.append((-1, root, root_stats))
        # Hot loop (3,750 iterations for a 240k prompt): locals only; the prompt's blocks were
        # split once (PromptBlocks.blocks), so a token compare is one bytes == bytes.
        append, find = path.append, tree.find_child
        resident, absent = _RESIDENT, _ABSENT
        blocks = prompt.blocks
        for b, blk, h, e in zip(range(limit), blocks, hashes, extras or repeat(0), strict=False):
            node = by_hash(h)
            if node is None or node.parent != parent or node.extra != e or node.tokens != blk:
                node = find(parent, h, blk, e)
                if node is None:  # a true miss (the probe above may only have collided)
                    break
            ds = node.device_state
            if ds == resident:
                if not node.active_refs and not node.restore_pins and node.id not in blocked:
                    in_lru += 1
            elif ds == absent:
                host_only += 1
                all_device = False
            else:
                filling = True
                all_device = False
            parent = node.id
            append(parent)
            if node.snapshots:
                anchored.append((b, node, _PathStats(host_only, in_lru, filling, all_device)))
        cands = []
        snaps, spans = self.snapshots.by_id, prompt.vision_spans
        for depth, node, st in reversed(anchored):
            start = BLOCK_BYTES * (depth + 1)
            for sid in node.snapshots:
                s = snaps[sid]
                f = s.frontier
                if f > n - 1 or s.tail != data[start : f * 4]:
                    continue
                if spans and any(sp.strictly_inside(f) for sp in spans):
                    continue  # never resume inside a Vision span (§6.1.3)
                if spans and _tail_over_media(spans, start // 4, f):
                    continue  # the tail's tokens are compared, not its media keys
                cands.append((s, st))
        cands.sort(key=lambda c: -c[0].frontier)
        return path, cands, root_stats

    def _source_cost(self, s, st, n: int, ent: int, evictable_now: int) -> SourceCost:
        cfg = self.config
        if s is None:
            f, blocks, tail, image, evictable = 0, 0, False, False, evictable_now
        else:
            f = s.frontier
            blocks = st.host_only
            tail = bool(s.tail) and s.tail_device == _ABSENT
            image = s.device_state == _ABSENT
            tail_in_lru = DeviceEntry(EntryKind.TAIL, s.id) in self.blocks.lru
            evictable = evictable_now - st.in_lru - tail_in_lru
        nbytes = (blocks + tail) * cfg.slab_bytes + image * cfg.image_bytes
        need = blocks + tail + (f % PAGE_SIZE != 0) + max(0, ent - ceil_div(f, PAGE_SIZE))
        cost_s = self.cost.restore_seconds(nbytes) + self.cost.prefill_seconds(f, n - f)
        return SourceCost(
            None if s is None else s.id, f, blocks, tail, image, nbytes, need, evictable, cost_s
        )

    def quote(
        self, prompt: PromptBlocks, params: QuoteParams, blocked: set[int], epoch: int
    ) -> Quote:
        """§6.2-§6.3: choose the source and classify readiness. Mutates nothing, pins nothing."""
        n, ent = prompt.n_tokens, params.entitlement_pages
        ev = len(self.blocks.lru) - len(blocked)
        path, cands, root_stats = self._walk_prompt(prompt, blocked)
        match = _match_result(path, cands)
        s_star = s_dev = None
        for s, st in cands:  # deepest first
            if st.filling or (s.tail and s.tail_device == _FILLING):
                continue  # another admission is still filling a block of it (§6.3)
            if s_star is None:
                s_star = (s, st)
            if st.all_device and s.device_complete:
                s_dev = (s, st)
                break
        root = self._source_cost(None, root_stats, n, ent, ev)
        star = None if s_star is None else self._source_cost(*s_star, n, ent, ev)
        if s_dev is None:
            dev = None
        elif s_star is not None and s_dev[0] is s_star[0]:
            dev = star
        else:
            dev = self._source_cost(*s_dev, n, ent, ev)
        options = _unique([root, star, dev])
        chosen = min(options, key=lambda o: (o.cost_s, o.restore_bytes))
        order = _unique([chosen, dev, root])  # then the cheaper-to-materialise fallbacks
        pick = next(
            (o for o in order if o.need_pages <= params.free_pages + o.evictable_pages), None
        )
        if pick is not None:
            readiness = Readiness.READY
        else:
            pick = root
            readiness = (
                Readiness.TEMPORARILY_BLOCKED
                if root.need_pages <= params.total_pages
                else Readiness.PERMANENTLY_INFEASIBLE
            )
        return Quote(
            readiness=readiness,
            source=pick.source,
            frontier=pick.frontier,
            need_pages=pick.need_pages,
            restore_blocks=pick.restore_blocks,
            restore_tail=pick.restore_tail,
            restore_image=pick.restore_image,
            restore_bytes=pick.restore_bytes,
            cached_prefix_tokens=match.cached_prefix_tokens,
            cost_s=pick.cost_s,
            epoch=epoch,
            prompt=prompt,
            match=match,
            considered=options,
        )


def _match_result(path: list[int], cands: list) -> MatchResult:
    return MatchResult(path, [s.id for s, _ in cands], PAGE_SIZE * len(path))


def _unique(items: list[SourceCost | None]) -> list[SourceCost]:
    out: list[SourceCost] = []
    for o in items:
        if o is not None and all(o is not p for p in out):
            out.append(o)
    return out


def _tail_over_media(spans, begin: int, frontier: int) -> bool:
    """Whether a snapshot tail [begin, frontier) overlaps a Vision span: its placeholder
    tokens are the same for different media, and only whole blocks carry the media key."""
    return any(sp.begin < frontier and begin < sp.end for sp in spans)
