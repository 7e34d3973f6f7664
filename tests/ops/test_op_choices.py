"""The op choices (`ninfer.ops.choices.OpChoices`) are engine options, checked when the options are
built, resolved into `OpsConfig.op_choices` and handed to the op set when it is built: `LLM` ->
`select_ops` -> `CudaOps(choices=...)` -> its attention planner and its conv and GDN kernels. On
the CPU: the kernel modules and FlashInfer are stood in for by recorders, so what reaches them
is what a CUDA run would pass; the reference ops (the CPU's) ignore the choices."""

from __future__ import annotations

import math
import sys
import types
from collections import namedtuple

import pytest
import torch

import ninfer.ops.cuda
from ninfer.config import EngineOptions, op_choices
from ninfer.engine.executor import backend
from ninfer.forward import ForwardBatch
from ninfer.ops.choices import GATHER_MIN_ROWS, OpChoices
from ninfer.ops.reference import ReferenceOps
from ninfer.page import PAGE_SIZE
from ninfer.request import SamplingParams

# every choice away from its default: as LLM keywords and as the op set's dataclass
CHOSEN_KWARGS = dict(
    gather_min_rows=0, conv_tile=(32, 256, 2), verify_backend="fa3", fp8_decode="w8a8"
)
CHOSEN = OpChoices(**CHOSEN_KWARGS)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(gather_min_rows=-1), "gather_min_rows must be a number >= 0, got -1"),
        (dict(gather_min_rows=math.nan), "gather_min_rows must be a number >= 0, got nan"),
        (dict(gather_min_rows="1536"), "gather_min_rows must be a number >= 0, got '1536'"),
        (dict(conv_tile=(16, 256)), "conv_tile must be None or (rows, channels, warps)"),
        (dict(conv_tile=(16, 192, 4)), "conv_tile must be None or (rows, channels, warps)"),
        (dict(conv_tile=(16, 256, 0)), "conv_tile must be None or (rows, channels, warps)"),
        (dict(conv_tile=[16, 256, 4]), "conv_tile must be None or (rows, channels, warps)"),
        (dict(conv_tile=(16.0, 256, 4)), "conv_tile must be None or (rows, channels, warps)"),
        (dict(verify_backend="fa4"), "verify_backend must be one of ('auto', 'fa2', 'fa3')"),
        (dict(verify_backend=None), "verify_backend must be one of ('auto', 'fa2', 'fa3')"),
        (dict(fp8_decode="fp8"), "fp8_decode must be one of ('w8a16', 'w8a8', 'fastest')"),
        (dict(fp8_decode=None), "fp8_decode must be one of ('w8a16', 'w8a8', 'fastest')"),
    ],
)
def test_each_choice_is_checked_when_the_options_are_built(options, message):
    """The same ValueError, naming the field, from `LLM`'s options and from the op set's own
    dataclass (benchmarks and kernel tests build that one directly)."""
    for build in (EngineOptions, OpChoices):
        with pytest.raises(ValueError) as err:
            build(**options)
        assert str(err.value).startswith(message), build


def test_the_options_default_to_the_op_sets_defaults():
    assert op_choices(EngineOptions()) == OpChoices()
    assert OpChoices() == OpChoices(GATHER_MIN_ROWS, None, "fa2")
    assert op_choices(EngineOptions(**{**CHOSEN_KWARGS, "gather_min_rows": math.inf})) == OpChoices(
        math.inf, (32, 256, 2), "fa3", "w8a8"
    )  # inf forbids the gathered path


def test_llm_hands_its_choices_to_the_op_set(monkeypatch):
    """`LLM(..., gather_min_rows=0, ...)` resolves the choices once and `select_ops` gets them;
    on the CPU that is the reference op set, whose greedy tokens the choices do not change."""
    from ninfer import LLM, llm

    handed = []

    def spy(device, compile=False, choices=None):
        handed.append(choices)
        return backend.select_ops(device, compile, choices)

    monkeypatch.setattr(llm, "select_ops", spy)
    prompt = [[5 + (7 * i) % 300 for i in range(40)]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    tokens = []
    for kwargs in ({}, CHOSEN_KWARGS):
        with LLM(
            device="cpu", kv_capacity=4096, host_cache_mib=0, max_concurrency=2, **kwargs
        ) as e:
            assert e.engine_config.ops.op_choices == handed[-1]
            assert type(e.engine.runner.ops) is ReferenceOps
            tokens.append(e.generate(prompt, params)[0].token_ids)
    assert handed == [OpChoices(), CHOSEN]
    assert len(tokens[0]) == 6 and tokens[1] == tokens[0]


def test_select_ops_builds_the_cuda_op_set_with_the_choices(monkeypatch):
    """With the kernel libraries importable on a CUDA device, `select_ops` builds `CudaOps` with
    the choices it is given (None: CudaOps' defaults); a CPU device gets the reference ops."""
    built = []

    class Recorder:
        def __init__(self, device, compile=False, choices=None) -> None:
            built.append((device, compile, choices))

    monkeypatch.setattr(backend.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(ninfer.ops.cuda, "CudaOps", Recorder)
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")
    cuda = torch.device("cuda")
    assert isinstance(backend.select_ops(cuda, True, CHOSEN), Recorder)
    assert isinstance(backend.select_ops(cuda), Recorder)
    assert built == [(cuda, True, CHOSEN), (cuda, False, None)]
    assert type(backend.select_ops(torch.device("cpu"), True, CHOSEN)) is ReferenceOps
    assert len(built) == 2


# ---- CudaOps on the CPU: its kernels stood in for by recorders ---------------------------------

Tile = namedtuple("Tile", "rows chans warps")
TILE = Tile(16, 256, 4)


class _Paged:
    def __init__(self, *args, **kwargs) -> None:
        self.kwargs = kwargs

    def plan(self, *args, **kwargs) -> None:
        pass


class _Ragged(_Paged):
    pass


@pytest.fixture
def kernel_calls(monkeypatch):
    """Stand-ins for FlashInfer and the Triton modules CudaOps imports when built; returns the
    list of (kernel, choice it was called with)."""
    calls = []
    flashinfer = types.ModuleType("flashinfer")
    flashinfer.BatchDecodeWithPagedKVCacheWrapper = _Paged
    flashinfer.BatchPrefillWithPagedKVCacheWrapper = _Paged
    flashinfer.BatchPrefillWithRaggedKVCacheWrapper = _Ragged

    def causal_conv(x, weight, conv_state, batch, meta=None, tile=TILE):
        calls.append(("causal_conv", tile))
        return x

    def causal_conv_qkv(x, weight, conv_state, batch, meta, key_dim, head_dim, tile=TILE):
        calls.append(("causal_conv_qkv", tile))
        return x, x, x

    def gdn_prefill(q, k, v, g, beta, state, slots, scale, meta, normalized=False):
        calls.append(("gdn_prefill", None))
        return v

    conv = types.SimpleNamespace(
        Tile=Tile, TILE=TILE, causal_conv=causal_conv, causal_conv_qkv=causal_conv_qkv,
        splits_heads=lambda *args: True,
    )  # fmt: skip
    stubs = {
        "flashinfer": flashinfer,
        "ninfer.ops.cuda.conv": conv,
        "ninfer.ops.cuda.gdn": types.SimpleNamespace(gdn_prefill=gdn_prefill),
        "ninfer.ops.cuda.glue": types.SimpleNamespace(),
        "ninfer.ops.cuda.linear": types.SimpleNamespace(DecodeLinear=types.SimpleNamespace),
    }
    for name, module in stubs.items():
        monkeypatch.setitem(sys.modules, name, module)
        monkeypatch.delattr(ninfer.ops.cuda, name.rpartition(".")[2], raising=False)
    monkeypatch.setattr("ninfer.ops.cuda.attention.WORKSPACE_BYTES", 16)
    return calls


def _prefill_batch(q_len: int, ctx: int) -> ForwardBatch:
    """One prefill row of q_len tokens after ctx cached ones, in pages 0, 1, ..."""
    pages = -(-(ctx + q_len) // PAGE_SIZE)
    positions = torch.arange(ctx, ctx + q_len)
    return ForwardBatch(
        input_ids=torch.zeros(q_len, dtype=torch.int64),
        positions=positions,
        q_lens=[q_len],
        ctx_lens=[ctx],
        cu_q=torch.tensor([0, q_len], dtype=torch.int32),
        state_slots=torch.tensor([0]),
        block_table=torch.arange(pages, dtype=torch.int32)[None],
        slot_mapping=positions,
        logits_indices=torch.tensor([q_len - 1]),
    )


@pytest.mark.parametrize(
    ("choices", "tile", "eager_gathers"),
    [
        (None, TILE, False),
        (OpChoices(gather_min_rows=0), TILE, True),
        (OpChoices(conv_tile=(64, 128, 8)), Tile(64, 128, 8), False),
        (OpChoices(verify_backend="fa3"), TILE, False),
        (CHOSEN, Tile(32, 256, 2), True),
    ],
    ids=["defaults", "gather", "kernels", "verify", "all"],
)  # fmt: skip
def test_cuda_ops_hand_their_choices_to_the_kernels(kernel_calls, choices, tile, eager_gathers):
    """A prefill pass's conv gets the chosen tile; an eager pass over a cached context (70
    tokens after 70, 4 query heads per KV head: far below the default threshold) plans the
    gathered attention path as chosen; a prefill-graph bucket is always paged."""
    from ninfer.ops.cuda import CudaOps

    ops = CudaOps(torch.device("cpu"), choices=choices)
    batch = _prefill_batch(70, 70)
    t, hv, dk, dv = batch.num_tokens, 2, 8, 8
    x = torch.randn(t, 2 * 2 * dk + hv * dv)
    conv_state = torch.zeros(4, x.shape[1], 3)
    state = torch.zeros(4, hv, dk, dv)
    a, b = torch.randn(t, hv), torch.randn(t, hv)
    ops.causal_conv(x, torch.randn(x.shape[1], 4), conv_state, batch)
    ops.conv_gated_delta(x, torch.randn(x.shape[1], 4), conv_state, a, b, torch.zeros(hv),
                         torch.zeros(hv), state, batch, 0.3)  # fmt: skip
    q = torch.randn(t, hv, dk)
    ops.gdn(q, q, torch.randn(t, hv, dv), a, b.sigmoid(), state, batch, 0.3)
    assert kernel_calls == [
        ("causal_conv", tile), ("causal_conv_qkv", tile), ("gdn_prefill", None),
        ("gdn_prefill", None),
    ]  # fmt: skip

    planner = ops.attention_planner
    shape = (8, 2, 16, torch.float32, torch.float32, 0.25)
    planner.plan(batch, shape)
    assert planner.gathered_passes == int(eager_gathers)
    assert type(planner.prefill_graph_wrapper(1, torch.zeros(4, dtype=torch.int32))) is _Paged
    # the verify graphs' wrapper: the chosen FlashInfer backend (`_RowGraphs._new_shape`)
    verify = planner.prefill_graph_wrapper(2, torch.zeros(4, dtype=torch.int32), "x")
    assert verify.kwargs["backend"] == "x"
    assert planner.choices.verify_backend == (choices or OpChoices()).verify_backend
    # the FP8 decode GEMV's activations (`fp8.Fp8Gemm` inside `DecodeLinear`)
    assert ops.linear.fp8_decode == (choices or OpChoices()).fp8_decode
