"""A prompt's images as the engine carries them: processed pixels, spans, 3-D positions.

`PromptImages.build` turns a rendered prompt (one `<|image_pad|>` per image) and its decoded
images into the expanded token ids and this record; the Request keeps it. Each pass over the
request's tokens [start, end) asks `row_inputs` for its rows' (t, h, w) positions and the
tower's output at the image pad tokens it computes; the tower sees whole images, encoded the
first time a pass touches one and kept for later chunks and passes (a cache hit resuming past
an image never encodes it):

    tokens      text | image 0 pads | text | image 1 pads | text | generated ...
    positions   mrope_positions(prompt) ......................... | index + rope_delta
    a pass      [start ........ end): encodes image 0 and image 1, embeds its pad rows

`media_items` are the cache's identity of the images (`cache.keys.MediaItem`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ninfer.cache.keys import MediaItem
from ninfer.vision.positions import ImageSpan, expand_image_pads, mrope_positions
from ninfer.vision.preprocess import ImageProcessorConfig, ProcessedImage, process_image

IMAGE_MODALITY = 1


def media_items(request) -> list[MediaItem]:
    """The cache identity of a Request's images (none for a text prompt)."""
    return [] if request.images is None else request.images.media_items()


@dataclass(slots=True)
class RowImages:
    """A row's image inputs: [3, q] positions and the tower's output at some of its tokens
    (`rows`: indices into the row's tokens), or no embeddings."""

    positions: torch.Tensor
    rows: torch.Tensor | None = None
    values: torch.Tensor | None = None


@dataclass(slots=True)
class PromptImages:
    """The images of one prompt: processed, where their pad tokens lie, and its positions."""

    images: list[ProcessedImage]
    spans: list[ImageSpan]
    merge: int
    positions: torch.Tensor  # [3, prompt length] int64
    rope_delta: int
    encoded: dict[int, torch.Tensor] = field(default_factory=dict)  # image index -> tower out

    @classmethod
    def build(
        cls, ids: Sequence[int], pad_id: int, images: Sequence, cfg: ImageProcessorConfig
    ) -> tuple[list[int], PromptImages]:
        """(the ids with each pad expanded to its image's tokens, the record). ValueError
        naming the image that cannot be processed."""
        done = []
        for k, image in enumerate(images):
            try:
                done.append(process_image(image, cfg))
            except ValueError as e:
                raise ValueError(f"messages: image {k}: {e}") from None
        merge = cfg.merge_size
        out, spans = expand_image_pads(ids, pad_id, [p.grid for p in done], merge)
        positions, delta = mrope_positions(len(out), spans, merge)
        return out, cls(done, spans, merge, positions, delta)

    @property
    def prompt_len(self) -> int:
        return self.positions.shape[1]

    def media_items(self) -> list[MediaItem]:
        """The cache identity of each image: its digest and grid, where its pads lie."""
        return [
            MediaItem(p.digest, IMAGE_MODALITY, p.grid, s.start, s.num_tokens(self.merge))
            for p, s in zip(self.images, self.spans, strict=True)
        ]

    def shift(self, positions: Sequence[int]) -> list[int]:
        """Token positions of the rendered prompt (one pad per image) in the expanded one: a
        position past an image's pad moves by its tokens less one."""
        pads, before = [], 0
        for s in self.spans:  # the k-th pad's index before expansion
            pads.append(s.start - before)
            before += s.num_tokens(self.merge) - 1
        growth = [s.num_tokens(self.merge) - 1 for s in self.spans]
        return [p + sum(g for a, g in zip(pads, growth, strict=True) if a < p) for p in positions]

    def row_positions(self, start: int, end: int) -> torch.Tensor:
        """[3, end - start] positions of tokens [start, end); past the prompt index + delta."""
        n = self.prompt_len
        head = self.positions[:, start : min(end, n)]
        tail = torch.arange(max(start, n), max(end, n), dtype=torch.int64) + self.rope_delta
        return torch.cat([head, tail.expand(3, -1)], dim=1)

    def row_inputs(self, start: int, end: int, encode: Callable) -> RowImages:
        """The inputs of a pass over tokens [start, end): positions, and the embeddings of
        the pad tokens inside it, each overlapping image encoded whole by `encode(processed
        image)` once for the request."""
        rows, values = [], []
        for k, span in enumerate(self.spans):
            lo, hi = max(start, span.start), min(end, span.end(self.merge))
            if lo >= hi:
                continue
            if k not in self.encoded:
                self.encoded[k] = encode(self.images[k])
            rows.append(torch.arange(lo - start, hi - start))
            values.append(self.encoded[k][lo - span.start : hi - span.start])
        out = RowImages(self.row_positions(start, end))
        if rows:
            out.rows, out.values = torch.cat(rows), torch.cat(values)
        return out


class EncoderCache:
    """The vision tower's outputs by image digest, least recently used first out, within
    `capacity` bytes (an output larger than that is not kept); hits and misses counted in
    `counters` (`engine.kv.counters.EngineCounters`)."""

    def __init__(self, capacity: int, counters) -> None:
        self.capacity = capacity
        self.counters = counters
        self.used = 0
        self._outputs: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def encode(self, image: ProcessedImage, tower: Callable) -> torch.Tensor:
        """`tower(pixel_values, [grid])` of `image`, or the output kept for its digest."""
        out = self._outputs.get(image.digest)
        if out is not None:
            self._outputs.move_to_end(image.digest)
            self.counters.encoder_cache_hits += 1
            return out
        self.counters.encoder_cache_misses += 1
        out = tower(image.pixel_values, [image.grid])
        self._keep(image.digest, out)
        return out

    def _keep(self, digest: bytes, out: torch.Tensor) -> None:
        size = out.numel() * out.element_size()
        if size > self.capacity:
            return
        while self.used + size > self.capacity:
            _, old = self._outputs.popitem(last=False)
            self.used -= old.numel() * old.element_size()
        self._outputs[digest] = out
        self.used += size
