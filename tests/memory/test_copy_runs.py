"""Copy planning: exact run lists, image byte mapping and the restore part order."""

from __future__ import annotations

import pytest

from ninfer.cache.host_pool import plan_slab_geometry
from ninfer.memory.copy_runs import (
    Copy,
    DeviceLayout,
    ImageMap,
    Mark,
    PageRun,
    SlotImage,
    coalesce_pages,
    gdn_layer_copies,
    kv_copies,
    plan_restore,
    plan_write,
)

L, F = "linear_attention", "full_attention"
# 2 full-attention layers of 1024-B pages (slab 2048 B); 6 GDN layers of 1024 B ssm + 48 B conv:
# image 6432 B -> 4 slabs, image rows of 4 cells (4096 B).
LAYOUT = DeviceLayout((L, L, L, F) * 2, 1024, 32, 1024, 48, 3)


def geom(slabs_per_chunk: int):
    return plan_slab_geometry(1, 2, 1024, LAYOUT.image_bytes, slabs_per_chunk * 2048)


def test_coalesce_joins_pages_and_slabs_within_a_chunk():
    g = geom(4)  # chunks: slabs 0-3, 4-7, 8-11, 12-15, ...
    runs = coalesce_pages([(5, 10), (6, 11), (7, 12), (3, 2), (8, 13)], g)
    assert runs == [PageRun(3, 2, 1), PageRun(5, 10, 2), PageRun(7, 12, 2)]
    assert kv_copies(runs, 1, g) == [
        Copy("kv1", 3 * 1024, 0, 1, 2 * 1024, 1024),
        Copy("kv1", 5 * 1024, 2, 1, 2 * 1024, 2048),
        Copy("kv1", 7 * 1024, 3, 1, 0, 2048),
    ]


@pytest.mark.parametrize(
    "pairs, runs",
    [
        ([], []),
        ([(0, 0), (1, 1), (2, 2)], [PageRun(0, 0, 3)]),  # one run, one chunk
        ([(2, 2), (0, 0), (1, 1)], [PageRun(0, 0, 3)]),  # input order does not matter
        ([(0, 1), (1, 2), (2, 3)], [PageRun(0, 1, 2), PageRun(2, 3, 1)]),  # crosses a chunk
        ([(0, 5), (1, 4), (2, 6)], [PageRun(0, 5, 1), PageRun(1, 4, 1), PageRun(2, 6, 1)]),
        ([(4, 0), (6, 1), (7, 2)], [PageRun(4, 0, 1), PageRun(6, 1, 2)]),  # page gap
    ],
    ids=["empty", "run", "unordered", "chunk-split", "slab-backwards", "page-gap"],
)
def test_coalesce_cases(pairs, runs):
    assert coalesce_pages(pairs, geom(3)) == runs


def test_coalesce_rejects_repeats_and_bad_slabs():
    with pytest.raises(ValueError, match="slab repeated"):
        coalesce_pages([(0, 1), (1, 1)], geom(3))
    with pytest.raises(ValueError, match="page repeated"):
        coalesce_pages([(0, 1), (0, 2)], geom(3))
    with pytest.raises(IndexError):
        coalesce_pages([(0, 10**6)], geom(3))


def test_image_map_spans_follow_runs_of_slabs():
    g = geom(4)
    imap = ImageMap([8, 9, 10, 4], g)  # positions 0-2 one run in chunk 2; position 3 in chunk 1
    assert list(imap.spans(0, LAYOUT.image_bytes)) == [
        (0, 2, 0, 0, 3072),
        (3072, 1, 0, 0, 1024),
        (4096, 2, 1, 0, 2336),
    ]
    # GDN layer 0 restored into slot 1: its ssm cell and its conv bytes (row 1, position 2)
    assert gdn_layer_copies(imap, 1, 0, LAYOUT) == [
        Copy("ssm", 6 * 1024, 2, 0, 0, 1024),
        Copy("conv", 6 * 48, 2, 1, 2048, 48),
    ]
    with pytest.raises(ValueError, match="spans 4 slabs"):
        ImageMap([1, 2, 3], g)


def test_whole_image_write_is_one_copy_per_row_when_slabs_are_consecutive():
    g = geom(8)
    plan = plan_write(LAYOUT, g, images=[SlotImage(2, (4, 5, 6, 7))])
    assert plan == [
        Copy("ssm", 2 * 6144, 0, 0, 4 * 1024, 4096),
        Copy("ssm", 2 * 6144 + 4096, 0, 1, 4 * 1024, 2048),
        Copy("conv", 2 * 288, 0, 1, 4 * 1024 + 2048, 288),
    ]


def test_restore_parts_follow_forward_order():
    g = geom(4)
    marks = lambda plan: [s.part for s in plan if isinstance(s, Mark)]
    image = [SlotImage(0, (0, 1, 2, 3))]
    full = plan_restore(LAYOUT, g, pages=[(1, 5)], tails=[(2, 9)], images=image)
    assert marks(full) == ["prelude", 0, 1, 2, 3, 4, 5, 6, 7]
    assert marks(plan_restore(LAYOUT, g, pages=[(1, 5)])) == ["prelude", 3, 7]
    assert marks(plan_restore(LAYOUT, g, images=image)) == ["prelude", 0, 1, 2, 4, 5, 6]
    # the prelude holds the tail bundle (every layer), full-attention layers their blocks
    assert full[: full.index(Mark("prelude"))] == [
        Copy("kv0", 2 * 1024, 2, 0, 1024, 1024),
        Copy("kv1", 2 * 1024, 2, 1, 1024, 1024),
    ]
    i3 = full.index(Mark(3))
    assert full[i3 - 1 : i3] == [Copy("kv0", 1024, 1, 0, 1024, 1024)]


def test_restore_rejects_conflicting_ids():
    g = geom(4)
    with pytest.raises(ValueError, match="destination page"):
        plan_restore(LAYOUT, g, pages=[(1, 5)], tails=[(1, 6)])
    with pytest.raises(ValueError, match="destination slot"):
        plan_restore(LAYOUT, g, images=[SlotImage(0, (0, 1, 2, 3)), SlotImage(0, (4, 5, 6, 7))])
    with pytest.raises(IndexError, match="page 32"):
        plan_restore(LAYOUT, g, pages=[(32, 0)])
    with pytest.raises(IndexError, match="state slot 3"):
        plan_restore(LAYOUT, g, images=[SlotImage(3, (0, 1, 2, 3))])
    with pytest.raises(ValueError, match="slab repeated"):
        plan_write(LAYOUT, g, pages=[(0, 1)], images=[SlotImage(0, (0, 1, 2, 3))])
