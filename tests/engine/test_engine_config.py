"""resolve(): the derived values of spec §14.2 / ADAPTATION.md and the validation messages."""

from __future__ import annotations

import dataclasses

import pytest
from engine_helpers import TINY

from ninfer.config import DeviceFacts, EngineOptions, resolve

CPU = DeviceFacts("cpu", 64 << 30, 64 << 30)
CUDA = DeviceFacts("cuda", 100 << 30, 140 << 30)


def test_cpu_defaults():
    cfg = resolve(EngineOptions(host_cache_mib=0), TINY, CPU)
    assert (cfg.memory.dtype, cfg.memory.kv_dtype, cfg.scheduling.prefill_chunk) == (
        "float32",
        "float32",
        256,
    )
    assert cfg.memory.device_snapshot_slots == 8 + 2 and cfg.cache.cache_taps_per_request == 2
    assert cfg.cache.cache_tap_ladder == 4096 and cfg.cache.cache_tap_min_gap == 1024
    assert cfg.memory.max_model_len == TINY.max_position_embeddings
    assert cfg.memory.kv_pages * 64 >= 9 * TINY.max_position_embeddings  # C lanes + cache
    assert not cfg.ops.compile and not cfg.ops.cuda_graphs and not cfg.memory.host_tier
    assert cfg.memory.state_slots == 18 and cfg.describe()["state_slots"] == 18


def test_cuda_defaults_and_derived_ladder():
    cfg = resolve(EngineOptions(prefill_chunk=4096), TINY, CUDA)
    assert (cfg.memory.dtype, cfg.memory.kv_dtype) == ("bfloat16", "bfloat16")
    assert cfg.cache.cache_tap_ladder == 8192 and cfg.cache.cache_tap_min_gap == 4096
    assert cfg.memory.kv_pages * cfg.memory.kv_page_bytes <= CUDA.free_bytes
    assert cfg.ops.compile and cfg.ops.cuda_graphs
    assert resolve(EngineOptions(kv_dtype="fp8_e4m3"), TINY, CUDA).memory.kv_dtype == "fp8_e4m3"


def test_prefill_graphs_need_cuda_graphs_and_own_one_scratch_entry():
    cfg = resolve(EngineOptions(), TINY, CUDA)
    assert (
        cfg.ops.prefill_graph_tokens == 2048 == cfg.scheduling.prefill_chunk
        and cfg.memory.scratch_entries == 1
    )
    capped = resolve(EngineOptions(prefill_chunk=1000, prefill_graph_tokens=4096), TINY, CUDA)
    assert capped.ops.prefill_graph_tokens == 1024  # the chunk, rounded up to a 64-token bucket
    image = cfg.memory.state_image_bytes
    assert cfg.describe()["state_pool_bytes"] == (cfg.memory.state_slots + 1) * image
    assert (
        resolve(EngineOptions(prefill_graph_tokens=100), TINY, CUDA).ops.prefill_graph_tokens == 128
    )
    for opts in (EngineOptions(cuda_graphs=False), EngineOptions(prefill_graph_tokens=0)):
        cfg = resolve(opts, TINY, CUDA)
        assert cfg.ops.prefill_graph_tokens == 0 and cfg.memory.scratch_entries == 0
    cpu = resolve(EngineOptions(host_cache_mib=0), TINY, CPU)
    assert cpu.ops.prefill_graph_tokens == 0 and cpu.memory.scratch_entries == 0


def test_solo_chunk_derived_only_for_models_whose_long_eager_pass_pays():
    from ninfer.models.presets import PRESETS

    big, small = dataclasses.replace(PRESETS["9B"], max_position_embeddings=8192), PRESETS["4B"]
    assert (
        resolve(EngineOptions(kv_capacity=65536), big, CUDA).scheduling.solo_prefill_chunk == 8192
    )
    # doubled while a pass stays within SOLO_PASS_S (estimated): the 9B's 16384, the 27B's 8192
    for name, solo in (("9B", 16384), ("27B", 8192)):
        assert (
            resolve(
                EngineOptions(kv_capacity=65536), PRESETS[name], CUDA
            ).scheduling.solo_prefill_chunk
            == solo
        )
    assert (
        resolve(EngineOptions(kv_capacity=65536), small, CUDA).scheduling.solo_prefill_chunk == 2048
    )
    assert resolve(EngineOptions(), TINY, CUDA).scheduling.solo_prefill_chunk == 2048
    assert resolve(EngineOptions(host_cache_mib=0), TINY, CPU).scheduling.solo_prefill_chunk == 256
    # a chunk the user chose is the pass size unless the solo one is given too
    chosen = EngineOptions(prefill_chunk=1024, kv_capacity=65536)
    assert resolve(chosen, big, CUDA).scheduling.solo_prefill_chunk == 1024
    both = dataclasses.replace(chosen, solo_prefill_chunk=4096)
    assert resolve(both, big, CUDA).scheduling.solo_prefill_chunk == 4096


def test_int_kv_capacity_caps_max_model_len():
    cfg = resolve(EngineOptions(kv_capacity=1000), TINY, CPU)
    assert cfg.memory.kv_pages == 15 and cfg.memory.max_model_len == 960


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (dict(max_concurrency=0), "max_concurrency"),
        (dict(max_concurrency=9), "max_concurrency"),
        (dict(kv_dtype="fp8_e4m3"), "kv_dtype"),
        (dict(dtype="int8"), "dtype"),
        (dict(prefill_chunk=0), "prefill_chunk"),
        (dict(prefill_chunk=512, solo_prefill_chunk=256), "solo_prefill_chunk"),
        (dict(kv_capacity=10), "kv_capacity"),
        (dict(kv_capacity=640, max_model_len=1024), "kv_capacity"),
        (dict(max_model_len=10**9), "max_model_len"),
        (dict(device_snapshot_slots=0), "device_snapshot_slots"),
        (dict(cache_tap_ladder=8), "cache_tap_ladder"),
        (dict(host_cache_mib=-1), "host_cache_mib"),
        (dict(pending_timeout_s=-1), "pending_timeout_s"),
        (dict(prefill_graph_tokens=-64), "prefill_graph_tokens"),
        (dict(prefill_graph_tokens="1k"), "prefill_graph_tokens"),
        (dict(host_cache_mib=0, prefix_cache_file="/tmp/x"), "prefix_cache_file"),
    ],
)
def test_bad_options_name_the_field(options, field):
    with pytest.raises(ValueError, match=field):
        resolve(EngineOptions(**options), TINY, CPU)


def test_host_tier_is_on_by_default():
    cfg = resolve(EngineOptions(), TINY, CPU)
    assert cfg.memory.host_tier and cfg.memory.host_cache_bytes == 8192 << 20
    assert cfg.memory.host_geometry.num_slabs == (8192 << 20) // cfg.memory.kv_page_bytes
    assert cfg.memory.device_snapshot_slots == 8 + 1 and cfg.cache.cache_taps_per_request == 8
    assert cfg.cache.pending_timeout_s == 60.0
    off = resolve(EngineOptions(host_cache_mib=0), TINY, CPU)
    assert (
        not off.memory.host_tier
        and off.memory.host_geometry is None
        and off.memory.device_snapshot_slots == 8 + 2
    )
    disabled = resolve(EngineOptions(prefix_reuse=False), TINY, CPU)
    assert not disabled.memory.host_tier and disabled.memory.host_geometry is None


def test_host_budget_below_one_snapshot_plus_one_block_is_rejected():
    # the slab geometry's own rule: image slabs + tail slab + one block slab
    wide = dataclasses.replace(TINY, num_key_value_heads=64, head_dim=256)  # 8 MiB pages
    with pytest.raises(ValueError, match="host_cache_mib=16 holds 2 slabs"):
        resolve(EngineOptions(host_cache_mib=16), wide, CPU)
    assert resolve(EngineOptions(host_cache_mib=24), wide, CPU).memory.host_geometry.num_slabs == 3
    # no prefix cache, no Host tier: its budget is not checked (nothing would be built)
    off = resolve(EngineOptions(host_cache_mib=16, prefix_reuse=False), wide, CPU)
    assert not off.memory.host_tier and off.memory.host_geometry is None


def test_an_engine_resolves_its_dtypes_once(make_llm, monkeypatch):
    """`LLM` resolves (dtype, kv_dtype) once, before the weights, and `resolve()` reads them."""
    import ninfer.config
    import ninfer.llm

    calls = []
    real = ninfer.config.resolve_dtypes

    def counted(opts, on_cuda):
        calls.append(opts.kv_dtype)
        return real(opts, on_cuda)

    monkeypatch.setattr(ninfer.config, "resolve_dtypes", counted)
    monkeypatch.setattr(ninfer.llm, "resolve_dtypes", counted)
    llm = make_llm(host_cache_mib=0)
    assert calls == ["auto"] and llm.engine_config.memory.kv_dtype == "float32"


def test_the_dtype_table_agrees_with_torch():
    import torch

    from ninfer.dtypes import DTYPES, KV_DTYPES, itemsize, torch_dtype

    assert set(DTYPES) < set(KV_DTYPES)
    for name in KV_DTYPES:
        assert isinstance(torch_dtype(name), torch.dtype)
        assert itemsize(name) == torch_dtype(name).itemsize
    assert torch_dtype("fp8_e4m3") == torch.float8_e4m3fn


@pytest.mark.parametrize("k", [None, 1, 4])
def test_speculation_adds_the_heads_kv_layer_and_scratch_slots_and_its_own_graphs(k):
    plain = resolve(EngineOptions(kv_capacity=8192), TINY, CUDA)
    cfg = resolve(EngineOptions(kv_capacity=8192, speculative="mtp", num_speculative_tokens=k),
                  TINY, CUDA)  # fmt: skip
    want_k = 3 if k is None else k
    assert (cfg.speculation.speculative, cfg.speculation.num_speculative_tokens) == ("mtp", want_k)
    n_fa = len(TINY.full_layer_ids)
    assert (plain.memory.kv_layers, cfg.memory.kv_layers) == (n_fa, n_fa + 1)
    assert cfg.memory.kv_page_bytes * n_fa == plain.memory.kv_page_bytes * (n_fa + 1)
    assert cfg.memory.host_geometry.n_fa_layers == n_fa + 1
    assert (plain.memory.speculative_slots, cfg.memory.speculative_slots) == (0, 8 * want_k)
    assert plain.ops.cuda_graphs and plain.scheduling.overlap_decode
    # its own graphs (verify and head), no prefill graphs, no step run ahead
    assert cfg.ops.cuda_graphs and cfg.ops.prefill_graph_tokens == 0
    assert not cfg.scheduling.overlap_decode
    described = cfg.describe()
    assert (described["speculative"], described["num_speculative_tokens"]) == ("mtp", want_k)
    assert plain.speculation.speculative is None and plain.speculation.num_speculative_tokens == 0


def test_auto_kv_without_room_itemises_the_memory_and_names_the_options():
    """The 35B-A3B with MTP after its bf16 weights on an 80 GB card (10.75 GB free, call Z3a):
    the 10 % kept back and 42 state slots of 64 MB leave nothing for KV pages. The error says
    where the memory went and which options change it; an explicit kv_capacity resolves."""
    from ninfer.models.presets import PRESETS

    h100 = DeviceFacts("cuda", 10_750_197_760, 85_520_000_000)
    opts = dict(max_concurrency=8, speculative="mtp", host_cache_mib=0)
    with pytest.raises(ValueError) as e:
        resolve(EngineOptions(**opts), PRESETS["35B-A3B"], h100)
    said = str(e.value)
    assert said.startswith("kv_capacity='auto': not enough free memory on cuda")
    assert "10.75 GB free, less 8.55 GB kept" in said
    assert "(8 lanes, 10 snapshots, 0 scratch, 24 speculative), leaves 0.00 GB" in said
    for option in ("kv_capacity=<tokens>", "max_concurrency", "num_speculative_tokens"):
        assert option in said
    cfg = resolve(EngineOptions(kv_capacity=24576, **opts), PRESETS["35B-A3B"], h100)
    assert cfg.memory.kv_pages * 64 == 24576
