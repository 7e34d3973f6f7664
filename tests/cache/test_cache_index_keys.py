"""The index's gauges, its tap planning entry point, block keys at media-span edges and Host-only
block loading (spec §5.1, §5.5, §7.1, §11): exact values, not just counters."""

from __future__ import annotations

import pytest
import xxhash
from cache_helpers import SLAB, Driver, make_index, tokens

from ninfer.cache import (
    ROOT,
    CacheCostModel,
    HintKind,
    LaneError,
    Placement,
    QuoteParams,
    SnapshotKind,
    Span,
    TapConfig,
    TapHint,
    prepare_prompt,
)
from ninfer.cache.keys import (
    MediaItem,
    PromptBlocks,
    block_hash,
    block_hashes,
    hash_blocks,
    media_block_extras,
    pack_tokens,
    split_blocks,
)

E, F = Placement.EXACT, Placement.FLEXIBLE


# ---- gauges -----------------------------------------------------------------------------------


def test_stats_gauges_count_every_copy():
    ix = make_index(host_slabs=64, slots=4)
    d = Driver(ix)
    toks = tokens(1, 300)
    d.admit(1, toks)
    d.snapshot(1, 64)  # s1 @64: superseded by s2
    d.commit(1, 192)
    grant = ix.allocate_snapshot_slot(1, 130, SnapshotKind.TAP)
    # tail page id 0 is a valid page: the gauge counts pages >= 0
    ix.publish_snapshot(1, 130, grant.slot, SnapshotKind.TAP, toks[128:130], 0)
    d.release(1)  # blocks 0-2 written to Host (block 2 is dead KV: nothing below s2 keeps it)
    st = ix.stats()
    assert (st.snapshots, st.snapshots_superseded) == (2, 1)
    assert (st.snapshots_device, st.snapshots_host) == (2, 2)
    assert st.snapshot_tails_device == 1
    assert (st.nodes, st.nodes_device, st.nodes_host) == (3, 3, 3)
    assert st.device_cached_pages == 4
    assert st.host_block_bytes == 3 * SLAB
    # s1: image (2 slabs); s2: image + tail slab (3)
    assert st.host_snapshot_bytes == 5 * SLAB
    assert (st.host_slabs_total, st.host_slabs_free) == (64, 64 - 8)


def test_stats_without_a_host_tier():
    ix = make_index(host_slabs=0, slots=2)
    d = Driver(ix)
    d.run(1, tokens(1, 129), taps=[128])
    st = ix.stats()
    assert (st.host_slabs_total, st.host_slabs_free) == (0, 0)
    assert (st.host_block_bytes, st.host_snapshot_bytes, st.snapshots_host) == (0, 0, 0)
    assert st.snapshots == 1 and st.snapshots_device == 1


# ---- tap planning through the index --------------------------------------------------------------


def _resumed(kind: SnapshotKind, config: TapConfig | None = None):
    """A lane resumed from a snapshot at 256 (kind `kind`) of a 1000-token prompt."""
    ix = make_index(host_slabs=64, slots=4, taps=config)
    d = Driver(ix)
    toks = tokens(1, 1000)
    d.admit(1, toks[:300])
    if kind == SnapshotKind.ENDPOINT:
        d.commit(1, 256)
        d.snapshot(1, 256, SnapshotKind.ENDPOINT)
    else:
        d.snapshot(1, 256)
    d.release(1)
    d.admit(2, toks)
    return ix


OPENER = [TapHint(900, HintKind.OPENER)]


def test_index_plans_from_the_lanes_base_and_source_kind():
    ix = _resumed(SnapshotKind.TAP)
    assert ix.plan_taps(2, 1000, OPENER) == [
        (900, E, 2, False, 900),
        (960, F, 4, False, 999),
    ]
    # the caller may say the lane resumed from an endpoint: then the opener is not tapped
    assert ix.plan_taps(2, 1000, OPENER, resumed_from_endpoint=True) == [(960, F, 4, False, 999)]
    assert ix.counters.taps_planned == 3
    ix = _resumed(SnapshotKind.ENDPOINT)
    assert ix.plan_taps(2, 1000, OPENER) == [(960, F, 4, False, 999)]
    assert ix.plan_taps(2, 1000, OPENER, resumed_from_endpoint=False)[0] == (900, E, 2, False, 900)
    # a structural end 64 past the base (256) is covered by it; Vision spans move the tail
    hints = [TapHint(320, HintKind.STRUCTURAL)]
    assert ix.plan_taps(2, 1000, hints, [Span(950, 50)]) == [(896, F, 4, False, 950)]


def test_index_plans_with_its_configured_budget():
    one = TapConfig(max_new_taps=1, ladder_tokens=4096, min_gap_tokens=1024)
    ix = _resumed(SnapshotKind.TAP, one)
    hints = [TapHint(500, HintKind.EXPLICIT), TapHint(700, HintKind.EXPLICIT)]
    assert ix.plan_taps(2, 1000, hints) == [(500, E, 1, True, 500)]
    assert ix.counters.taps_planned == 1


# ---- block keys --------------------------------------------------------------------------------


def test_block_hashes_with_media_keys_chain_the_keys():
    data = pack_tokens(tokens(1, 192))
    extras = [0, 7, 0]
    assert block_hashes(data, extras) == hash_blocks(split_blocks(data), extras)
    plain = block_hashes(data)
    with_key = block_hashes(data, extras)
    assert with_key[0] == plain[0] and with_key[1] != plain[1] and with_key[2] != plain[2]


def test_media_keys_at_block_edges():
    img0 = MediaItem(b"\x05" * 32, modality=1, grid=(1, 2, 2), begin=10, length=54)  # ends at 64
    img1 = MediaItem(b"\x06" * 32, modality=1, grid=(1, 4, 4), begin=128, length=10)  # block 2
    extras = media_block_extras(256, [img1, img0])
    # block 0 holds img0 only: img1 begins at block 2's start, not before block 0's end
    assert extras[0] == xxhash.xxh3_64_intdigest(img0.encode())
    # block 1 starts where img0 ends and ends where img1 begins: no overlap
    assert extras[1] == 0
    assert extras[2] == xxhash.xxh3_64_intdigest(img0.encode() + img1.encode())
    assert extras[3] == 0


def test_media_item_with_a_large_modality_encodes():
    item = MediaItem(b"\x01" * 32, modality=200, grid=(1, 2), begin=0, length=64)
    enc = item.encode()
    assert enc[32] == 200 and len(enc) == 32 + 1 + 4 + 8 + 8 + 2 * 4


def test_text_prompt_has_no_media_key():
    p = prepare_prompt(tokens(1, 128))
    assert p.extras == [] and [p.extra(0), p.extra(1)] == [0, 0]


# ---- Host-only loading ---------------------------------------------------------------------------


def test_load_block_keys_media_and_deduplicates():
    ix = make_index(host_slabs=8)
    toks = tokens(1, 128)
    media = [MediaItem(b"\x07" * 32, modality=1, grid=(1, 2, 2), begin=70, length=20)]
    p = prepare_prompt(toks, media)
    epoch = ix.cache_epoch
    n0 = ix.load_block(ROOT, toks[:64])
    n1 = ix.load_block(n0, toks[64:], extra=p.extras[1])
    assert ix.cache_epoch == epoch + 2
    assert [ix.node(n0).lookup_hash, ix.node(n1).lookup_hash] == p.hashes
    assert ix.host.free_slabs == 6
    # loading an equal block again returns the node and takes no slab
    assert ix.load_block(n0, toks[64:], extra=p.extras[1]) == n1
    assert ix.load_block(ROOT, pack_tokens(toks[:64])) == n0
    assert ix.host.free_slabs == 6 and ix.cache_epoch == epoch + 2
    # the same tokens without the media key are another block
    n2 = ix.load_block(n0, toks[64:])
    assert n2 != n1 and ix.host.free_slabs == 5
    # a lookup of the media prompt finds both loaded blocks
    q = ix.quote(prepare_prompt(toks + [5, 6], media), QuoteParams(4, 10**6, 10**6))
    assert q.match.path == [n0, n1] and q.match.cached_prefix_tokens == 128


def test_load_block_keeps_a_given_lookup_hash():
    ix = make_index(host_slabs=8)
    n0 = ix.load_block(ROOT, tokens(1, 64), lookup_hash=12345)
    assert ix.node(n0).lookup_hash == 12345


def test_load_block_refusals():
    ix = make_index(host_slabs=0)
    with pytest.raises(ValueError, match=r"^no free Host slab to load a block into$"):
        ix.load_block(ROOT, tokens(1, 64))
    with pytest.raises(ValueError, match=r"^a block holds 64 tokens$"):
        make_index(host_slabs=8).load_block(ROOT, tokens(1, 63))


def test_h200_cost_model_plans_8192_token_chunks():
    assert CacheCostModel.h200().chunk_tokens == 8192


def test_load_snapshot_ids_hits_epoch_and_l():
    ix = make_index(host_slabs=16)
    n0 = ix.load_block(ROOT, tokens(1, 64))
    n1 = ix.load_block(n0, tokens(1, 128)[64:])
    ix.host_tier.L = 0.25  # as after GDSF evictions: a loaded snapshot starts at the current L
    epoch = ix.cache_epoch
    a = ix.load_snapshot(n0, [])
    b = ix.load_snapshot(n1, [7, 8], SnapshotKind.BOUNDARY, hits=3)
    assert (a, b) == (1, 2) and ix.cache_epoch == epoch + 2
    sa, sb = ix.snapshot(a), ix.snapshot(b)
    assert (sa.frontier, sa.hits, sa.l_at, sa.host_slabs, sa.tail_slab) == (64, 0, 0.25, [2, 3], -1)
    assert (sb.frontier, sb.hits, sb.kind, sb.host_slabs, sb.tail_slab) == (
        130,
        3,
        SnapshotKind.BOUNDARY,
        [4, 5],
        6,
    )
    assert sb.ancestor == a
    ix.check_invariants()


def test_load_snapshot_refusals():
    ix = make_index(host_slabs=4)
    n0 = ix.load_block(ROOT, tokens(1, 64))
    ix.load_snapshot(n0, [])
    with pytest.raises(ValueError, match=r"^snapshot already present$"):
        ix.load_snapshot(n0, [])
    with pytest.raises(ValueError, match=r"^not enough free Host slabs to load a snapshot$"):
        ix.load_snapshot(n0, [5])  # 3 slabs, 1 free
    ix = make_index(host_slabs=0)
    with pytest.raises(ValueError, match=r"^not enough free Host slabs to load a snapshot$"):
        ix.load_snapshot(ROOT, [5])


def test_media_key_leaves_out_an_item_beginning_at_the_block_end():
    img0 = MediaItem(b"\x05" * 32, modality=1, grid=(1, 2, 2), begin=10, length=20)
    img1 = MediaItem(b"\x06" * 32, modality=1, grid=(1, 4, 4), begin=64, length=10)
    extras = media_block_extras(128, [img0, img1])
    assert extras[0] == xxhash.xxh3_64_intdigest(img0.encode())
    assert extras[1] == xxhash.xxh3_64_intdigest(img0.encode() + img1.encode())


def test_a_loaded_snapshot_is_valued_at_the_next_flush():
    ix = make_index(host_slabs=16)
    n0 = ix.load_block(ROOT, tokens(1, 64))
    sid = ix.load_snapshot(n0, [])
    ix.host_tier.flush()
    # C = 64 - 1; Z = image + its exclusive Host block
    assert ix.snapshot(sid).h == pytest.approx(63 / (8192 + 4096), rel=1e-12)
    # a snapshot loaded above another one owns no block exclusively (no walk marks it dirty)
    ix2 = make_index(host_slabs=16)
    m0 = ix2.load_block(ROOT, tokens(1, 64))
    m1 = ix2.load_block(m0, tokens(1, 128)[64:])
    deep = ix2.load_snapshot(m1, [])
    ix2.host_tier.flush()
    top = ix2.load_snapshot(m0, [])  # loaded second, above `deep`
    ix2.host_tier.flush()
    assert ix2.snapshot(top).h == pytest.approx(63 / 8192, rel=1e-12)
    assert ix2.snapshot(deep).h == pytest.approx(63 / (8192 + 4096), rel=1e-12)


def test_transfer_batches_are_numbered_in_order():
    ix = make_index(host_slabs=64)
    d = Driver(ix, land=False)
    d.admit(1, tokens(1, 300))
    d.snapshot(1, 128)
    d.snapshot(1, 192)
    d.release(1)
    assert d.pending == [1, 2, 3]  # two snapshot writes, then the blocks


def test_a_restore_landing_after_its_lane_was_released():
    ix = make_index(host_slabs=64, slots=4)
    d = Driver(ix)
    a = tokens(1, 200)
    d.run(1, a, taps=[128])
    ix.liveness.drop_snapshot_image_device(ix.snapshot(1))  # restores now read the Host copy
    d.land = False
    d.admit(2, a[:128] + [5, 6])
    assert ix.snapshot(1).restore_pins == 1
    ix.release(2)  # cancelled while its restore is in flight
    ix.on_restore_landed(d.pending[0])
    assert ix.snapshot(1).restore_pins == 0
    assert [ix.node(n).restore_pins for n in (1, 2)] == [0, 0]
    ix.check_invariants()


def test_taps_are_planned_before_the_lane_is_activated():
    ix = make_index(host_slabs=64)
    q = ix.quote(prepare_prompt(tokens(1, 1000)), QuoteParams(20, 10**6, 10**6))
    ix.stage(q, 1, 10**6)
    assert ix.plan_taps(1, 1000) == [(960, F, 4, False, 999)]


# ---- eviction counters, lane states, keys with media ---------------------------------------------


def test_device_eviction_counts_backed_and_unbacked_victims():
    ix = make_index(host_slabs=64)
    d = Driver(ix)
    d.run(1, tokens(1, 128))  # two blocks, written to Host: backed
    epoch = ix.cache_epoch
    assert len(ix.evict_device_pages(2)) == 2
    assert ix.cache_epoch == epoch + 1
    assert (ix.counters.device_evicted_backed, ix.counters.device_evicted_unbacked) == (2, 0)
    ix = make_index(host_slabs=0)
    d = Driver(ix)
    d.run(1, tokens(1, 64))
    d.run(2, tokens(2, 64))  # two unbacked blocks (no Host tier)
    assert len(ix.evict_device_pages(1)) == 1
    assert len(ix.evict_device_pages(1)) == 1
    assert (ix.counters.device_evicted_backed, ix.counters.device_evicted_unbacked) == (0, 2)


def test_lane_state_errors_name_the_state():
    ix = make_index(host_slabs=64)
    q = ix.quote(prepare_prompt(tokens(1, 300)), QuoteParams(10, 10**6, 10**6))
    ix.stage(q, 1, 10**6)
    assert ix.lane_path(1) == []  # readable before activation
    with pytest.raises(LaneError, match=r"^lane 1 is not activated$"):
        ix.allocate_snapshot_slot(1, 64, SnapshotKind.TAP)
    ix.activate(1)
    with pytest.raises(LaneError, match=r"^lane 1 is activated$"):
        ix.activate(1)


def test_block_hash_with_a_media_key_chains_from_the_parent():
    blk = pack_tokens(tokens(1, 64))
    expected = xxhash.xxh3_64_intdigest(blk + (7).to_bytes(8, "little"), 123)
    assert block_hash(123, blk, 7) == expected
    assert block_hash(124, blk, 7) != expected
    assert block_hash(123, blk) == xxhash.xxh3_64_intdigest(blk, 123)


def test_hash_blocks_refuses_a_key_list_of_another_length():
    blocks = split_blocks(pack_tokens(tokens(1, 128)))
    with pytest.raises(ValueError):
        hash_blocks(blocks, [0, 5, 0])


def test_restoring_one_byte_costs_its_transfer():
    cost = CacheCostModel(1.0, 0.0, 0.0, 64, h2d_bytes_per_s=4.0, batch_latency_s=0.5)
    assert cost.restore_seconds(1) == 0.75
    assert cost.restore_seconds(0) == 0.0


def test_a_snapshot_anchored_at_the_root_is_resumed_from():
    # an endpoint at 40 (< 64): anchored at the root, its 40 tokens all in the tail
    ix = make_index(host_slabs=64, slots=4)
    d = Driver(ix)
    toks = tokens(1, 40)
    d.admit(1, toks)
    res = d.snapshot(1, 40, SnapshotKind.ENDPOINT)
    d.release(1)
    s = ix.snapshot(res.snapshot)
    assert (s.anchor, s.anchor_depth, s.frontier) == (ROOT, -1, 40)
    q, _ = d.admit(2, toks + [7] * 30)
    assert (q.source, q.frontier) == (res.snapshot, 40)
    assert q.match.path == [] and not q.restore_tail  # its tail page is on the Device
    ix.check_invariants()


def test_prompt_blocks_split_their_data_unless_given_the_blocks():
    """PromptBlocks built from packed tokens alone cuts its own 64-token blocks; blocks already
    cut are kept as given (the same list, not a re-split)."""
    data = pack_tokens(list(range(130)))
    made = PromptBlocks(data, 130, hash_blocks(split_blocks(data)))
    assert made.blocks == [data[: 64 * 4], data[64 * 4 : 128 * 4]]
    given = split_blocks(data)
    assert PromptBlocks(data, 130, [], blocks=given).blocks is given
