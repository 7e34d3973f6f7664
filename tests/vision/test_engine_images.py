"""Images through the engine (fp32, CPU, a tiny random checkpoint with a vision tower): the
loader finds the tower, `LLM.chat` with images gives transformers' greedy tokens, the prefix
cache keys the images (same image hits, a different one misses, no resume inside a span)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from ninfer import LLM, SamplingParams
from tests.vision.vl_checkpoint import build_vl_checkpoint, hf_greedy

STEPS = 5
GREEDY = SamplingParams(max_tokens=STEPS, temperature=0, ignore_eos=True)
OPTIONS = dict(device="cpu", dtype="float32", max_concurrency=2, kv_capacity=8192)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vl")
    return folder, build_vl_checkpoint(folder)


@pytest.fixture(scope="module")
def vl(checkpoint):
    with LLM(str(checkpoint[0]), host_cache_mib=0, **OPTIONS) as llm:
        yield llm


def _image(width: int, height: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _ask(*images, text="What is in it?") -> list[dict]:
    return [{"role": "user", "content": [*({"image": im} for im in images), text]}]


def _check_against_hf(llm, hf, messages) -> None:
    prompt = llm.render_chat(messages).prompt
    (got,) = llm.chat(messages, GREEDY)
    assert list(got.token_ids) == hf_greedy(hf, prompt.token_ids, prompt.images, STEPS)


def test_the_loader_finds_the_tower(vl):
    assert vl.supports_images
    assert vl.engine.runner.model.model.visual is not None


def test_one_image_equals_transformers(vl, checkpoint):
    _check_against_hf(vl, checkpoint[1], _ask(_image(50, 30, 0)))


def test_two_images_of_different_sizes_equal_transformers(vl, checkpoint):
    messages = _ask(_image(23, 97, 1), _image(120, 64, 2), text="Compare them.")
    _check_against_hf(vl, checkpoint[1], messages)


PLACEHOLDER = r"^prompt: token \d+ \(id \d+\) is a vision placeholder"


def test_image_tokens_without_images_are_refused(vl):
    pad = vl.tokenizer.token_to_id("<|image_pad|>")
    with pytest.raises(ValueError, match=PLACEHOLDER):
        vl.generate([1, 2, pad, 3], GREEDY)
    with pytest.raises(ValueError, match=PLACEHOLDER):
        vl.generate("look: <|vision_start|>", GREEDY)


LONG = " ".join(f"word{i}" for i in range(90))  # some 3 blocks of text after the image


def _span_starts(llm, messages) -> list[tuple[int, int]]:
    images = llm.render_chat(messages).prompt.images
    return [(s.start, s.end(images.merge)) for s in images.spans]


def _not_inside(at: int, spans) -> bool:
    return all(not lo < at < hi for lo, hi in spans)


def test_same_image_hits_a_different_one_misses_past_its_start(checkpoint):
    """Images of the same size give identical tokens: only the media key tells them apart."""
    with LLM(str(checkpoint[0]), host_cache_mib=0, **OPTIONS) as llm:
        a, b = _ask(_image(40, 40, 3), text=LONG), _ask(_image(40, 40, 4), text=LONG)
        assert llm.render_chat(a).prompt.token_ids == llm.render_chat(b).prompt.token_ids
        spans = _span_starts(llm, a)
        cold = llm.chat(a, GREEDY)[0]
        warm = llm.chat(a, GREEDY)[0]
        other = llm.chat(b, GREEDY)[0]
        assert cold.usage.cached_tokens == 0
        assert warm.usage.cached_tokens > spans[0][1] and warm.token_ids == cold.token_ids
        assert other.usage.cached_tokens <= spans[0][0]
        assert other.usage.cached_prefix_tokens <= spans[0][0]
        for out in (warm, other):
            assert _not_inside(out.usage.cached_tokens, spans)
        llm.check_idle()


def test_a_cached_second_turn_equals_a_cold_one(checkpoint):
    """The second turn resumes past the image in its history; its tokens equal a cold run's
    (the cached run never re-encodes the image before its frontier, the cold one does)."""
    first = _ask(_image(33, 71, 5), text=LONG)
    with LLM(str(checkpoint[0]), host_cache_mib=0, **OPTIONS) as llm:
        reply = llm.chat(first, GREEDY)[0]
        turn = first + [
            {"role": "assistant", "content": reply.text},
            {"role": "user", "content": [_image_part(_image(64, 20, 6)), "And this one?"]},
        ]
        warm = llm.chat(turn, GREEDY)[0]
        spans = _span_starts(llm, turn)
    with LLM(str(checkpoint[0]), prefix_reuse=False, host_cache_mib=0, **OPTIONS) as cold_llm:
        cold = cold_llm.chat(turn, GREEDY)[0]
    assert warm.usage.cached_tokens > spans[0][1] and cold.usage.cached_tokens == 0
    assert _not_inside(warm.usage.cached_tokens, spans)
    assert warm.token_ids == cold.token_ids


def _image_part(image) -> dict:
    return {"image": image}


def test_text_prompts_are_the_same_with_and_without_the_tower(checkpoint, tmp_path):
    """A checkpoint without its processor config loads text-only: the same text prompts give
    the same tokens and the same cache behaviour (keys without media)."""
    import shutil

    text_only = tmp_path / "text"
    shutil.copytree(checkpoint[0], text_only)
    (text_only / "preprocessor_config.json").unlink()
    messages = [{"role": "user", "content": LONG}]
    runs = []
    for folder in (checkpoint[0], text_only):
        with LLM(str(folder), host_cache_mib=0, **OPTIONS) as llm:
            outs = [llm.chat(messages, GREEDY)[0] for _ in range(2)]
            runs.append([(o.token_ids, o.usage.cached_tokens) for o in outs])
            assert llm.supports_images == (folder == checkpoint[0])
    assert runs[0] == runs[1] and runs[0][1][1] > 0


def test_a_snapshot_tail_over_a_different_image_is_not_resumed(checkpoint):
    """A short first turn (no full block) leaves its snapshot's tail over the image's pads:
    the same conversation with another image of the same size must not resume from it."""
    with LLM(str(checkpoint[0]), host_cache_mib=0, **OPTIONS) as llm:
        first = llm.chat(_ask(_image(24, 24, 7), text="Hi"), GREEDY)[0]

        def turn(seed):
            history = _ask(_image(24, 24, seed), text="Hi")
            return history + [
                {"role": "assistant", "content": first.text},
                {"role": "user", "content": LONG},
            ]

        other = llm.chat(turn(8), GREEDY)[0]
        spans = _span_starts(llm, turn(8))
    with LLM(str(checkpoint[0]), prefix_reuse=False, host_cache_mib=0, **OPTIONS) as cold_llm:
        cold = cold_llm.chat(turn(8), GREEDY)[0]
    assert other.usage.cached_tokens <= spans[0][0]
    assert other.token_ids == cold.token_ids


@pytest.mark.parametrize("chunk", [16, 24])
def test_chunked_prefill_splits_a_span_and_equals_transformers(checkpoint, chunk):
    """Short chunks cut the image's pads: the text model sees them in pieces, the
    tower the whole image (encoded once, kept for the later chunk)."""
    text = " ".join(f"w{i}" for i in range(30))
    messages = _ask(_image(40, 36, 9), text=text)
    options = {**OPTIONS, "prefill_chunk": chunk, "solo_prefill_chunk": chunk}
    with LLM(str(checkpoint[0]), prefix_reuse=False, host_cache_mib=0, **options) as llm:
        spans = _span_starts(llm, messages)
        assert any(lo < k * chunk < hi for lo, hi in spans for k in range(1, 4))
        runner, encoded = llm.engine.runner, []
        encode = runner.encode_image
        runner.encode_image = lambda pixels, grids: encoded.append(grids) or encode(pixels, grids)
        _check_against_hf(llm, checkpoint[1], messages)
        assert len(encoded) == 1


def test_the_encoder_cache_keeps_an_image_across_requests(checkpoint):
    """The same image under another question: its prefix is recomputed from before the image
    (the text differs after it), and the tower's output comes from the encoder cache."""
    image = _image(30, 30, 10)
    with LLM(str(checkpoint[0]), host_cache_mib=0, **OPTIONS) as llm:
        first = llm.chat(_ask(image, text="One?"), GREEDY)[0]
        st = llm.cache_stats()
        assert (st.encoder_cache_hits, st.encoder_cache_misses) == (0, 1)
        again = llm.chat(_ask(image, text="Two?"), GREEDY)[0]
        st = llm.cache_stats()
        assert (st.encoder_cache_hits, st.encoder_cache_misses) == (1, 1)
        llm.chat(_ask(_image(30, 30, 11), text="Two?"), GREEDY)
        assert llm.cache_stats().encoder_cache_misses == 2
    with LLM(str(checkpoint[0]), prefix_reuse=False, encoder_cache_mib=0, **OPTIONS) as cold:
        assert cold.chat(_ask(image, text="Two?"), GREEDY)[0].token_ids == again.token_ids
        assert cold.chat(_ask(image, text="One?"), GREEDY)[0].token_ids == first.token_ids
        assert cold.cache_stats().encoder_cache_hits == 0


def test_hints_move_past_the_images(vl):
    """The template's message starts (and opener) are positions of the rendered prompt with
    one pad per image: they land on the same tokens once the pads are expanded."""
    image = _image(40, 24, 12)
    messages = [
        {"role": "system", "content": "You see."},
        *_ask(image, text="First?"),
        {"role": "assistant", "content": "A picture."},
        {"role": "user", "content": "Second?"},
    ]
    chat = vl.render_chat(messages)
    ids, hints = chat.prompt.token_ids, chat.prompt.hints
    text = vl.render_chat(messages[:1] + messages[2:])
    start = vl.tokenizer.token_to_id("<|im_start|>")
    assert [ids[p] for p in hints.message_starts] == [start] * len(hints.message_starts)
    assert len(hints.message_starts) == 4 and hints.opener is not None
    assert ids[hints.opener :] == text.prompt.token_ids[text.prompt.hints.opener :]


@pytest.fixture(scope="module")
def cold(checkpoint):
    with LLM(str(checkpoint[0]), prefix_reuse=False, encoder_cache_mib=0, **OPTIONS) as llm:
        yield llm


SIDES = st.integers(4, 80)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    images=st.lists(st.tuples(SIDES, SIDES, st.integers(0, 99)), min_size=1, max_size=2),
    words=st.lists(st.integers(0, 70), min_size=3, max_size=3),
)
def test_cached_runs_equal_cold_ones(vl, cold, images, words):
    """Random image sizes and places in the prompt: a run served from the cache (the same
    prompt again, then another question after the same history) gives a cold run's tokens."""
    parts = [" ".join(f"t{i}" for i in range(words[0]))]
    for (w, h, seed), n in zip(images, words[1:], strict=False):
        parts += [{"image": _image(w, h, seed)}, " ".join(f"u{i}" for i in range(n))]
    history = [{"role": "user", "content": [p for p in parts if p]}]
    follow = history + [
        {"role": "assistant", "content": "Seen."},
        {"role": "user", "content": "More?"},
    ]
    for messages in (history, history, follow):
        warm = vl.chat(messages, GREEDY)[0]
        spans = _span_starts(vl, messages)
        assert _not_inside(warm.usage.cached_tokens, spans)
        assert warm.token_ids == cold.chat(messages, GREEDY)[0].token_ids
