"""The one option surface: `EngineOptions` declares every `LLM(...)` keyword once; the signature,
the command-line flags and the checks are all read from it, and `resolve()` runs once."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.cli.main import ENGINE_FLAGS, build_parser, engine_kwargs
from ninfer.config import EngineOptions, option_fields

# spec/API.md's keyword names and defaults (fixed)
API_DEFAULTS = dict(
    model=None, device="auto", dtype="auto", kv_dtype="auto", max_concurrency=8,
    prefill_chunk=None, max_model_len=None, kv_capacity="auto", host_cache_mib=8192,
    device_snapshot_slots=None, cache_taps_per_request=None, cache_tap_ladder=None,
    cache_tap_min_gap=None, prefix_cache_file=None, prefix_reuse=True,
    concurrent_prefill=False, compile=True, cuda_graphs=True, seed=0,
)  # fmt: skip


def test_llm_signature_is_the_options_declaration():
    from ninfer import LLM

    params = inspect.signature(LLM).parameters
    assert list(params) == [f.name for f, _ in option_fields()]
    for name, default in API_DEFAULTS.items():
        assert params[name].default == default, name
    for f, _ in option_fields():
        assert params[f.name].default == f.default, f.name


def test_every_option_has_help_and_its_flag_shows_it():
    by_dest = {dest: (flag, opts) for flag, dest, opts in ENGINE_FLAGS}
    for f, option in option_fields():
        assert option.help, f.name
        if not option.flag:
            assert f.name not in by_dest
            continue
        flag, opts = by_dest[f.name]
        assert opts["help"] == option.help
        if isinstance(f.default, bool):  # a switch names the non-default side
            want = ("--no-" if f.default else "--") + f.name.replace("_", "-")
            assert flag == want and opts["action"] == f"store_{str(not f.default).lower()}"
        else:
            assert flag == "--" + f.name.replace("_", "-")
    assert "check_invariants" not in by_dest  # debugging only: Python, no flag


def _value_for(f: dataclasses.Field, option, draw) -> tuple[list[str], object]:
    """A valid non-default value of one option: (its command-line words, the value)."""
    flag = next(fl for fl, dest, _ in ENGINE_FLAGS if dest == f.name)
    if isinstance(f.default, bool):
        return [flag], not f.default
    if option.choices:
        value = draw(st.sampled_from(option.choices))
        return [flag, value], value
    if option.kind is float:
        value = draw(st.sampled_from([0.0, 0.5, 7.25, 60.0]))
        return [flag, repr(value)], value
    if option.kind is int:
        lo = int(option.lo or 0)
        value = draw(st.integers(lo, option.hi if option.hi is not None else lo + 5000))
        return [flag, str(value)], value
    value = draw(st.sampled_from(["cpu", "/tmp/some where/x"]))
    return [flag, value], value


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_flags_given_become_exactly_those_options(data):
    """Any subset of flags, with valid values, parses into keyword arguments that build the
    very `EngineOptions` the same values give in Python; the others keep the defaults."""
    flagged = [(f, o) for f, o in option_fields() if o.flag]
    chosen = data.draw(st.lists(st.sampled_from(flagged), unique_by=lambda p: p[0].name))
    argv, want = ["info"], {}
    for f, option in chosen:
        words, value = _value_for(f, option, data.draw)
        argv += words
        want[f.name] = value
    kwargs = engine_kwargs(build_parser().parse_args(argv))
    assert kwargs == want
    built = EngineOptions(**kwargs)
    for f, _ in option_fields():
        assert getattr(built, f.name) == want.get(f.name, f.default), f.name


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(max_concurrency=0), "max_concurrency must be an integer >= 1, got 0"),
        (dict(max_concurrency=9), "max_concurrency must be in 1..8, got 9"),
        (dict(max_concurrency=True), "max_concurrency must be an integer >= 1, got True"),
        (dict(dtype="int8"), "dtype must be 'auto' or one of ('bfloat16', 'float16', 'float32')"),
        (dict(kv_dtype="fp4"), "kv_dtype must be 'auto' or one of"),
        (dict(kv_capacity="lots"), "kv_capacity must be an integer >= 64, got 'lots'"),
        (dict(host_cache_mib=-1), "host_cache_mib must be an integer >= 0, got -1"),
        (dict(prefill_graph_tokens="1k"), "prefill_graph_tokens must be an integer >= 0"),
        (dict(pending_timeout_s=float("nan")), "pending_timeout_s must be a number >= 0"),
        (dict(cache_tap_min_gap=63), "cache_tap_min_gap must be an integer >= 64, got 63"),
    ],
)
def test_each_value_is_checked_when_the_options_are_built(options, message):
    with pytest.raises(ValueError) as err:
        EngineOptions(**options)
    assert str(err.value).startswith(message)


def test_a_bad_option_fails_before_the_model_loads(monkeypatch):
    """The demo model is never built for a value its declaration rules out; an unknown keyword
    is a TypeError naming it."""
    from ninfer import LLM, llm

    def no_load(*_args):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(llm, "_load", no_load)
    with pytest.raises(ValueError, match="max_concurrency must be in 1..8, got 9"):
        LLM(device="cpu", max_concurrency=9)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['max_batch'\]"):
        LLM(device="cpu", max_batch=4)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_model_len": 10**9}, "max_model_len must be in 2..32768, got 1000000000"),
        ({"max_model_len": 2048, "kv_capacity": 1024}, "kv_capacity holds 1024 tokens"),
        ({"prefix_cache_file": "x.cache", "host_cache_mib": 0}, "prefix_cache_file needs"),
        ({"kv_dtype": "fp8_e4m3"}, "kv_dtype='fp8_e4m3' needs a CUDA device"),
    ],
)
def test_a_value_the_model_rules_out_fails_before_the_weights_load(
    monkeypatch, tmp_path, options, message
):
    """Rules between an option and the checkpoint's shape fail before the (long) weight load."""
    from ninfer import LLM
    from ninfer.models import presets

    def no_build(*_args, **_kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(presets, "build_random_model", no_build)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=re.escape(message)):
        LLM(device="cpu", **options)


def test_a_model_without_full_attention_layers_is_refused_naming_layer_types():
    """Pages, blocks and Host slabs are cut per full-attention layer: a model of Gated DeltaNet
    layers alone is refused with the field named, with or without a Host tier (it used to fail
    with a ZeroDivisionError while sizing the KV pool)."""
    import torch

    from ninfer import LLM
    from ninfer.models.presets import build_random_model
    from tests.engine.engine_helpers import TINY

    gdn_only = dataclasses.replace(TINY, layer_types=("linear_attention",) * 4)
    model = build_random_model(gdn_only, torch.float32, "cpu", seed=1)
    for host_mib in (16, 0):
        with pytest.raises(ValueError, match="layer_types: the model has no full_attention layer"):
            LLM.from_model(model, host_cache_mib=host_mib)


def test_resolve_runs_once_per_engine(monkeypatch):
    """One resolution, after the weights are in place, is the configuration the engine runs."""
    from ninfer import LLM, llm

    seen = []
    real = llm.resolve

    def spy(*args):
        seen.append(real(*args))
        return seen[-1]

    monkeypatch.setattr(llm, "resolve", spy)
    with LLM(device="cpu", kv_capacity=4096, host_cache_mib=0, max_concurrency=2) as engine:
        assert len(seen) == 1 and engine.engine_config is seen[0]
        assert (
            engine.engine_config.memory.kv_pages == 64
            and engine.engine_config.memory.max_concurrency == 2
        )


def test_the_flags_are_built_without_importing_torch():
    """`ninfer --help` reads the option declarations only: ninfer.config stays torch-free."""
    import subprocess
    import sys

    code = (
        "import sys; from ninfer.cli.main import build_parser; build_parser(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
