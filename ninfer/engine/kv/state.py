"""The engine's KV state: the prefix index plus the memory it decides about.

`KVState` owns the Device KV pool, the state pool, the streams, the Host transfer seam, the page
budget, the engine's cache counters and (unless `prefix_reuse=False`) the `PrefixIndex`. It
builds its collaborators and hands each only the parts it uses; none holds a reference back:

    Admitter    (admitter.py)   quote / stage / activate the FIFO head into a KVLane
    Publisher   (publisher.py)  block commit, taps, publication, release / suspension of a lane
    Prefetcher  (prefetcher.py) the blocked head's Host-only path into spare Device pages
    PageBudget  (pages.py)      entitlements and growth of active lanes' pages

The loop (engine.py) calls the methods below, `budget.grow` and `counters.prefill_tokens`; the
executor reads the pools' tensors and borrows warm-up pages and slots. Neither edits the index.
Everything here runs on the engine thread only.

With `prefix_reuse=False` there is no index: every page is a lane's private page, no node or
snapshot is ever made (design §7.7, §10.8).
"""

from __future__ import annotations

import copy
import itertools
import logging

import torch

from ninfer.config import CachePolicy, MemoryGeometry
from ninfer.dtypes import torch_dtype
from ninfer.engine.kv import host_faults
from ninfer.engine.kv.admitter import Admitter, Verdict
from ninfer.engine.kv.counters import EngineCounters
from ninfer.engine.kv.lane import KVLane
from ninfer.engine.kv.pages import PageBudget
from ninfer.engine.kv.prefetcher import Prefetcher
from ninfer.engine.kv.publisher import Publisher
from ninfer.engine.request import Request
from ninfer.memory.kv_pool import KVPool
from ninfer.memory.state_pool import StatePool
from ninfer.memory.streams import Streams
from ninfer.memory.transfer import DeviceOnlyTransfer, Transfer

logger = logging.getLogger(__name__)


def slab_bytes(page_bytes: int) -> int:
    """The index's slab size without a Host tier (no slab exists; it sizes GDSF scores): one
    block bundle (every FA layer's page) rounded up to 4 KiB. A Host tier's slabs are exactly
    one block bundle (`MemoryGeometry.host_geometry.slab_bytes`)."""
    return -(-page_bytes // 4096) * 4096


def kv_layer_types(layer_types: tuple[str, ...], kv_layers: int) -> tuple[str, ...]:
    """The model's layer types, plus one full-attention entry per KV layer beyond the model's
    (the MTP head's, whose K/V every page and Host slab carries after the model's)."""
    extra = kv_layers - layer_types.count("full_attention")
    return tuple(layer_types) + ("full_attention",) * extra


def engine_cost_model(cache: CachePolicy, prefill_chunk: int, model_config):
    """The cache's cost model for this model on this device: the prefill FLOPs of the model's
    shape and the rates `resolve()` recorded (`ninfer.costs`; the scheduler's pass sizing uses
    the same), passes of `prefill_chunk` tokens."""
    from ninfer.costs import cache_cost_model

    return cache_cost_model(
        model_config,
        cache.prefill_flops_per_s,
        cache.h2d_bytes_per_s,
        cache.pass_overhead_s,
        prefill_chunk,
        cache.copy_latency_s,
    )


class KVState:
    """The KV-state owner (engine thread only). Invariants (`check_invariants`, with the
    index's own): every Device page is exactly one of free / active (a lane's private page or a
    pending tap's tail copy) / cached (index-owned); every state slot exactly one of free / a
    lane's / a snapshot slot's image; the page reservations equal the lanes' outstanding
    entitlements and never exceed free + evictable pages."""

    def __init__(
        self,
        memory: MemoryGeometry,
        cache: CachePolicy,
        model_config,
        device: torch.device,
        cost,
    ) -> None:
        """Pools sized by `memory`; the index (unless `cache.prefix_reuse` is off) following
        `cache` and pricing with `cost` (`engine_cost_model`)."""
        self.memory, self.cache = memory, cache
        mc = model_config
        self.streams = Streams(device)
        self.kv = KVPool(
            memory.kv_pages,
            memory.kv_layers,  # the model's full-attention layers, then the MTP head's
            mc.num_key_value_heads,
            mc.head_dim,
            torch_dtype(memory.kv_dtype),
            device,
            # with speculation, one more: the trash page of the chain run ahead
            scratch=memory.scratch_entries + int(memory.speculative_slots > 0),
        )
        self.states = StatePool(
            memory.max_concurrency,
            memory.device_snapshot_slots,
            len(mc.gdn_layer_ids),
            mc.conv_dim,
            mc.linear_conv_kernel_dim,
            mc.linear_num_value_heads,
            mc.linear_key_head_dim,
            mc.linear_value_head_dim,
            torch_dtype(memory.dtype),
            device,
            scratch=memory.scratch_entries + memory.speculative_slots,
        )
        # the speculator's entries past the runner's scratch: its state slots, and the trash page
        # where the draft chain run ahead of the read writes the rows it does not keep
        self.spec_slots = self.states.scratch_slots[memory.scratch_entries :]
        self.trash_page = self.kv.scratch_pages[-1] if memory.speculative_slots > 0 else None
        self.transfer: Transfer = DeviceOnlyTransfer()
        self.host_slabs = None  # the Host tier's HostSlabs (read by the cache file's load/save)
        self._index = None
        if cache.prefix_reuse:
            self._build_host_tier(memory, model_config, device)
            self._index = self._new_index(cost)
        self._lane_ids = itertools.count(1)
        self.counters = EngineCounters()
        self._build_collaborators()

    def _build_collaborators(self) -> None:
        """Hand each collaborator the parts it uses (again after the index is replaced)."""
        index, kv, states = self.index, self.kv, self.states
        transfer, counters = self.transfer, self.counters
        self.budget = budget = PageBudget(kv, index, self.memory.max_model_len)
        self.admitter = Admitter(
            index,
            kv,
            states,
            budget,
            transfer,
            counters,
            self._lane_ids,
            self.cache.pending_timeout_s,
        )
        self.publisher = Publisher(index, kv, states, budget, transfer, counters)
        self.prefetcher = Prefetcher(index, kv, budget, transfer)

    @property
    def index(self):
        """The PrefixIndex (None when prefix reuse is off)."""
        return self._index

    def reset_index(self) -> None:
        """Start over from an empty index, built like the first (a cache file that failed to
        load part-way leaves nothing half-restored): only before any lane is admitted. The
        collaborators, page budget included, are rebuilt around it; the Host slabs and the
        transfer stay."""
        if self._index is None:
            raise RuntimeError("prefix reuse is off: there is no index to reset")
        self._index = self._new_index(self._index.cost)
        self._build_collaborators()

    def _new_index(self, cost):
        """An empty PrefixIndex pricing with `cost`; with a Host tier over `memory.host_geometry`
        (the slabs' object: slab ids mean the same in the index, the slabs and the transfer),
        its slab pool containing its allocation faults (host_faults.py)."""
        from ninfer.cache.index import PrefixIndex
        from ninfer.cache.records import CacheConfig
        from ninfer.cache.taps import TapConfig

        memory, policy = self.memory, self.cache
        taps = TapConfig(
            max_new_taps=policy.cache_taps_per_request,
            ladder_tokens=policy.cache_tap_ladder,
            min_gap_tokens=policy.cache_tap_min_gap,
            forward_tokens=policy.cache_tap_forward,
        )
        if self.host_slabs is None:
            config = CacheConfig(
                slab_bytes=slab_bytes(memory.kv_page_bytes),
                image_bytes=memory.state_image_bytes,
                host_cache_bytes=0,
                device_snapshot_slots=memory.device_snapshot_slots,
                taps=taps,
            )
            return PrefixIndex(config, cost)
        config = CacheConfig.for_host(memory.host_geometry, memory.device_snapshot_slots, taps)
        return PrefixIndex(config, cost, host_pool=self._guarded_pool)

    def _guarded_pool(self, geometry) -> host_faults.GuardedHostPool:
        return host_faults.GuardedHostPool(geometry, self._host_alloc_failed)

    def _build_host_tier(self, memory: MemoryGeometry, model_config, device: torch.device) -> None:
        """With a Host tier: the pinned slabs over `memory.host_geometry` and their Transfer, whose
        raising copies are contained (a Host fault degrades the entries it hit to Device-only,
        host_faults.py)."""
        if not memory.host_tier:
            return
        from ninfer.memory.host_slabs import HostSlabs
        from ninfer.memory.transfer import HostTransfer

        self.host_slabs = slabs = HostSlabs(memory.host_geometry, pin=device.type == "cuda")
        host = HostTransfer(
            slabs,
            self.kv.kv,
            self.states.conv,
            self.states.ssm,
            kv_layer_types(model_config.layer_types, memory.kv_layers),
            self.streams,
            timing=True,  # CUDA: timed events give metrics.restore_s (no-op on the CPU)
        )
        self.transfer = host_faults.GuardedTransfer(host, self._host_write_failed, self.streams)

    # ---- Host-tier faults (host_faults.py) ------------------------------------------------------
    def _host_write_failed(self, batch_id: int, exc: BaseException) -> None:
        self.counters.host_faults += 1
        logger.warning("ninfer: Host write %d failed (%r): entries stay Device-only", batch_id, exc)
        self.kv.free(self.index.abort_write_through(batch_id))

    def _host_alloc_failed(self, exc: BaseException) -> None:
        self.counters.host_faults += 1
        logger.warning("ninfer: Host slab allocation failed (%r): the entry stays Device-only", exc)

    def restore_failed(self, fault) -> None:
        """Undo a Host restore that raised (a `host_faults.HostRestoreFault`): its targets and
        the admission that began it are rolled back, the Host copies it read are dropped."""
        self.counters.host_faults += 1
        logger.warning("ninfer: %s: the request is served without those Host entries", fault)
        self.kv.free(self.index.abort_restore(fault.batch_id))
        if fault.lane_slot >= 0:
            self.states.release(fault.lane_slot)

    # ---- the engine's calls ----------------------------------------------------------------
    def try_admit(self, job: Request, lanes: list[KVLane]) -> Verdict:
        """Admit the FIFO head `job` or say why not (admitter.py). A prefetch in flight lands
        first, so the quote sees its blocks; a Host restore that raised is rolled back and the
        head quoted again, without those Host entries (it prefills what they held)."""
        while True:
            if self.prefetcher.settle():
                self.poll()
            try:
                return self.admitter.try_admit(job, lanes)
            except host_faults.HostRestoreFault as fault:
                self.restore_failed(fault)

    def before_chunk(
        self, lane: KVLane, start: int, end: int, in_pass: bool = False, tail_at: int | None = None
    ) -> list[tuple[int, int]]:
        """Taps due before the chunk runs; with `in_pass`, the (position, physical slot) pairs
        of the snapshots the pass takes inside the chunk (the prompt tail's at `tail_at`)."""
        return self.publisher.before_chunk(lane, start, end, in_pass, tail_at)

    def first_pass_hook(self, lane: KVLane):
        """The layer-by-layer wait of the lane's Host restore for the pass about to launch (None
        without a restore in flight). The restore is then the pass's: later passes are
        stream-ordered behind it, so the lane's ticket is dropped here."""
        ticket, lane.restore_ticket = lane.restore_ticket, None
        return ticket.hook() if ticket else None

    def after_advance(self, lane: KVLane) -> None:
        """After a pass moved `lane.computed`: commit blocks, realize taps, publish."""
        self.publisher.after_advance(lane)

    def release(self, lane: KVLane) -> None:
        """Terminal settlement of a finished, cancelled or failed lane (§7.7)."""
        self.publisher.release(lane)

    def suspend(self, lane: KVLane) -> None:
        """Release a lane the pool cannot extend so that it can resume (§9.5): its endpoint
        snapshot is published at its frontier (when a snapshot slot is granted)."""
        self.publisher.release(lane, suspend=True)
        self.counters.suspensions += 1

    def poll(self, wait: bool = False) -> None:
        """Report landed Host copies to the index (no-op without a Host tier); `wait` drains
        every outstanding copy first (shutdown)."""
        landed = self.transfer.drain() if wait else self.transfer.poll()
        if self.index is not None:
            for batch in landed.restores:
                self.index.on_restore_landed(batch)
                self.prefetcher.landed(batch)
            for batch in landed.writes:
                self.index.on_write_through_landed(batch)

    # ---- introspection ---------------------------------------------------------------------
    def cached_pages(self) -> list[int]:
        """Device pages the index owns: node copies and snapshot tails (O(cache): debug and
        invariant checks; `stats().pages_cached` counts them in O(1))."""
        if self.index is None:
            return []
        from ninfer.cache.common import ROOT, Residency

        nodes = self.index.blocks.tree.nodes.values()
        pages = [
            n.device_page for n in nodes if n.id != ROOT and n.device_state != Residency.ABSENT
        ]
        snaps = self.index.snapshots.by_id.values()
        return pages + [s.tail_page for s in snaps if s.tail_page >= 0]

    def check_invariants(self, lanes: list[KVLane]) -> None:
        """Cache §10 invariants plus the memory partition: every page exactly one of free /
        active (a lane's private page or a pending tap tail) / cached (index-owned); every
        state slot exactly one of free / a lane's / a snapshot slot's image."""
        active = [p for lane in lanes for p in lane.private_pages()]
        active += [t.tail_page for lane in lanes for t in lane.pending if t.tail_page is not None]
        if self.index is not None:
            self.index.check_invariants()
        cached = self.cached_pages()
        self.kv.check_partition(active=active, cached=cached)
        st = self.stats()
        if (st.pages_cached, st.pages_active) != (len(cached), len(active)):
            raise AssertionError(
                f"stats pages cached / active {st.pages_cached} / {st.pages_active}, "
                f"recount {len(cached)} / {len(active)}"
            )
        self.states.check_invariants(lane.slot for lane in lanes)
        outstanding = sum(lane.entitled_pages for lane in lanes)
        if outstanding != self.budget.reserved:
            raise AssertionError(f"page budget: reserved {self.budget.reserved} != {outstanding}")
        if self.budget.reserved > self.kv.num_free + self.budget.evictable():
            raise AssertionError("page budget: reservations exceed free + evictable pages")
        if self.index is not None:
            self._check_evictable()
        for lane in lanes:
            if len(lane.pages) != len(lane.private):
                raise AssertionError("lane: pages and private flags differ in length")
            if self.index is None and lane.committed_blocks:
                raise AssertionError("disabled lane committed blocks")

    def check_idle(self) -> None:
        """With no lane: the invariants hold and nothing is reserved, pinned or leaked (every
        page free or cached, every active state slot free, no lane record, transfer batch or
        pin left in the index). AssertionError naming what is left."""

        def require(ok: bool, what: str) -> None:
            if not ok:
                raise AssertionError(what)

        require(self.budget.reserved == 0, f"{self.budget.reserved} page(s) still reserved")
        self.check_invariants([])
        cached = self.cached_pages()
        require(self.kv.num_free + len(cached) == self.kv.num_pages, "pages leaked")
        require(self.states.num_free_active == self.states.active_slots, "state slots leaked")
        index = self.index
        if index is None:
            return
        require(not index.lanes and not index.batches, "index lanes or batches open")
        nodes = index.blocks.tree.nodes.values()
        node = next((n for n in nodes if n.active_refs or n.restore_pins), None)
        require(node is None, f"node pinned: {node}")
        snap = next((s for s in index.snapshots.by_id.values() if s.restore_pins), None)
        require(snap is None, f"snapshot pinned: {snap}")

    def revalue_host(self) -> None:
        """Recompute every Host snapshot's cached GDSF value now (a soak that tolerates a stale
        one repairs it with this; no-op without an index)."""
        if self.index is not None:
            self.index.revalue_host()

    def _check_evictable(self) -> None:
        """The page budget's `evictable` is what eviction would free: every Device LRU entry
        but an unbacked node whose subtree holds a pin (O(LRU x subtree): debug only)."""
        index = self.index
        from ninfer.cache.device_lru import EntryKind

        lru, brute = index.blocks.lru, 0
        for e in lru.order():
            skip = e.kind == EntryKind.NODE and not lru.is_backed(e)
            brute += not (skip and index.liveness.subtree_pinned(index.node(e.id)))
        if brute != index.evictable_pages():
            raise AssertionError(f"evictable pages {index.evictable_pages()} != {brute}")

    def prefetch_head(self, job: Request) -> int:
        """The FIFO head stays blocked: prefetch its Host-only path (§6.6); blocks copied. A
        restore that raised is rolled back (its entries are dropped from the Host tier)."""
        try:
            return self.prefetcher.maybe_prefetch(job)
        except host_faults.HostRestoreFault as fault:
            self.restore_failed(fault)
            return 0

    def stats(self):
        """A CacheStats copy: the index's gauges and counters (zero when the cache is
        disabled) plus the engine's fields (Device bytes, page states, EngineCounters, prefetch
        batches). O(1): every field is a running count (the pool's free count, the index's
        stores' counts; `check_invariants` compares the page states with a recount), so a
        `/metrics` scrape, which runs it on the engine thread, costs nothing per cached entry."""
        from ninfer.cache.stats import CacheStats

        st = CacheStats() if self.index is None else copy.copy(self.index.stats())
        page, image = self.memory.kv_page_bytes, self.states.image_bytes
        st.device_block_bytes = st.nodes_device * page
        st.device_snapshot_bytes = st.snapshots_device * image + st.snapshot_tails_device * page
        st.pages_total = self.kv.num_pages
        st.pages_free = self.kv.num_free
        st.pages_cached = st.device_cached_pages
        st.pages_active = st.pages_total - st.pages_free - st.pages_cached
        c = self.counters
        st.taps_skipped_no_page = c.taps_skipped_no_page
        st.taps_dropped = c.taps_dropped
        st.coalesced_waits = c.coalesced_waits
        st.prefill_tokens = c.prefill_tokens
        st.host_faults = c.host_faults
        st.suspensions = c.suspensions
        st.encoder_cache_hits = c.encoder_cache_hits
        st.encoder_cache_misses = c.encoder_cache_misses
        st.prefetches = self.prefetcher.batches
        return st

    def ledger(self) -> dict:
        return {
            "kv_pages": self.kv.num_pages,
            "kv_page_bytes": self.memory.kv_page_bytes,
            "kv_bytes": self.kv.bytes,
            "kv_pages_free": self.kv.num_free,
            "kv_pages_cached": self.stats().pages_cached,
            "state_slots_active": self.states.active_slots,
            "state_slots_snapshot": self.states.snapshot_slots,
            "state_image_bytes": self.states.image_bytes,
            "state_bytes": self.states.total_slots * self.states.image_bytes,
            "host_tier": self.memory.host_tier,
            "host_cache_bytes_requested": self.memory.host_cache_bytes,
            "host_bytes": self.transfer.host_bytes,
            "host_slabs": 0
            if self.index is None or self.index.host is None
            else self.index.host.n_slabs,
            "prefix_reuse": self.cache.prefix_reuse,
            "coalesced_waits": self.counters.coalesced_waits,
        }
