"""Which CudaOps fast paths take a model (`ninfer.ops.cuda.support.plan_ops`), decided once from
its configuration and dtypes, and that an op without one runs its reference op (CPU: the
kernels are stubs that fail when touched)."""

from __future__ import annotations

import dataclasses
import logging
import types

import pytest
import torch

from ninfer.models.presets import PRESETS, build_random_model
from ninfer.ops.cuda.ops import CudaOps
from ninfer.ops.cuda.support import OPS, plan_ops
from ninfer.ops.reference import ReferenceOps
from tests.models.util import ChunkRunner, make_cache, narrow

# head_dim 80 (rotary 20), GDN dk 24 / dv 40: no kernel takes these
ODD = dataclasses.replace(
    narrow(PRESETS["9B"], layers=4),
    head_dim=80,
    linear_key_head_dim=24,
    linear_value_head_dim=40,
)


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize(("dtype", "kv"), [("bfloat16", "bfloat16"), ("bfloat16", "fp8_e4m3")])
def test_released_shapes_keep_every_fast_path(name, dtype, kv):
    plan = plan_ops(PRESETS[name].head_dims, dtype, kv)
    assert plan.fallbacks == {} and plan.decode_graphs and plan.prefill_graphs
    assert plan.warnings() == []


def test_fp32_falls_back_where_the_kernels_are_not_fp32():
    plan = plan_ops(PRESETS["9B"].head_dims, "float32", "float32")
    assert sorted(plan.fallbacks) == ["attention", "gdn_prefill"]
    assert "no float32 attention" in plan.fallbacks["attention"]
    assert "tf32" in plan.fallbacks["gdn_prefill"]
    assert plan.fast("gdn_decode") and plan.fast("qk_norm_rope")
    assert not plan.decode_graphs and not plan.prefill_graphs


def test_odd_head_dims_fall_back_per_op():
    plan = plan_ops(ODD.head_dims, "bfloat16", "bfloat16")
    assert set(plan.fallbacks) == set(OPS)
    assert "head_dim 80" in plan.fallbacks["attention"]
    assert "dk 24, dv 40" in plan.fallbacks["gdn_prefill"] == plan.fallbacks["gdn_decode"]
    assert "rotary_dim 20" in plan.fallbacks["qk_norm_rope"]
    # only the GDN dims odd: attention and its glue keep their kernels
    gdn_odd = dataclasses.replace(PRESETS["9B"], linear_value_head_dim=96)
    assert sorted(plan_ops(gdn_odd.head_dims, "bfloat16", "bfloat16").fallbacks) == [
        "gated_rms_norm", "gdn_decode", "gdn_prefill",
    ]  # fmt: skip
    # a power-of-two head dim FlashInfer does not serve
    assert sorted(
        plan_ops(
            dataclasses.replace(PRESETS["9B"], head_dim=32).head_dims, "bfloat16", "bfloat16"
        ).fallbacks
    ) == ["attention"]
    # a KV dtype FlashInfer does not pair with the queries'
    assert list(plan_ops(PRESETS["9B"].head_dims, "bfloat16", "float16").fallbacks) == ["attention"]


def test_warning_names_the_op_and_why(caplog):
    ops = _stub_ops(None)
    with caplog.at_level(logging.WARNING, logger="ninfer.ops.cuda.ops"):
        ops.configure(ODD.head_dims, "float32", "float32")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(OPS)  # one per op
    assert (
        "ninfer: CudaOps.attention runs the reference op (slow): FlashInfer has no float32"
        in (lines[0])
    )
    assert any(line.startswith("ninfer: CudaOps.gdn_decode") and "dv 40" in line for line in lines)
    assert not ops.capturable and not ops.prefill_capturable


class _Forbidden:
    """A kernel module that must not be touched."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr):
        raise AssertionError(f"{self.name}.{attr} used: the plan said reference")


def _stub_ops(model) -> CudaOps:
    """A CudaOps on the CPU: the attention, GDN and glue kernels forbidden, the conv kernel (no
    shape limit, kept by every plan) and silu_mul stood in for by the reference."""
    ref = ReferenceOps()
    ops = CudaOps.__new__(CudaOps)
    ops._attention, ops._gdn = _Forbidden("attention"), _Forbidden("gdn")
    ops._conv = types.SimpleNamespace(
        causal_conv=lambda x, w, state, batch, *rest: ref.causal_conv(x, w, state, batch)
    )
    ops._glue = types.SimpleNamespace(silu_mul=ref.silu_mul)
    ops._passes, ops.compiled, ops.conv_tile = [], False, None
    ops.linear = ref.linear
    ops._rms_norm, ops._gated_rms_norm = ref.rms_norm, ref.gated_rms_norm
    ops._rope, ops._add_rms_norm, ops._gdn_gates = ref.rope, ref.add_rms_norm, ref.gdn_gates
    ops._silu_mul, ops._sigmoid_mul = ref.silu_mul, ref.sigmoid_mul
    if model is not None:
        ops.configure(model.head_dims, "float32", "float32")
    return ops


def test_fallen_back_ops_run_the_reference_exactly():
    """The odd model through CudaOps (every kernel it cannot take forbidden): prefill chunks,
    a mixed step and decode rows give the reference ops' logits bit for bit."""
    model = build_random_model(ODD, torch.float32, "cpu", seed=3)
    logits = []
    for ops in (ReferenceOps(), _stub_ops(ODD)):
        cache = make_cache(ODD, num_pages=8, num_slots=3)
        runner = ChunkRunner(model, cache, ops, num_slots=3, seed=1)
        runner.add(0, list(range(5, 107)))
        runner.add(1, list(range(300, 342)))
        out = []
        with torch.no_grad():
            for work in ([(0, 70), (1, 40)], [(0, 30)], [(0, 1), (1, 1)], [(1, 1), (0, 1)]):
                out += [v for _, v in sorted(runner.step(work).items())]
        logits.append(torch.cat(out))
    assert torch.equal(logits[0], logits[1])
