"""GPU tests of the Host tier through the engine, with real streams and events: write-through on
the transfer stream into pinned slabs, a Host-only resume restored on the restore stream layer
by layer (the first prefill pass waiting per layer), bit for bit what was written, with an
output that matches a cold run (bf16: equal tokens up to near ties), the restored bytes and the
restore's duration reported. Skipped without CUDA or without flashinfer / fla / triton.
"""

from __future__ import annotations

import random

import pytest
import torch
from engine_helpers import CUDA_TINY, assert_idle, rand_tokens
from test_engine_host import _written

from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.request import SamplingParams

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
for _mod in ("triton", "flashinfer", "fla"):
    pytest.importorskip(_mod)

PARAMS = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=21)


def _llm(model, **kw) -> LLM:
    opts = dict(
        device="cuda", max_concurrency=2, kv_capacity=24 * 64, host_cache_mib=64,
        device_snapshot_slots=2, prefill_chunk=128, check_invariants=True,
    )  # fmt: skip
    opts.update(kw)
    return LLM.from_model(model, **opts)


def _run(llm, prompt, params=PARAMS):
    out = llm.generate([{"prompt_token_ids": prompt}], params)[0]
    assert out.error is None, out.error
    return out


def _push_off_device(llm, rng) -> None:
    for _ in range(7):
        _run(llm, rand_tokens(rng, 300), SamplingParams(temperature=0.0, max_tokens=20))
    stats = llm.cache_stats()
    assert stats.device_evicted_backed > 0 and stats.slot_displaced > 0


def test_cuda_host_restore_is_bit_identical_and_matches_cold(model):
    rng = random.Random(31)
    llm = _llm(model)
    cold = _llm(model, prefix_reuse=False, host_cache_mib=0)
    try:
        assert llm.memory_ledger()["host_tier"] and llm.engine_config.ops.cuda_graphs
        engine, kv_state = llm.engine, llm.engine.kv_state
        assert kv_state.host_slabs.pinned  # page-locked: the copies run asynchronously
        prompt = rand_tokens(rng, 200)
        first = _run(llm, prompt)
        frontier = 200 + len(first.token_ids) - 1
        _, blocks, image, tail = engine.call(lambda: _written(kv_state, frontier))
        _push_off_device(llm, rng)
        restored = {}
        original = kv_state.transfer.restore

        def spy(batch, lane_slot):  # what the restore put on the Device, before any pass runs
            ticket = original(batch, lane_slot)
            ticket.wait_all()  # the compute stream (where the clones run) waits for every copy
            kv, states = kv_state.kv.kv, kv_state.states
            restored["blocks"] = {
                b.node: [layer[b.page].clone() for layer in kv] for b in batch.blocks
            }
            restored["tail"] = [layer[batch.tail.page].clone() for layer in kv]
            restored["image"] = (states.conv[lane_slot].clone(), states.ssm[lane_slot].clone())
            restored["parts"] = ticket.parts
            return ticket

        kv_state.transfer.restore = spy
        follow = prompt + first.token_ids + rand_tokens(rng, 40)
        warm = _run(llm, follow)
        kv_state.transfer.restore = original
        assert warm.usage.cached_tokens == frontier and warm.usage.restored_host_bytes > 0
        assert warm.metrics.restore_s > 0  # timed on the restore stream
        assert restored["blocks"].keys() == blocks.keys() and len(blocks) == 3
        for nid, pages in blocks.items():
            got = restored["blocks"][nid]
            assert all(torch.equal(a, b) for a, b in zip(pages, got, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(tail, restored["tail"], strict=True))
        assert all(torch.equal(a, b) for a, b in zip(image, restored["image"], strict=True))
        # the prelude (tail), then every model layer in forward order
        assert restored["parts"] == ("prelude", *range(CUDA_TINY.num_hidden_layers))
        ref = _run(cold, follow)
        for i, (a, b) in enumerate(zip(warm.token_ids, ref.token_ids, strict=True)):
            if a != b:  # bf16, other chunk boundaries: only a near tie may flip
                top = sorted(ref.logprobs[i].values(), reverse=True)
                assert top[0] - top[1] < 0.05, (i, a, b, top)
                break
        stats = llm.cache_stats()
        assert stats.hits_host == 1 and stats.restores == 1 and stats.write_through_bytes > 0
        assert_idle(llm)
    finally:
        llm.close()
        cold.close()
