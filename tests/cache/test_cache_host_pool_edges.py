"""Edges of the Host slab geometry (spec §5.4): the defaults of a geometry cut without layer rows,
plain-int fields, what a prefix cache file records, the exact errors of an out-of-range slab,
of pages that cannot make a slab and of a budget below one snapshot plus one block, and the
smallest chunk a slab fits."""

from __future__ import annotations

import json

import pytest

from ninfer.cache import HostSlabPool
from ninfer.cache.host_pool import MIB, SlabGeometry, check_host_budget, cut_slabs
from ninfer.cache.host_pool import plan_slab_geometry as plan


def test_a_geometry_cut_without_layer_rows_has_one_cell_per_slab_and_no_image():
    g = cut_slabs(10 * 4096, 4096)
    assert g == SlabGeometry(
        n_fa_layers=1,
        cell_bytes=4096,
        slab_bytes=4096,
        num_slabs=10,
        slabs_per_chunk=10,
        image_bytes=0,
        image_slabs=0,
    )


def test_geometry_fields_are_plain_ints_and_the_file_records_the_layout():
    g = cut_slabs(7 * 3000 + 5, 3000, max_chunk_bytes=6000, image_bytes=6001, n_fa_layers=3)
    assert (g.n_fa_layers, g.cell_bytes, g.num_slabs, g.image_slabs) == (3, 1000, 7, 3)
    assert g.file_dict() == {
        "n_fa_layers": 3,
        "cell_bytes": 1000,
        "slab_bytes": 3000,
        "image_bytes": 6001,
        "image_slabs": 3,
    }
    assert json.dumps(g.file_dict(), sort_keys=True) == (
        '{"cell_bytes": 1000, "image_bytes": 6001, "image_slabs": 3, "n_fa_layers": 3, '
        '"slab_bytes": 3000}'
    )
    planned = plan(1, 4, 2048, 5 * 8192)
    assert all(type(v) is int for v in planned.file_dict().values())
    assert (planned.cell_bytes, planned.slab_bytes, planned.image_slabs) == (2048, 8192, 5)


def test_locating_a_slab_outside_the_tier_names_it_and_the_range():
    g = cut_slabs(5 * 4096, 4096, max_chunk_bytes=2 * 4096)
    assert [g.locate(s) for s in range(5)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    for bad in (5, -1):
        with pytest.raises(IndexError, match=rf"^slab {bad} out of range \[0, 5\)$"):
            g.locate(bad)


def test_pool_keeps_the_geometry_it_was_given():
    g = cut_slabs(6 * 4096, 4096, max_chunk_bytes=4 * 4096)
    pool = HostSlabPool(g)
    assert pool.geometry is g
    assert (pool.slab_bytes, pool.n_slabs, pool.slabs_per_chunk) == (4096, 6, 4)


def test_budget_error_states_the_least_budget_in_the_given_unit():
    g = cut_slabs(4 * 4096, 4096, image_bytes=3 * 4096)  # needs 3 + 1 + 1 = 5 slabs, has 4
    need = (
        "needs one snapshot plus one block (image 3 slabs + tail 1 + block 1): "
        "set {} >= {}, or 0 for no Host tier"
    )
    with pytest.raises(ValueError) as err:
        check_host_budget(g, "host_cache_bytes", 4 * 4096)
    assert str(err.value) == (
        "host_cache_bytes=16384 holds 4 slabs of 4096 B, but the Host tier "
        + need.format("host_cache_bytes", 5 * 4096)
    )
    with pytest.raises(ValueError) as err:
        check_host_budget(g, "host_kib", 16, 1024)
    assert str(err.value).endswith(need.format("host_kib", 20))
    check_host_budget(cut_slabs(5 * 4096, 4096, image_bytes=3 * 4096), "host_cache_bytes", 1)


@pytest.mark.parametrize(
    ("n_fa_layers", "page_bytes", "image_bytes"),
    [(0, 1024, 0), (-1, 1024, 0), (2, 0, 0), (2, -8, 0), (2, 1024, -1), (0, 0, 0)],
)
def test_pages_that_cannot_make_a_slab_are_rejected_by_name(n_fa_layers, page_bytes, image_bytes):
    msg = (
        f"Host slabs need full-attention pages: n_fa_layers={n_fa_layers}, "
        f"page_bytes={page_bytes}, image_bytes={image_bytes}"
    )
    with pytest.raises(ValueError) as err:
        plan(1, n_fa_layers, page_bytes, image_bytes)
    assert str(err.value) == msg


@pytest.mark.parametrize(
    ("n_fa_layers", "page_bytes", "image_bytes", "num_slabs", "image_slabs"),
    [
        (1, 4096, 0, 256, 0),  # one layer, no image: the smallest valid inputs
        (1, 1, 0, MIB, 0),  # one-byte pages
        (2, 1024, 1, 512, 1),
    ],
)
def test_smallest_valid_pages_make_a_geometry(
    n_fa_layers, page_bytes, image_bytes, num_slabs, image_slabs
):
    g = plan(1, n_fa_layers, page_bytes, image_bytes)
    assert (g.n_fa_layers, g.cell_bytes, g.slab_bytes) == (
        n_fa_layers,
        page_bytes,
        n_fa_layers * page_bytes,
    )
    assert (g.num_slabs, g.image_bytes, g.image_slabs) == (num_slabs, image_bytes, image_slabs)


def test_a_chunk_of_exactly_one_slab_is_enough():
    g = plan(1, 2, 1024, 0, max_chunk_bytes=2048)
    assert (g.slabs_per_chunk, g.num_chunks, g.chunk_slabs[-1]) == (1, 512, 1)
    with pytest.raises(ValueError) as err:
        plan(1, 2, 1024, 0, max_chunk_bytes=2047)
    assert str(err.value) == "a slab of 2048 B does not fit a chunk of 2047 B"
