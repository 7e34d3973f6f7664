"""Spec §13.1 BlockTree: exact identity, collisions, media keys, tail snapshots, F <= n-1,
duplicate publication."""

from __future__ import annotations

import xxhash
from cache_helpers import Driver, make_index, tokens

from ninfer.cache import (
    CommitKind,
    MediaItem,
    SnapshotKind,
    prepare_prompt,
)
from ninfer.cache.keys import HASH_SEED, block_hash, block_hashes, pack_tokens


def test_block_hashes_chain_and_match_block_hash():
    data = pack_tokens(tokens(1, 200))
    hs = block_hashes(data)
    assert len(hs) == 3  # full blocks only
    h = HASH_SEED
    for b in range(3):
        h = block_hash(h, data[256 * b : 256 * b + 256])
        assert hs[b] == h
    # a change in block 0 changes every later hash (the chain)
    other = block_hashes(pack_tokens([7] + tokens(1, 200)[1:]))
    assert all(a != b for a, b in zip(hs, other, strict=True))


def test_insert_then_match_exact_tokens():
    ix = make_index()
    d = Driver(ix)
    a = tokens(1, 200)
    d.admit(1, a)
    res = d.commit(1, 192)
    assert [r.kind for r in res] == [CommitKind.INSERTED] * 3
    assert [r.node for r in res] == [1, 2, 3]
    # n = 200: blocks b < floor(199 / 64) = 3 are walked
    m = ix.match(prepare_prompt(a))
    assert m.path == [1, 2, 3] and m.cached_prefix_tokens == 192
    # n = 192: only b < floor(191/64) = 2: a frontier at 192 would leave nothing to prefill
    assert ix.match(prepare_prompt(a[:192])).path == [1, 2]
    b = a[:100] + [5] + a[101:]  # differs inside block 1
    assert ix.match(prepare_prompt(b)).path == [1]
    ix.check_invariants()


def test_forced_constant_lookup_hash_never_false_hits():
    ix = make_index()
    d = Driver(ix)
    a, b, c = tokens(1, 130), tokens(2, 130), tokens(3, 130)
    d.prompts[1] = a
    d.admit(1, a)
    for blk in range(2):  # every block of every prompt collides on hash 7
        ix.commit_block(1, blk, a[64 * blk : 64 * blk + 64], d.page(), lookup_hash=7)
    d.admit(2, b)
    r = [ix.commit_block(2, k, b[64 * k : 64 * k + 64], d.page(), lookup_hash=7) for k in (0, 1)]
    assert [x.kind for x in r] == [CommitKind.INSERTED, CommitKind.INSERTED]
    assert [x.node for x in r] == [3, 4]
    ix.check_invariants()

    def forced(toks):
        p = prepare_prompt(toks)
        p.hashes = [7] * len(p.hashes)
        return p

    assert ix.match(forced(a)).path == [1, 2]
    assert ix.match(forced(b)).path == [3, 4]
    assert ix.match(forced(c)).path == []
    # a collision with the right tokens under the wrong parent is a miss too
    assert ix.match(forced(a[:64] + b[64:])).path == [1]


def _media(digest: bytes) -> list[MediaItem]:
    return [MediaItem(digest, modality=1, grid=(2, 4, 4), begin=70, length=40)]


def test_media_digest_changes_the_key_of_overlapping_blocks_only():
    toks = tokens(1, 300)
    p1 = prepare_prompt(toks, _media(b"\x01" * 32))
    p2 = prepare_prompt(toks, _media(b"\x02" * 32))
    # span [70, 110) overlaps block 1 only; blocks after it carry 0 (the chain covers them)
    assert p1.extras[0] == 0 and p1.extras[1] != 0 and p1.extras[2:] == [0, 0]
    assert p1.extras[1] != p2.extras[1]
    assert p1.hashes[0] == p2.hashes[0] and p1.hashes[1] != p2.hashes[1]


def test_different_media_digest_with_same_tokens_misses():
    ix = make_index()
    d = Driver(ix)
    toks = tokens(1, 300)
    p1 = prepare_prompt(toks, _media(b"\x01" * 32))
    d.admit(1, toks)
    for b in range(4):
        ix.commit_block(1, b, toks[64 * b : 64 * b + 64], d.page(), extra=p1.extra(b))
    assert ix.match(p1).path == [1, 2, 3, 4]
    p2 = prepare_prompt(toks, _media(b"\x02" * 32))
    assert ix.match(p2).path == [1]  # the image block differs, so does everything after it
    assert ix.match(prepare_prompt(toks)).path == [1]  # no media at all: extra 0 != key


def test_tail_snapshot_matches_exact_tail_tokens_only():
    ix = make_index()
    d = Driver(ix)
    a = tokens(1, 90)
    d.admit(1, a)
    res = d.snapshot(1, 74, SnapshotKind.ENDPOINT)  # anchor node 1, tail a[64:74]
    assert res.snapshot == 1 and not res.duplicate
    s = ix.snapshot(1)
    assert (s.anchor, s.frontier, s.tail_len) == (1, 74, 10)
    d.release(1)
    assert ix.match(prepare_prompt(a)).candidates == [1]
    assert ix.match(prepare_prompt(a[:74] + [9, 9, 9])).candidates == [1]
    diverge = a[:73] + [9] + a[74:]  # last tail token differs
    assert ix.match(prepare_prompt(diverge)).candidates == []
    ix.check_invariants()


def test_frontier_at_most_n_minus_1():
    ix = make_index()
    d = Driver(ix)
    a = tokens(1, 200)
    d.run(1, a, taps=[128], endpoint=150)
    assert ix.match(prepare_prompt(a[:151])).candidates == [2, 1]  # F=150 <= 150
    assert ix.match(prepare_prompt(a[:150])).candidates == [1]  # F=150 > 149: no full hit
    assert ix.match(prepare_prompt(a[:129])).candidates == [1]
    assert ix.match(prepare_prompt(a[:128])).candidates == []


def test_duplicate_publication_is_a_noop_that_refreshes_recency():
    ix = make_index()
    d = Driver(ix)
    a = tokens(1, 200)
    d.admit(1, a)  # two identical prompts prefill side by side from the root
    d.admit(2, a)
    first = d.snapshot(1, 128)
    assert first.snapshot == 1 and not first.duplicate
    before = ix.snapshot(1).last_hit
    assert [r.kind for r in d.commit(2, 128)] == [CommitKind.DUPLICATE] * 2
    free_slots = ix.snapshots.slots.free_count
    grant = ix.allocate_snapshot_slot(2, 128, SnapshotKind.TAP)
    assert ix.snapshots.slots.free_count == free_slots - 1
    dup = ix.publish_snapshot(2, 128, grant.slot, SnapshotKind.TAP)
    assert dup.snapshot == 1 and dup.duplicate and dup.write is None
    assert len(ix.snapshots.by_id) == 1 and ix.snapshot(1).device_slot == 0
    assert ix.snapshots.slots.free_count == free_slots  # the staging slot went back
    assert ix.snapshot(1).last_hit > before
    assert ix.counters.snapshots_duplicate == 1
    ix.check_invariants()


def test_vision_span_frontier_is_never_a_candidate():
    ix = make_index()
    d = Driver(ix)
    toks = tokens(1, 300)
    d.run(1, toks, taps=[128])
    items = [MediaItem(b"\x03" * 32, 1, (1,), begin=120, length=20)]  # 128 inside (120, 140)
    p = prepare_prompt(toks, items)
    p.extras = [0] * len(p.extras)  # same keys as stored, only the span differs
    p.hashes = prepare_prompt(toks).hashes
    assert ix.match(p).path == [1, 2, 3, 4]
    assert ix.match(p).candidates == []


def test_media_key_covers_every_earlier_item():
    img0 = MediaItem(b"\x05" * 32, modality=1, grid=(1, 2, 2), begin=10, length=20)  # block 0
    img1 = MediaItem(b"\x06" * 32, modality=1, grid=(1, 4, 4), begin=130, length=100)  # 2, 3
    extras = prepare_prompt(tokens(1, 400), [img1, img0]).extras
    k0 = xxhash.xxh3_64_intdigest(img0.encode())
    k01 = xxhash.xxh3_64_intdigest(img0.encode() + img1.encode())
    assert extras == [k0, 0, k01, k01, 0, 0]
