"""A rendered prompt's images made ready for the model: each image processed
(`preprocess.process_image`), its one pad token expanded to the image's tokens, the spans they
fill and the rope delta of the tokens after the prompt (`positions`).

    rendered  ... <|vision_start|> <|image_pad|> <|vision_end|> ...
    expanded  ... <|vision_start|> <|image_pad|> x n_k          <|vision_end|> ...
                                   |<- span k: start, grid --->|

Knows nothing about the model, the engine or the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ninfer.vision.positions import ImageSpan, expand_image_pads, mrope_positions
from ninfer.vision.preprocess import ImageProcessorConfig, ProcessedImage, process_image


@dataclass(frozen=True, slots=True)
class VisionPrompt:
    """The images of one expanded prompt: image k is `images[k]` at `spans[k]`."""

    images: tuple[ProcessedImage, ...]
    spans: tuple[ImageSpan, ...]
    merge: int  # the tower's spatial merge size
    rope_delta: int  # a token at index i >= the prompt's length sits at i + rope_delta

    def span_tokens(self) -> list[tuple[int, int]]:
        """(start, length) of each image's pad tokens."""
        return [(s.start, s.num_tokens(self.merge)) for s in self.spans]


def expand(
    ids: Sequence[int], images: Sequence, cfg: ImageProcessorConfig, pad_id: int
) -> tuple[list[int], VisionPrompt]:
    """(`ids` with image k's pad expanded to its tokens, its VisionPrompt) for the PIL
    `images`, one per `pad_id` in `ids`, in order. ValueError when an image cannot be
    processed (naming it by its order) or the pads do not match the images."""
    done = []
    for k, image in enumerate(images):
        try:
            done.append(process_image(image, cfg))
        except ValueError as e:
            raise ValueError(f"messages: image {k + 1}: {e}") from None
    grids = [p.grid for p in done]
    expanded, spans = expand_image_pads(ids, pad_id, grids, cfg.merge_size)
    _, delta = mrope_positions(len(expanded), spans, cfg.merge_size)
    return expanded, VisionPrompt(tuple(done), tuple(spans), cfg.merge_size, delta)
