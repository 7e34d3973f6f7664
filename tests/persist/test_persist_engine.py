"""`prefix_cache_file` through `LLM` (spec §5.5): construction checks, foreign and damaged
files, the save at close (running requests abort and are written through), abandon."""

from __future__ import annotations

import logging
import random
import threading

import pytest
import torch

from ninfer.demo import DEMO_DIR
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.persist.fingerprint import checkpoint_identity
from ninfer.persist.tables import MAGIC
from ninfer.request import RequestOutput, SamplingParams
from ninfer.tokenizer import Tokenizer
from tests.engine.engine_helpers import TINY

_RNG = random.Random(5)
PROMPT = [_RNG.randrange(4, 2500) for _ in range(260)]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def models():
    return {seed: build_random_model(TINY, torch.float32, "cpu", seed=seed) for seed in (1, 2)}


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_dir(DEMO_DIR)


@pytest.fixture
def make(models, tok):
    made: list[LLM] = []

    def factory(seed: int = 1, model=None, **kw) -> LLM:
        opts = dict(
            device="cpu",
            prefill_chunk=64,
            max_concurrency=2,
            kv_capacity=4096,
            host_cache_mib=4,
            check_invariants=True,
        )
        opts.update(kw)
        llm = LLM.from_model(model or models[seed], tokenizer=tok, chat_template=None, **opts)
        made.append(llm)
        return llm

    yield factory
    for llm in made:
        llm.close(save=False)


def turn(llm, prompt=PROMPT):
    return llm.generate({"prompt_token_ids": prompt}, GREEDY)[0]


def test_unusable_locations_fail_at_construction(make, tmp_path):
    with pytest.raises(ValueError, match="prefix_cache_file.*directory"):
        make(prefix_cache_file=str(tmp_path))
    with pytest.raises(ValueError, match="prefix_cache_file.*does not exist"):
        make(prefix_cache_file=str(tmp_path / "missing" / "c.hpc"))
    with pytest.raises(ValueError, match="prefix_cache_file.*host_cache_mib"):
        make(prefix_cache_file=str(tmp_path / "c.hpc"), host_cache_mib=0)


def test_path_is_resolved_and_the_save_round_trips(make, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    llm = make(prefix_cache_file="c.hpc")
    assert llm.engine_config.persistence.prefix_cache_file == str(tmp_path / "c.hpc")
    first = turn(llm)
    llm.close()
    assert (tmp_path / "c.hpc").is_file()
    again = make(prefix_cache_file=str(tmp_path / "c.hpc"))
    assert again.cache_stats().snapshots_host >= 1
    out = turn(again, PROMPT + first.token_ids)
    assert out.usage.cached_tokens > 0 and out.usage.restored_host_bytes > 0
    cold = make(prefix_reuse=False, host_cache_mib=0)
    assert out.token_ids == turn(cold, PROMPT + first.token_ids).token_ids


def _check_foreign_then_replaced(make, path, caplog, reader_kw, why):
    with caplog.at_level(logging.WARNING, logger="ninfer.cache"):
        llm = make(prefix_cache_file=str(path), **reader_kw)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and why in warnings[0], warnings
    assert llm.cache_stats().snapshots == 0
    out = turn(llm)  # serves normally, from the root
    assert out.finish_reason == "length" and out.usage.cached_tokens == 0
    llm.close()  # the next save replaces the file
    again = make(prefix_cache_file=str(path), **reader_kw)
    assert again.cache_stats().snapshots_host >= 1


def test_another_checkpoint_loads_nothing_and_is_replaced(make, tmp_path, caplog):
    path = tmp_path / "c.hpc"
    writer = make(prefix_cache_file=str(path))
    turn(writer)
    writer.close()
    _check_foreign_then_replaced(make, path, caplog, {"seed": 2}, "model differ")


def test_another_dtype_loads_nothing(make, models, tmp_path, caplog):
    path = tmp_path / "c.hpc"
    writer = make(prefix_cache_file=str(path))
    turn(writer)
    writer.close()
    bf16 = build_random_model(TINY, torch.bfloat16, "cpu", seed=1)
    _check_foreign_then_replaced(make, path, caplog, {"model": bf16, "dtype": "bfloat16"}, "dtype")


def test_a_damaged_cache_file_loads_nothing_and_is_replaced(make, tmp_path, caplog):
    path = tmp_path / "c.hpc"
    path.write_bytes(MAGIC + b"not a cache file at all" * 100)
    _check_foreign_then_replaced(make, path, caplog, {}, "format version")


def test_a_load_that_fails_part_way_leaves_an_empty_guarded_index(
    make, tmp_path, caplog, monkeypatch
):
    """A payload slab found damaged while reading: the entries already rebuilt are dropped
    (`KVState.reset_index`), and the new index's slab pool still contains its faults."""
    from ninfer.cache.host_pool import HostSlabPool

    path = tmp_path / "c.hpc"
    writer = make(prefix_cache_file=str(path))
    turn(writer)
    writer.close()
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x5A  # inside the last payload slab
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="ninfer.cache"):
        llm = make(prefix_cache_file=str(path))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "checksum mismatch" in warnings[0], warnings
    assert llm.cache_stats().snapshots == 0 and llm.cache_stats().nodes == 0
    real = HostSlabPool.allocate

    def allocate(self, k):
        raise RuntimeError("injected Host slab allocation fault")

    monkeypatch.setattr(HostSlabPool, "allocate", allocate)
    out = turn(llm)
    monkeypatch.setattr(HostSlabPool, "allocate", real)
    assert out.finish_reason == "length" and llm.cache_stats().host_faults >= 1


def test_abandon_before_close_keeps_the_previous_file(make, tmp_path):
    path = tmp_path / "c.hpc"
    writer = make(prefix_cache_file=str(path))
    turn(writer)
    writer.close()
    before = path.read_bytes()
    llm = make(prefix_cache_file=str(path))
    turn(llm, PROMPT[:100] + PROMPT)  # new content the abandoned save would have written
    assert llm.abandon_save() is False  # still running
    llm.close()
    assert llm.abandon_save(wait_s=1.0) is True
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.hpc"]


def test_close_aborts_running_requests_and_saves_what_they_committed(make, tmp_path):
    path = tmp_path / "c.hpc"
    llm = make(prefix_cache_file=str(path))
    long = SamplingParams(max_tokens=3000, temperature=0, ignore_eos=True)
    events, started = [], threading.Event()

    def consume():
        n = 0
        for ev in llm.stream({"prompt_token_ids": PROMPT}, long):
            events.append(ev)
            n += len(getattr(ev, "token_ids", ()))
            if n >= 100:  # past block 5 (320): committed blocks and an endpoint to save
                started.set()

    t = threading.Thread(target=consume)
    t.start()
    assert started.wait(60)
    llm.close()
    t.join(30)
    final = events[-1]
    assert isinstance(final, RequestOutput) and final.finish_reason == "abort"
    again = make(prefix_cache_file=str(path))
    assert len(final.token_ids) >= 100
    resumed = PROMPT + final.token_ids + [7]
    out = turn(again, resumed)
    assert out.usage.cached_tokens == len(PROMPT) + len(final.token_ids) - 1  # the endpoint


def test_failed_engine_saves_nothing(make, tmp_path):
    path = tmp_path / "c.hpc"
    llm = make(prefix_cache_file=str(path))
    turn(llm)

    def boom(engine):  # a fault that ends the engine (a poisoned CUDA context)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    llm.engine.on_step = boom
    out = llm.generate([{"prompt_token_ids": PROMPT[:70]}], GREEDY)[0]
    assert out.finish_reason == "error"
    llm.close()
    assert not path.exists()


def test_checkpoint_identity_follows_the_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    one = checkpoint_identity(tmp_path)
    assert one["checkpoint"] == str(tmp_path.resolve())
    (tmp_path / "model.safetensors").write_bytes(b"x" * 11)
    assert checkpoint_identity(tmp_path) != one
