"""Images with MTP speculative decoding (fp32, CPU, the tiny random checkpoint with a vision
tower and a random MTP head added): verify rows of an image request carry its (t, h, w)
positions (past the prompt: index + the prompt's rope delta), so greedy output equals plain
decode's, turn after turn, with a second image and the prefix cache resuming past the
first. The head bridges the image's positions over its pad tokens' text embeddings: its
drafts are only proposals, the target verifies them."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from ninfer import LLM, SamplingParams
from ninfer.bench.speculative import controlled_draft
from tests.vision.vl_checkpoint import add_random_mtp_head, build_vl_checkpoint

OPTIONS = dict(device="cpu", dtype="float32", max_concurrency=2, kv_capacity=8192,
               host_cache_mib=0)  # fmt: skip
LONG = " ".join(f"word{i}" for i in range(60))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The VL checkpoint plus a random MTP head."""
    path = tmp_path_factory.mktemp("vl_mtp")
    build_vl_checkpoint(path, seed=1)
    add_random_mtp_head(path)
    return path


def _image(width: int, height: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize(
    ("k", "accept", "replay"), [(1, 0.0, False), (3, 0.6, False), (3, 0.6, True), (4, 0.9, False)]
)
def test_image_turns_speculate_to_plain_decodes_tokens(folder, k, accept, replay):
    """Tokens and logprobs (fp32: equal to 1e-4; a position off by the rope delta moves them
    far more) of plain decode, both turns; with `replay` the roll-back runs the accepted
    tokens again (`Speculator.replay`), at the same positions."""
    params = SamplingParams(max_tokens=14, temperature=0, ignore_eos=True, logprobs=2)
    first = [{"role": "user", "content": [{"image": _image(50, 30, 0)}, LONG]}]
    with LLM(str(folder), **OPTIONS) as plain:
        want = plain.chat(first, params)[0]
        turn = first + [
            {"role": "assistant", "content": want.text},
            {"role": "user", "content": [{"image": _image(64, 20, 1)}, "And this one?"]},
        ]
        want2 = plain.chat(turn, params)[0]
    with LLM(str(folder), speculative="mtp", num_speculative_tokens=k, **OPTIONS) as spec:
        expected = {tuple(o.prompt_token_ids): o.prompt_token_ids + o.token_ids
                    for o in (want, want2)}  # fmt: skip
        spec.engine.speculator.replay = replay
        spec.engine.speculator.propose = controlled_draft(
            expected, accept, spec.model_config.vocab_size, k
        )
        got = spec.chat(first, params)[0]
        got2 = spec.chat(turn, params)[0]
        st = spec.engine.call(lambda: spec.engine.speculator.stats)
        spec.check_idle()
    for g, w in ((got, want), (got2, want2)):
        assert g.token_ids == w.token_ids
        assert [d.keys() for d in g.logprobs] == [d.keys() for d in w.logprobs]
        for gd, wd in zip(g.logprobs, w.logprobs, strict=True):
            assert all(abs(gd[t] - wd[t]) < 1e-4 for t in wd), (gd, wd)
    assert got2.usage.cached_tokens > 0
    assert st.verify_rows > 0 and (st.accepted > 0) == (accept > 0)


def test_the_head_alone_drafts_over_an_image(folder, tmp_path):
    """The random head's own drafts (bridged over the image's pads) change nothing: plain
    decode's tokens, the verify rows run."""
    copy = tmp_path / "ckpt"
    shutil.copytree(folder, copy)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    messages = [{"role": "user", "content": [{"image": _image(40, 40, 2)}, "What is it?"]}]
    with LLM(str(copy), **OPTIONS) as plain:
        want = plain.chat(messages, params)[0]
    with LLM(str(copy), speculative="mtp", num_speculative_tokens=2, **OPTIONS) as spec:
        got = spec.chat(messages, params)[0]
        assert spec.engine.call(lambda: spec.engine.speculator.stats.verify_rows) > 0
    assert got.token_ids == want.token_ids
