"""§9.3: a snapshot published above a superseded one re-values the retained snapshots below it.

Found by the soak (ninfer.bench.soak): a new snapshot S that takes over a superseded dependent B
changes the nearest retained ancestor, hence C(s), of every retained snapshot hanging below B,
not just of B. Only B was marked dirty, so their cached H kept the old (root-based) value and
GDSF evicted in the wrong order.
"""

from __future__ import annotations

from tests.cache.cache_helpers import IMAGE, SLAB, Driver, make_index, tokens


def _scenario():
    """Returns the index and the snapshots {name: Snapshot}.

    Lane 0 taps a prompt at 256 (B) then 384 (C): B is superseded by C (same prompt), C's
    nearest retained ancestor is the root. Lane 2 shares the first 3 blocks and taps at 320 (D),
    so those blocks have two retained snapshots below them (the new snapshot's walk up the path
    does not re-value C by accident). Lane 1 then taps the shared prefix at 128 (S): S takes
    over B, and C now values against S.
    """
    ix = make_index()
    d = Driver(ix)
    t = tokens(1, 512)
    d.run(0, t, taps=[256, 384])
    d.run(2, t[:192] + tokens(2, 320), taps=[320])
    d.run(1, t[:200], taps=[128])
    by_frontier = {s.frontier: s for s in ix.snapshots.by_id.values()}
    names = {"B": 256, "C": 384, "D": 320, "S": 128}
    return ix, {k: by_frontier[f] for k, f in names.items()}


def test_snapshot_above_superseded_dependent_revalues_the_ones_below():
    ix, s = _scenario()
    assert s["B"].superseded and not s["C"].superseded
    assert s["B"].ancestor == s["S"].id and s["C"].ancestor == s["B"].id
    ix.check_invariants()  # §9.3 stale H of C before the fix
    # exact_cost: C(s) = (F_s - F_a) - 1 s, against the nearest retained ancestor a.
    # C: a = S (128); exclusive path = its blocks 3..5 (0..2 are shared with D).
    assert s["C"].h == (384 - 128 - 1) / (IMAGE + 3 * SLAB)
    # D: a = S; exclusive path = its blocks 3..4.
    assert s["D"].h == (320 - 128 - 1) / (IMAGE + 2 * SLAB)
    # S: a = root; no exclusive block (C and D hang below all of its path).
    assert s["S"].h == (128 - 1) / IMAGE


def test_gdsf_victim_order_after_the_takeover():
    ix, s = _scenario()
    ix.host_tier.flush()
    retained = [x for x in ix.snapshots.by_id.values() if not x.superseded]
    order = sorted(retained, key=lambda x: (x.h, x.last_hit, x.id))
    # The stale value priced C as a re-prefill from the root (383 s) and put it last.
    assert [x.id for x in order] == [s["D"].id, s["C"].id, s["S"].id]
    assert ix.host_tier.victim() is s["D"]
