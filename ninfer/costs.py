"""Time estimates from the model's shape and the device's rates: the one prefill model behind
the scheduler's pass sizing (`pass_seconds`, `solo_chunk_pays`, read by `config.resolve`) and the
cache's cost model (`cache_cost_model`, design §6.2, §9.4), and the copy rates of restores and
write-through. Every time estimate of the package is made here.

    prefill of T tokens after B cached, one logits row (`PrefillShape.flops`):
        flops = token_flops * T                      2 x active matmul parameters per token
                                                     (LM head excluded) + the GDN recurrence
              + pair_flops * (B*T + T*(T+1)/2)       attention: 4 x heads x head_dim per
                                                     query-key pair, every full layer
              + head_flops                           the LM head, for the logits row
        seconds = flops / (prefill_fraction x matmul peak) + pass_overhead_s per pass

This is the package's one prefill count: the bench's bounds use it too
(`ninfer.bench.model_math.prefill_flops`). It is written from the configuration alone, so that
this module needs no torch; tests hold it to the count from a meta-device model's parameters.
The rates come from `DeviceRates`: on CUDA a short probe of the device at start-up (matmul peak
in the model dtype, pinned Host<->Device copies; cached per process), on the CPU fixed figures,
and the nominal CUDA figures (`CUDA_NOMINAL`) where no probe ran (`resolve()` without facts).
Costs only rank choices (§10.10): a rate off by a factor changes which source looks cheaper,
never what is valid.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ninfer.cache.cost import CacheCostModel

if TYPE_CHECKING:  # shapes are read by attribute; importing the model package needs torch
    from ninfer.models.config import Qwen35Config

# The fraction of the matmul peak (a square product in the model dtype) that a long prefill
# pass reaches: its FLOPs (this module's count) over its seconds (docs/results-h200.md, MFU).
PREFILL_FRACTION = 0.75


@dataclass(frozen=True, slots=True)
class DeviceRates:
    """What the device can do, per second. `half_flops_per_s`: a bf16 / fp16 matmul;
    `fp32_flops_per_s`: an fp32 one; copies count the bytes moved once."""

    half_flops_per_s: float
    fp32_flops_per_s: float
    h2d_bytes_per_s: float  # pinned Host -> Device (restores)
    d2h_bytes_per_s: float  # Device -> pinned Host (write-through)
    pass_overhead_s: float  # fixed cost of one forward pass (launches, planning, sync)
    copy_latency_s: float  # fixed cost of one batch of copies (launch, event)
    source: str  # "probe" | "nominal" | "cpu"

    def prefill_flops_per_s(self, dtype: str) -> float:
        """The FLOP rate a prefill pass reaches in `dtype` ("float32" or a 16-bit type)."""
        peak = self.fp32_flops_per_s if dtype == "float32" else self.half_flops_per_s
        return PREFILL_FRACTION * peak


# Planning constants for a CUDA device nobody probed, from one H200: the bf16 8192^3 product and
# the pinned Host copies as docs/results-h200.md measured them; fp32 without tensor cores below
# the datasheet's 67 TFLOP/s (torch keeps TF32 off for fp32 matmuls by default).
CUDA_NOMINAL = DeviceRates(
    half_flops_per_s=780e12,
    fp32_flops_per_s=50e12,
    h2d_bytes_per_s=55e9,
    d2h_bytes_per_s=55e9,
    pass_overhead_s=2e-3,
    copy_latency_s=20e-6,
    source="nominal",
)
# The CPU reference path: fp32 matmuls on a few cores and a large fixed cost per pass (the
# reference ops loop over rows in Python and sync freely); "copies" are memcpy.
CPU_RATES = DeviceRates(
    half_flops_per_s=10e9,
    fp32_flops_per_s=30e9,
    h2d_bytes_per_s=10e9,
    d2h_bytes_per_s=10e9,
    pass_overhead_s=0.05,
    copy_latency_s=0.0,
    source="cpu",
)


@dataclass(frozen=True, slots=True)
class PrefillShape:
    """A model's prefill FLOPs by part (module docstring)."""

    token_flops: float  # per prompt token: matmuls (LM head excluded) and the GDN recurrence
    pair_flops: float  # per attended query-key pair, over every full-attention layer
    head_flops: float  # per logits row: the LM head

    @classmethod
    def of(cls, cfg: Qwen35Config) -> PrefillShape:
        return cls(
            token_flops=2 * active_matmul_params(cfg) + gdn_flops_per_token(cfg),
            pair_flops=4 * cfg.num_attention_heads * cfg.head_dim * len(cfg.full_layer_ids),
            head_flops=2 * cfg.vocab_size * cfg.hidden_size,
        )

    def flops(self, tokens: int, cached: int = 0, logits_rows: int = 1) -> float:
        """FLOPs of `tokens` tokens after `cached`, `logits_rows` rows through the LM head."""
        if tokens <= 0:
            return 0.0
        pairs = tokens * cached + tokens * (tokens + 1) / 2
        return (
            self.token_flops * tokens
            + self.pair_flops * pairs
            + self.head_flops * min(logits_rows, tokens)
        )


def active_matmul_params(cfg: Qwen35Config) -> int:
    """Matmul weights one token multiplies, LM head excluded (MoE: its top-k experts, the
    shared expert and the router), from the layer shapes of `ninfer.models.qwen3_5`."""
    h = cfg.hidden_size
    gdn = h * (cfg.conv_dim + cfg.value_dim + 2 * cfg.linear_num_value_heads)  # qkv, z, b, a
    gdn += cfg.value_dim * h  # out_proj
    heads = cfg.num_attention_heads * cfg.head_dim
    full = h * (2 * heads + 2 * cfg.num_key_value_heads * cfg.head_dim) + heads * h
    if cfg.is_moe:
        mlp = 3 * h * cfg.moe_intermediate_size * cfg.num_experts_per_tok
        mlp += 3 * h * cfg.shared_expert_intermediate_size + h * (cfg.num_experts + 1)
    else:
        mlp = 3 * h * cfg.intermediate_size
    n_full = len(cfg.full_layer_ids)
    n_gdn = cfg.num_hidden_layers - n_full
    return n_gdn * gdn + n_full * full + cfg.num_hidden_layers * mlp


def gdn_flops_per_token(cfg: Qwen35Config) -> int:
    """The gated delta rule's state update and read-out: 6 x Hv x dk x dv per GDN layer."""
    per_layer = 6 * cfg.linear_num_value_heads * cfg.linear_key_head_dim
    return per_layer * cfg.linear_value_head_dim * len(cfg.gdn_layer_ids)


def prefill_seconds(cfg: Qwen35Config, flops_per_s: float, tokens: int, cached: int = 0) -> float:
    """Compute time of one pass of `tokens` prompt tokens after `cached`, at a prefill rate of
    `flops_per_s` (`DeviceRates.prefill_flops_per_s`), without the pass's fixed overhead."""
    return PrefillShape.of(cfg).flops(tokens, cached) / flops_per_s


def pass_seconds(model: Qwen35Config, tokens: int, flops_per_s: float | None = None) -> float:
    """A cold prefill pass's compute time (`prefill_seconds`), at `flops_per_s` (default: the
    nominal CUDA device's bf16 rate): the compute part of the cache's cost model for that pass
    (`cache_cost_model`)."""
    rate = flops_per_s or CUDA_NOMINAL.prefill_flops_per_s("bfloat16")
    return prefill_seconds(model, rate, tokens)


# Planning constants: an eager prefill pass's host time, Python and kernel launches per layer, as
# profiled on the H200 (docs/results-h200.md, "longer passes for a lone prompt").
HOST_S_PER_GDN_LAYER = 2.4e-3
HOST_S_PER_FULL_LAYER = 1.05e-3


def solo_chunk_pays(model: Qwen35Config, tokens: int, flops_per_s: float | None = None) -> bool:
    """Whether an eager pass of `tokens` tokens keeps the GPU busy: its compute time
    (`pass_seconds`) is at least twice the host's time to launch it. Passes above
    `prefill_graph_tokens` run eagerly, so a small model's long pass would wait on the host."""
    gpu_s = pass_seconds(model, tokens, flops_per_s)
    n_full = len(model.full_layer_ids)
    host_s = HOST_S_PER_GDN_LAYER * (model.num_hidden_layers - n_full)
    host_s += HOST_S_PER_FULL_LAYER * n_full
    return gpu_s >= 2 * host_s


def cache_cost_model(
    cfg: Qwen35Config,
    flops_per_s: float,
    h2d_bytes_per_s: float,
    pass_overhead_s: float,
    chunk_tokens: int,
    copy_latency_s: float = 0.0,
) -> CacheCostModel:
    """The cache's cost model for this model at these rates: the same FLOPs as
    `prefill_seconds`, in `CacheCostModel`'s linear form (the LM head's one row per request
    counted into each pass's fixed cost)."""
    shape = PrefillShape.of(cfg)
    return CacheCostModel(
        token_s=shape.token_flops / flops_per_s,
        pair_s=shape.pair_flops / flops_per_s,
        chunk_s=pass_overhead_s + shape.head_flops / flops_per_s,
        chunk_tokens=chunk_tokens,
        h2d_bytes_per_s=h2d_bytes_per_s,
        batch_latency_s=copy_latency_s,
    )


def rates_for(device: str) -> DeviceRates:
    """The rates of `device`: the CPU's fixed figures, or a probe of a CUDA device (once per
    process and device)."""
    if not device.startswith("cuda"):
        return CPU_RATES
    return _probe_cuda(device)


@functools.cache
def _probe_cuda(device: str) -> DeviceRates:
    """Times the device briefly (~0.5 s): a bf16 8192^3 and an fp32 4096^3 product, and
    64 MiB pinned copies each way (`ninfer.probe`), then releases what it allocated."""
    import torch

    from ninfer.probe import link_bandwidth, matmul_peak, readback_bandwidth

    dev = torch.device(device)
    with torch.cuda.device(dev):
        rates = DeviceRates(
            half_flops_per_s=matmul_peak(dev, torch.bfloat16),
            fp32_flops_per_s=matmul_peak(dev, torch.float32, n=4096),
            h2d_bytes_per_s=link_bandwidth(dev, mib=64),
            d2h_bytes_per_s=readback_bandwidth(dev, mib=64),
            pass_overhead_s=CUDA_NOMINAL.pass_overhead_s,
            copy_latency_s=CUDA_NOMINAL.copy_latency_s,
            source="probe",
        )
        torch.cuda.empty_cache()
    if not all(math.isfinite(x) and x > 0 for x in _figures(rates)):
        return CUDA_NOMINAL
    return rates


def _figures(r: DeviceRates) -> tuple[float, ...]:
    return r.half_flops_per_s, r.fp32_flops_per_s, r.h2d_bytes_per_s, r.d2h_bytes_per_s
