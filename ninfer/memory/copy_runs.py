"""Copy planning for the Host tier: which contiguous byte ranges move, and in which order.

Pure integer arithmetic (no tensors), so plans are tested as exact lists. A plan is a list of
`Copy` (one contiguous Device byte range <-> one contiguous range of one Host chunk row) and,
for restores, `Mark`s where `Transfer` records an event (design §6.5):

    restore:  [prelude copies] Mark("prelude") [layer 0 copies] Mark(0) [layer 1 ...] Mark(1) ...
              (a layer with nothing to copy gets no Mark)

Device byte buffers are named by `Copy.dev`: "kv{i}" is full-attention layer i's pages, flat
[pages * page_bytes]; "ssm" / "conv" are the slot-major state pools, flat
[slots * n_gdn * layer_bytes].

KV: `(page, slab)` pairs are sorted by page and joined into `PageRun`s while page AND slab both
advance by one inside one chunk; a run moves as one copy per full-attention layer.

Image: byte o of a snapshot image is ssm bytes [0, n_gdn * ssm_layer) then conv bytes
[.., image_bytes), each slot-major as on the Device. Its k = image_slabs slabs (in the index's
order) hold it as a logical [n_fa, k, cell] array, row by row (see `ImageMap`):

    image bytes  |<---- row 0: k cells ---->|<---- row 1: k cells ---->| ... |<- row R ->|
    slab pos        0    1    2  ...  k-1      0    1    2  ...  k-1
    Host         chunk[c][0, l0 .. l0+k)      chunk[c][1, l0 .. l0+k)     (if the slabs are
                 one contiguous range          one contiguous range        consecutive)

so consecutive image slabs give n_fa large copies for a whole image and ~1-2 per GDN layer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ninfer.cache.host_pool import SlabGeometry

FULL = "full_attention"
LINEAR = "linear_attention"


class Copy(NamedTuple):
    """One contiguous copy: Device buffer `dev` bytes [dev_off, +nbytes) <-> Host chunk
    `chunk`, layer row `row`, bytes [host_off, +nbytes)."""

    dev: str
    dev_off: int
    chunk: int
    row: int
    host_off: int
    nbytes: int


class Mark(NamedTuple):
    """Record an event: everything before it belongs to `part` ("prelude" or a layer index)."""

    part: str | int


class PageRun(NamedTuple):
    page: int  # first Device page
    slab: int  # first global slab
    count: int


class SlotImage(NamedTuple):
    slot: int  # physical state slot
    slabs: tuple[int, ...]  # the image's slabs, in order (len == image_slabs)


@dataclass(frozen=True, slots=True)
class DeviceLayout:
    """What the planner knows about the Device pools (from `ModelCache` and the layer types)."""

    layer_types: tuple[str, ...]  # per model layer: "full_attention" | "linear_attention"
    page_bytes: int
    num_pages: int
    ssm_layer_bytes: int  # one slot, one GDN layer
    conv_layer_bytes: int
    num_slots: int

    @property
    def n_fa(self) -> int:
        return self.layer_types.count(FULL)

    @property
    def n_gdn(self) -> int:
        return self.layer_types.count(LINEAR)

    @property
    def image_bytes(self) -> int:
        return self.n_gdn * (self.ssm_layer_bytes + self.conv_layer_bytes)

    def kind_index(self) -> list[tuple[str, int]]:
        """Per model layer: (type, index among layers of that type)."""
        seen = {FULL: 0, LINEAR: 0}
        out = []
        for t in self.layer_types:
            out.append((t, seen[t]))
            seen[t] += 1
        return out


def coalesce_pages(pairs: Sequence[tuple[int, int]], geom: SlabGeometry) -> list[PageRun]:
    """Join (page, slab) pairs into runs of consecutive pages and consecutive slabs of one
    chunk, ordered by page. Raises ValueError on a repeated page or slab, IndexError on a slab
    out of range."""
    ordered = sorted(pairs)
    _check_unique([s for _, s in ordered], "slab")
    _check_unique([p for p, _ in ordered], "page")
    runs: list[PageRun] = []
    for page, slab in ordered:
        chunk, _ = geom.locate(slab)
        if runs:
            last = runs[-1]
            joins = page == last.page + last.count and slab == last.slab + last.count
            if joins and geom.locate(last.slab)[0] == chunk:
                runs[-1] = last._replace(count=last.count + 1)
                continue
        runs.append(PageRun(page, slab, 1))
    return runs


def kv_copies(runs: Sequence[PageRun], fa: int, geom: SlabGeometry) -> list[Copy]:
    """One copy per run for full-attention layer `fa`."""
    cell = geom.cell_bytes
    out = []
    for r in runs:
        chunk, local = geom.locate(r.slab)
        out.append(Copy(f"kv{fa}", r.page * cell, chunk, fa, local * cell, r.count * cell))
    return out


class ImageMap:
    """Where one image's bytes live: byte o is in row o // (k * cell), at slab position
    (o // cell) % k, offset o % cell within that cell (k = image_slabs, rows = fa rows)."""

    def __init__(self, slabs: Sequence[int], geom: SlabGeometry) -> None:
        if len(slabs) != geom.image_slabs:
            raise ValueError(f"an image spans {geom.image_slabs} slabs, got {len(slabs)}")
        _check_unique(slabs, "image slab")
        self.geom = geom
        self.k = len(slabs)
        # per slab position: (chunk, local slab, last position of its contiguous run)
        located = [geom.locate(s) for s in slabs]
        self._pos: list[tuple[int, int, int]] = [(0, 0, 0)] * self.k
        end = self.k - 1
        for p in range(self.k - 1, -1, -1):
            if p < self.k - 1:
                (c0, l0), (c1, l1) = located[p], located[p + 1]
                if not (c0 == c1 and l1 == l0 + 1):
                    end = p
            self._pos[p] = (*located[p], end)

    def spans(self, start: int, stop: int) -> Iterator[tuple[int, int, int, int, int]]:
        """Host pieces of image bytes [start, stop): (image_off, chunk, row, host_off, nbytes),
        each contiguous in one chunk row, in image order."""
        cell, k = self.geom.cell_bytes, self.k
        if not 0 <= start <= stop <= k * self.geom.slab_bytes:
            raise ValueError(f"image range [{start}, {stop}) outside the image's slabs")
        o = start
        while o < stop:
            row, within = divmod(o, k * cell)
            pos, off = divmod(within, cell)
            chunk, local, last = self._pos[pos]
            n = min(stop, row * k * cell + (last + 1) * cell) - o
            yield o, chunk, row, local * cell + off, n
            o += n


def image_range_copies(
    imap: ImageMap, start: int, stop: int, dev: str, dev_base: int
) -> list[Copy]:
    """Copies for image bytes [start, stop), which sit contiguously on the Device at
    `dev` bytes [dev_base, dev_base + stop - start)."""
    return [
        Copy(dev, dev_base + o - start, chunk, row, host_off, n)
        for o, chunk, row, host_off, n in imap.spans(start, stop)
    ]


def gdn_layer_copies(imap: ImageMap, slot: int, g: int, layout: DeviceLayout) -> list[Copy]:
    """GDN layer g's ssm then conv bytes of the image restored into state slot `slot`."""
    s, c, n = layout.ssm_layer_bytes, layout.conv_layer_bytes, layout.n_gdn
    ssm = image_range_copies(imap, g * s, (g + 1) * s, "ssm", (slot * n + g) * s)
    conv_start = n * s + g * c
    conv = image_range_copies(imap, conv_start, conv_start + c, "conv", (slot * n + g) * c)
    return ssm + conv


def plan_restore(
    layout: DeviceLayout,
    geom: SlabGeometry,
    pages: Sequence[tuple[int, int]] = (),
    tails: Sequence[tuple[int, int]] = (),
    images: Sequence[SlotImage] = (),
) -> list[Copy | Mark]:
    """Host -> Device plan in forward order: prelude (tail bundles, every layer), then per model
    layer its KV runs (full attention) or each image's state (GDN). Raises on bad ids."""
    _check_pages(layout, pages, tails)
    _check_unique([p for p, _ in (*pages, *tails)], "destination page")
    _check_unique([s for _, s in (*pages, *tails)], "source slab")
    _check_unique([im.slot for im in images], "destination slot")
    maps = [(im.slot, ImageMap(im.slabs, geom)) for im in _checked_images(layout, images)]
    tail_runs = coalesce_pages(tails, geom)
    plan: list[Copy | Mark] = [
        c for fa in range(layout.n_fa) for c in kv_copies(tail_runs, fa, geom)
    ]
    plan.append(Mark("prelude"))
    runs = coalesce_pages(pages, geom)
    for layer, (kind, idx) in enumerate(layout.kind_index()):
        if kind == FULL:
            part: list[Copy] = kv_copies(runs, idx, geom)
        else:
            part = [c for slot, imap in maps for c in gdn_layer_copies(imap, slot, idx, layout)]
        if part:
            plan.extend(part)
            plan.append(Mark(layer))
    return plan


def plan_write(
    layout: DeviceLayout,
    geom: SlabGeometry,
    pages: Sequence[tuple[int, int]] = (),
    images: Sequence[SlotImage] = (),
) -> list[Copy]:
    """Device -> Host plan (write-through, §7.6): page bundles (blocks and tails) per layer, then
    each image whole (ssm section, then conv section)."""
    _check_pages(layout, pages)
    runs = coalesce_pages(pages, geom)
    plan = [c for fa in range(layout.n_fa) for c in kv_copies(runs, fa, geom)]
    s_slot = layout.n_gdn * layout.ssm_layer_bytes
    c_slot = layout.n_gdn * layout.conv_layer_bytes
    _check_unique([s for _, s in pages] + [s for im in images for s in im.slabs], "slab")
    for im in _checked_images(layout, images):
        imap = ImageMap(im.slabs, geom)
        plan += image_range_copies(imap, 0, s_slot, "ssm", im.slot * s_slot)
        plan += image_range_copies(imap, s_slot, s_slot + c_slot, "conv", im.slot * c_slot)
    return plan


def _check_pages(layout: DeviceLayout, *lists: Sequence[tuple[int, int]]) -> None:
    for pairs in lists:
        for page, _ in pairs:
            if not 0 <= page < layout.num_pages:
                raise IndexError(f"page {page} out of range [0, {layout.num_pages})")


def _checked_images(layout: DeviceLayout, images: Sequence[SlotImage]) -> list[SlotImage]:
    out = []
    for slot, slabs in images:
        if not 0 <= slot < layout.num_slots:
            raise IndexError(f"state slot {slot} out of range [0, {layout.num_slots})")
        out.append(SlotImage(slot, tuple(slabs)))
    return out


def _check_unique(ids: Sequence[int], what: str) -> None:
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if list(ids).count(i) > 1})[:8]
        raise ValueError(f"{what} repeated in one batch: {dup}")
