"""An image's cost: its encode (preprocessing and the vision tower), and the TTFT of a second
turn with the image in its history, served from the prefix cache vs computed cold.

    python -m ninfer.bench.vision --model CHECKPOINT [--device cuda] [--side 1024]

CHECKPOINT is a folder with a vision tower (`vision_config`), a `preprocessor_config.json`
and a tokenizer with a chat template. The cached run and the cold run use two engines one
after the other (`prefix_reuse` on, then off; never two models in memory); each first answers
an unrelated request with an image, untimed. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from PIL import Image

from ninfer.probe import release_memory
from ninfer.request import SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def _image(side: int, seed: int) -> Image.Image:
    rgb = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return Image.fromarray(rgb)


def _turns(image: Image.Image) -> tuple[list[dict], list[dict]]:
    """(the first turn, the second with the first and its reply in the history). The first
    turn's text fills a few blocks past the image: a resume frontier needs whole blocks over
    an image (a snapshot's tail never covers one)."""
    ask = "Describe the picture: " + " ".join(f"detail {i}," for i in range(60))
    first = [{"role": "user", "content": [{"image": image}, ask]}]
    second = first + [
        {"role": "assistant", "content": "A field of coloured noise."},
        {"role": "user", "content": "What colour dominates?"},
    ]
    return first, second


def _chat(llm, messages: list[dict]):
    out = llm.chat([messages], GREEDY)[0]
    if out.error:
        raise RuntimeError(f"bench vision: request failed: {out.error}")
    return out


def _ttft(llm, messages: list[dict]) -> float:
    return _chat(llm, messages).metrics.ttft_s


def encode_seconds(llm, image: Image.Image, repeats: int) -> dict:
    """Median seconds of preprocessing and of the tower over `repeats` runs of one image."""
    from ninfer.vision.preprocess import process_image

    runner = llm.engine.runner
    cfg = llm.image_processor
    pre, tower = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        p = process_image(image, cfg)
        t1 = time.perf_counter()
        out = runner.encode_image(p.pixel_values, [p.grid])
        out.sum().item()  # wait for the device
        tower.append(time.perf_counter() - t1)
        pre.append(t1 - t0)
    return {"preprocess_s": statistics.median(pre), "tower_s": statistics.median(tower),
            "image_tokens": p.num_tokens}  # fmt: skip


def run(model: str, device: str, side: int, repeats: int) -> dict:
    from ninfer.llm import LLM

    image, other = _image(side, 0), _image(side, 1)
    first, second = _turns(image)
    options = dict(device=device, max_concurrency=2, host_cache_mib=0)
    with LLM(model, **options) as llm:
        result = encode_seconds(llm, other, repeats)
        _ttft(llm, _turns(other)[0])  # warm-up, untimed
        result["first_turn_ttft_s"] = _ttft(llm, first)
        out = _chat(llm, second)
        result["cached_turn_ttft_s"] = out.metrics.ttft_s
        result["cached_turn_tokens"] = (out.usage.cached_tokens, out.usage.prompt_tokens)
    release_memory()
    with LLM(model, prefix_reuse=False, **options) as cold:
        _ttft(cold, _turns(other)[0])
        result["cold_turn_ttft_s"] = _ttft(cold, second)
    release_memory()
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint folder with a vision tower")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--side", type=int, default=1024, help="the square image's side in pixels")
    ap.add_argument("--repeats", type=int, default=5, help="encodes timed (median)")
    args = ap.parse_args(argv)
    print(json.dumps(run(args.model, args.device, args.side, args.repeats)))


if __name__ == "__main__":
    main()
