"""An image's cost: its encode (preprocessing and the vision tower), and the TTFT of a second
turn with the image in its history, served from the prefix cache vs computed cold.

    python -m ninfer.bench.vision --model CHECKPOINT [--device cuda] [--side 1024]
    python -m ninfer.bench.vision --preset 9B [--device cuda] [--side 1024]

CHECKPOINT is a folder with a vision tower (`vision_config`), a `preprocessor_config.json`
and a tokenizer with a chat template. A preset is built in memory with random weights: the
text model of that released shape (`ninfer.models.presets.PRESETS`), the released vision tower
and image processor (`vision_preset`, `IMAGE_PROCESSOR`), and the demo's tokenizer with the
vision tokens at their released ids (`ninfer.demo.demo_vision_tokenizer`). The cached run and
the cold run use two engines one after the other (`prefix_reuse` on, then off; never two
models in memory: a preset's model is built again for the cold engine, from the same seed);
each first answers an unrelated request with an image, untimed. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import numpy as np
import torch
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


# engine options -> an open LLM, closed (its model released) when the context exits
OpenLLM = Callable[..., AbstractContextManager]


@contextlib.contextmanager
def checkpoint_llm(path: str, **options) -> Iterator:
    """An LLM over the checkpoint folder `path`."""
    from ninfer.llm import LLM

    with LLM(path, **options) as llm:
        yield llm


@contextlib.contextmanager
def preset_llm(text, vision, processor, seed: int = 0, **options) -> Iterator:
    """An LLM over a random model of shapes `text` (`Qwen35Config`) and `vision`
    (`VisionConfig`), built on entry in the dtype the options resolve to, with the image
    processor `processor` and the demo's tokenizer with the vision tokens."""
    from ninfer.chat_template import ChatTemplate
    from ninfer.config import EngineOptions, probe_device, resolve_dtypes
    from ninfer.demo import demo_vision_tokenizer
    from ninfer.dtypes import torch_dtype
    from ninfer.llm import LLM
    from ninfer.models.presets import build_random_vl_model

    device = probe_device(options.get("device", "auto")).device
    dtype = resolve_dtypes(EngineOptions(**options), device.startswith("cuda"))[0]
    model = build_random_vl_model(text, vision, torch_dtype(dtype), device, seed)
    tokenizer = demo_vision_tokenizer()
    template = ChatTemplate(tokenizer)
    llm = LLM.from_model(model, tokenizer, template, image_processor=processor, **options)
    del model  # the engine holds it until it closes
    with llm:
        yield llm


def _device_label(device: str) -> str:
    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return device


def _cached(open_llm: OpenLLM, options: dict, side: int, repeats: int) -> dict:
    """The encode figures, the first turn's TTFT and the second's, served from the cache."""
    image, other = _image(side, 0), _image(side, 1)
    with open_llm(**options) as llm:
        result = {"device": _device_label(llm.engine_config.memory.device)}
        result.update(encode_seconds(llm, other, repeats))
        _ttft(llm, _turns(other)[0])  # warm-up, untimed
        first, second = _turns(image)
        result["first_turn_ttft_s"] = _ttft(llm, first)
        out = _chat(llm, second)
        result["cached_turn_ttft_s"] = out.metrics.ttft_s
        result["cached_turn_tokens"] = (out.usage.cached_tokens, out.usage.prompt_tokens)
    return result


def _cold(open_llm: OpenLLM, options: dict, side: int) -> float:
    """The second turn's TTFT on an engine without prefix reuse."""
    with open_llm(prefix_reuse=False, **options) as cold:
        _ttft(cold, _turns(_image(side, 1))[0])
        return _ttft(cold, _turns(_image(side, 0))[1])


def run(open_llm: OpenLLM, device: str, side: int, repeats: int) -> dict:
    """Every figure, on the engines `open_llm` opens: the cached one, then the cold one."""
    options = dict(device=device, max_concurrency=2, host_cache_mib=0)
    result = _cached(open_llm, options, side, repeats)
    release_memory()
    result["cold_turn_ttft_s"] = _cold(open_llm, options, side)
    release_memory()
    return result


def run_checkpoint(path: str, device: str, side: int, repeats: int) -> dict:
    """`run` on engines over the checkpoint folder `path`."""
    return {"model": path} | run(functools.partial(checkpoint_llm, path), device, side, repeats)


def run_preset(text, vision, processor, device: str, side: int, repeats: int) -> dict:
    """`run` on random models of shapes `text` and `vision` with `processor` (seed 0)."""
    open_llm = functools.partial(preset_llm, text, vision, processor, 0)
    return run(open_llm, device, side, repeats)


def main(argv: list[str] | None = None) -> None:
    from ninfer.models.presets import IMAGE_PROCESSOR, PRESETS, vision_preset

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="checkpoint folder with a vision tower")
    which.add_argument("--preset", choices=tuple(PRESETS), help="released shape, random weights")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--side", type=int, default=1024, help="the square image's side in pixels")
    ap.add_argument("--repeats", type=int, default=5, help="encodes timed (median)")
    args = ap.parse_args(argv)
    if args.model is not None:
        result = run_checkpoint(args.model, args.device, args.side, args.repeats)
    else:
        text = PRESETS[args.preset]
        vision = vision_preset(text.hidden_size)
        figures = run_preset(text, vision, IMAGE_PROCESSOR, args.device, args.side, args.repeats)
        result = {"preset": args.preset} | figures
    print(json.dumps(result))


if __name__ == "__main__":
    main()
