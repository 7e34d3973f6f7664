"""One Host slab geometry: `resolve()` computes it, and the index's slab pool, the pinned slabs
and the transfer all hold that very object, sized to the Device pools they copy between."""

from __future__ import annotations

import random

from engine_helpers import rand_tokens, run

from ninfer.cache.host_pool import plan_slab_geometry


def nbytes(t) -> int:
    return t.numel() * t.element_size()


def test_one_geometry_from_resolve_to_the_slabs(make_llm):
    llm = make_llm(host_cache_mib=4, device_snapshot_slots=2, kv_capacity=24 * 64)
    cfg, kv_state = llm.engine_config, llm.engine.kv_state
    g = cfg.memory.host_geometry
    assert kv_state.index.host.geometry is g
    assert kv_state.host_slabs.geometry is g
    assert kv_state.transfer.inner.slabs.geometry is g
    assert kv_state.index.config.host is g
    # the geometry the Device pools call for, cut by the same rule
    kv, conv, ssm = kv_state.kv.kv, kv_state.states.conv, kv_state.states.ssm
    image = nbytes(conv[0]) + nbytes(ssm[0])
    assert g == plan_slab_geometry(4, len(kv), nbytes(kv[0][0]), image)
    assert kv_state.index.host.n_slabs == g.num_slabs
    assert g.total_bytes == kv_state.transfer.host_bytes == (4 << 20) // g.slab_bytes * g.slab_bytes


def test_without_a_host_tier_there_is_no_geometry(make_llm):
    llm = make_llm(host_cache_mib=0, kv_capacity=24 * 64)
    kv_state = llm.engine.kv_state
    assert llm.engine_config.memory.host_geometry is None
    assert kv_state.index.host is None and kv_state.host_slabs is None
    out = run(llm, rand_tokens(random.Random(3), 100), 4)
    assert len(out.token_ids) == 4
