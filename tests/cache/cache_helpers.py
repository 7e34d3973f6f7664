"""Test driver for the prefix-cache index: plays the engine's part with plain page counters."""

from __future__ import annotations

from ninfer.cache import (
    CacheConfig,
    CacheCostModel,
    PrefixIndex,
    PublishResult,
    QuoteParams,
    ReleaseResult,
    SnapshotKind,
    TapConfig,
    prepare_prompt,
)

SLAB = 4096
IMAGE_SLABS = 2
IMAGE = IMAGE_SLABS * SLAB


def exact_cost() -> CacheCostModel:
    """1 s per prefilled token, no attention or chunk terms, restoring one image takes 1 s:
    C(s) = (F_s - F_a) - 1 exactly."""
    return CacheCostModel(
        token_s=1.0,
        pair_s=0.0,
        chunk_s=0.0,
        chunk_tokens=64,
        h2d_bytes_per_s=float(IMAGE),
        batch_latency_s=0.0,
    )


def make_index(
    host_slabs: int = 64, slots: int = 4, cost: CacheCostModel | None = None, taps=None
) -> PrefixIndex:
    cfg = CacheConfig(
        slab_bytes=SLAB,
        image_bytes=IMAGE,
        host_cache_bytes=host_slabs * SLAB,
        device_snapshot_slots=slots,
        taps=taps or TapConfig(),
    )
    return PrefixIndex(cfg, cost or exact_cost())


def tokens(seed: int, n: int) -> list[int]:
    """n distinct-per-seed token ids."""
    return [seed * 100_000 + i for i in range(n)]


class Driver:
    """Plays the engine: hands out page ids from 1000 on and lands transfers on request."""

    def __init__(self, ix: PrefixIndex, land: bool = True) -> None:
        self.ix = ix
        self.land = land
        self.next_page = 1000
        self.prompts: dict[int, list[int]] = {}
        self.pending: list[int] = []  # batch ids not landed

    def page(self) -> int:
        self.next_page += 1
        return self.next_page - 1

    def admit(self, lane: int, toks: list[int], free: int = 10**6, ent: int | None = None):
        ix = self.ix
        p = prepare_prompt(toks)
        ent = -(-len(toks) // 64) + 1 if ent is None else ent
        q = ix.quote(p, QuoteParams(ent, free, 10**6))
        st = ix.stage(q, lane, free)
        rb = ix.begin_restore(lane, [self.page() for _ in range(st.restore_pages_needed)])
        ix.activate(lane)
        if rb is not None:
            if self.land:
                ix.on_restore_landed(rb.batch_id)
            else:
                self.pending.append(rb.batch_id)
        self.prompts[lane] = toks
        return q, st

    def commit(self, lane: int, upto: int) -> list:
        """Commit the lane's full blocks below token `upto`."""
        ix, toks = self.ix, self.prompts[lane]
        out = []
        for b in range(len(ix.lane_path(lane)), upto // 64):
            out.append(ix.commit_block(lane, b, toks[64 * b : 64 * b + 64], self.page()))
        return out

    def snapshot(
        self, lane: int, frontier: int, kind: SnapshotKind = SnapshotKind.TAP
    ) -> PublishResult | None:
        ix, toks = self.ix, self.prompts[lane]
        need = frontier // 64 + (1 if frontier % 64 and kind != SnapshotKind.ENDPOINT else 0)
        self.commit(lane, 64 * need)
        grant = ix.allocate_snapshot_slot(lane, frontier, kind)
        if grant is None:
            return None
        tail = toks[frontier - frontier % 64 : frontier]
        res = ix.publish_snapshot(
            lane, frontier, grant.slot, kind, tail, self.page() if tail else None
        )
        if res.write is not None:
            if self.land:
                ix.on_write_through_landed(res.write.batch_id)
            else:
                self.pending.append(res.write.batch_id)
        return res

    def release(self, lane: int) -> ReleaseResult:
        res = self.ix.release(lane)
        if res.write is not None:
            if self.land:
                self.ix.on_write_through_landed(res.write.batch_id)
            else:
                self.pending.append(res.write.batch_id)
        return res

    def run(self, lane: int, toks: list[int], taps=(), endpoint: int | None = None):
        """Admit, commit every full prompt block, publish taps and an endpoint, release."""
        self.admit(lane, toks)
        out = [self.snapshot(lane, f) for f in taps]
        self.commit(lane, len(toks))
        if endpoint is not None:
            out.append(self.snapshot(lane, endpoint, SnapshotKind.ENDPOINT))
        self.release(lane)
        return out
