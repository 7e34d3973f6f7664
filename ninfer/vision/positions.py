"""The 3-D rotary positions (t, h, w) of a prompt with images, as transformers' Qwen3.5
`get_rope_index`, and the rope delta that places the tokens after the prompt.

    index     0 .. s-1  | s .. s+n-1: an image's n = t*h'*w' pad tokens | s+n, s+n+1, ...
    t         0 .. s-1  | s + frame                                     | p, p+1, ...
    h         0 .. s-1  | s + row      (h', w': the merged grid,        | p, p+1, ...
    w         0 .. s-1  | s + col       patch grid / merge)             | p, p+1, ...
                                                      with p = s + max(h', w')

Text tokens have t = h = w = a running position; an image's pad tokens, in raster order of its
merged grid (frame, row, col), get (s + frame, s + row, s + col), s being the position its
first pad token would have had as text; the text after it goes on from s + max(h', w'). So the
token at index i >= the prompt's length (a decoded one) sits at i + rope_delta on all three
axes.

A pure function of the prompt's length and its image spans (start index, patch grid): a cache
hit resuming after an image recomputes the same positions from the spans alone. Knows nothing
about the model, the tower or the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


class ImageSpan(NamedTuple):
    """An image's pad tokens in a prompt: from token index `start`, t*h*w / merge^2 of them,
    for its patch grid `grid` (t, h, w) (the processor's `image_grid_thw`, before merging)."""

    start: int
    grid: tuple[int, int, int]

    def merged(self, merge: int) -> tuple[int, int, int]:
        """The grid of merged tokens (t, h / merge, w / merge)."""
        t, h, w = self.grid
        return t, h // merge, w // merge

    def num_tokens(self, merge: int) -> int:
        t, h, w = self.merged(merge)
        return t * h * w

    def end(self, merge: int) -> int:
        """The index after its last pad token."""
        return self.start + self.num_tokens(merge)


def check_spans(num_tokens: int, spans: Sequence[ImageSpan], merge: int) -> None:
    """ValueError unless the spans are in order, disjoint, inside the prompt, and their grids
    divisible by `merge`."""
    end = 0
    for s in spans:
        t, h, w = s.grid
        if min(s.grid) < 1 or h % merge or w % merge:
            raise ValueError(f"image span {s}: grid not positive multiples of {merge}")
        if s.start < end or s.end(merge) > num_tokens:
            raise ValueError(f"image span {s}: overlaps another or passes the prompt's end")
        end = s.end(merge)


def mrope_positions(
    num_tokens: int, spans: Sequence[ImageSpan], merge: int
) -> tuple[torch.Tensor, int]:
    """(positions [3, num_tokens] int64 (t, h, w) of a prompt of `num_tokens` tokens with
    image `spans` (sorted by start), rope_delta: max position + 1 - num_tokens)."""
    check_spans(num_tokens, spans, merge)
    parts, pos, index = [], 0, 0
    for span in spans:
        parts.append(torch.arange(span.start - index).expand(3, -1) + pos)
        pos += span.start - index
        parts.append(_span_positions(span.merged(merge)) + pos)
        pos += max(span.merged(merge)[1:])
        index = span.end(merge)
    parts.append(torch.arange(num_tokens - index).expand(3, -1) + pos)
    positions = torch.cat(parts, dim=1)
    top = int(positions.max()) + 1 if num_tokens else 0
    return positions, top - num_tokens


def _span_positions(merged: tuple[int, int, int]) -> torch.Tensor:
    """[3, t*h*w] (frame, row, col) of a merged grid in raster order."""
    t, h, w = merged
    grid = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack(grid).reshape(3, -1)


def expand_image_pads(
    ids: Sequence[int], pad_id: int, grids: Sequence[tuple[int, int, int]], merge: int
) -> tuple[list[int], list[ImageSpan]]:
    """A rendered prompt's tokens with its k-th `pad_id` (one per image, as the chat template
    writes `<|vision_start|><|image_pad|><|vision_end|>`) repeated for image k's tokens
    (grid t*h*w / merge^2), and the spans they fill. ValueError unless there is one pad per
    grid."""
    pads = [i for i, tok in enumerate(ids) if tok == pad_id]
    if len(pads) != len(grids):
        raise ValueError(f"{len(pads)} image pad tokens for {len(grids)} images")
    out: list[int] = []
    spans, last = [], 0
    for at, grid in zip(pads, grids, strict=True):
        out += ids[last:at]
        span = ImageSpan(len(out), tuple(grid))
        out += [pad_id] * span.num_tokens(merge)
        spans.append(span)
        last = at + 1
    return out + list(ids[last:]), spans
