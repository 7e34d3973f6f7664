"""`CudaOps`: the op contract (`ninfer.ops.base.Ops`) on FlashInfer, fla-core and Triton.

Attention (FlashInfer), GDN (fla-core prefill stages, own Triton decode), the causal conv (own
Triton) and decode-sized linears (cuBLAS or a Triton skinny GEMM, whichever is faster per
weight shape: `linear.py`) have fast paths; the routed MoE is sync-free (`moe.py`,
capturable);
the attention's q / k norm + RoPE and its output gate, SwiGLU and the GDN's gated output norm
are Triton (`glue.py`); the other norms and the elementwise glue (residual add + norm, GDN
gates, the shared expert's gate) are the reference's torch code, optionally through
`torch.compile` (one compiled function per helper, dynamic shapes: each becomes one or two
fused kernels, so that a CUDA graph can capture the compiled kernels once they have been warmed
up for its batch size). The kernel modules import triton / flashinfer / fla, so they are
imported when a `CudaOps` is built, not when this module is.
"""

from __future__ import annotations

import logging

import torch

from ninfer.forward import ForwardBatch, HeadDims
from ninfer.ops.choices import OpChoices
from ninfer.ops.cuda.moe import block_fusable, moe_block_decode, moe_fp8, moe_grouped
from ninfer.ops.cuda.passmeta import PassMeta  # torch only: no kernel library imported
from ninfer.ops.cuda.support import OpPlan, plan_ops
from ninfer.ops.fp8 import Fp8Weight
from ninfer.ops.reference import ReferenceOps, gdn_key_dim
from ninfer.ops.reference.dense import (
    add_rms_norm_ref,
    apply_rope_ref,
    gated_rms_norm_ref,
    gdn_gates_ref,
    moe_block_ref,
    rms_norm_ref,
    rope_cos_sin,
    sigmoid_mul_ref,
    silu_mul_ref,
)


def _rope(q, k, positions, inv_freq, rotary_dim: int):
    cos, sin = rope_cos_sin(positions, inv_freq, q.dtype)
    return apply_rope_ref(q, cos, sin, rotary_dim), apply_rope_ref(k, cos, sin, rotary_dim)


logger = logging.getLogger(__name__)
PASSES_HELD = 2  # batches whose GDN tables are kept


class _Compiled:
    """`torch.compile(fn, dynamic=True)`, falling back to `fn` for good (one warning) if
    compiling fails. Compilation happens at the first call per shape class (the engine's
    warm-up, never inside a CUDA-graph capture)."""

    def __init__(self, fn) -> None:
        self.fn, self.compiled = fn, torch.compile(fn, dynamic=True)

    def __call__(self, *args):
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as e:  # noqa: BLE001 - any compiler failure: run eagerly
                if torch.cuda.is_current_stream_capturing():
                    raise
                logger.warning("torch.compile of %s failed (%r): eager", self.fn.__name__, e)
                self.compiled = None
        return self.fn(*args)


def _compiled(fn, enabled: bool):
    return _Compiled(fn) if enabled else fn


class CudaOps(ReferenceOps):
    """Fast ops on one CUDA device. Plans attention once per `ForwardBatch` object: a caller
    must build a new batch (or change its row lengths) for every forward pass.

    `configure(dims, dtype, kv_dtype)` (or the same keywords here) decides once which fast
    paths serve the model (`support.plan_ops`); an op whose kernels cannot take its shapes or
    dtype runs the reference op, with one warning. Unconfigured, every fast path is on (the
    kernel tests' shapes).

    `choices` (`ninfer.ops.choices.OpChoices`) picks the gathered attention's use, the GDN
    prefill's intra-chunk stage and the conv's tile, fixed for the op set's life (default: the
    engine's defaults)."""

    name = "cuda"
    # state taps are read from fla's chunk states (`gdn.gdn_prefill`), advanced over the rest
    # of their chunk when off its grid: any offset (a verify row's 1 .. k included)
    tap_stride = 1

    def __init__(
        self,
        device: torch.device | str = "cuda",
        compile: bool = False,
        skinny: bool = True,
        choices: OpChoices | None = None,
    ) -> None:
        from ninfer.ops.cuda import conv, gdn, glue
        from ninfer.ops.cuda.attention import PagedAttention
        from ninfer.ops.cuda.linear import DecodeLinear

        self.choices = choices = choices or OpChoices()
        self._attention = PagedAttention(torch.device(device), choices)
        self._conv, self._gdn, self._glue = conv, gdn, glue
        # (batch, key, PassMeta) of the latest prefill passes, newest first
        self._passes: list[tuple[ForwardBatch, tuple, object]] = []
        self.compiled = compile
        # decode GEMMs: cuBLAS or Triton, raced; FP8 weights by `Fp8Gemm`
        self.linear = DecodeLinear(enabled=skinny, fp8_decode=choices.fp8_decode)
        # the prefill conv's launch shape, by `choices`
        self.conv_tile = conv.Tile(*choices.conv_tile) if choices.conv_tile else conv.TILE
        self._rms_norm = _compiled(rms_norm_ref, compile)
        self._gated_rms_norm = _compiled(gated_rms_norm_ref, compile)
        self._rope = _compiled(_rope, compile)
        self._add_rms_norm = _compiled(add_rms_norm_ref, compile)
        self._gdn_gates = _compiled(gdn_gates_ref, compile)
        self._silu_mul = _compiled(silu_mul_ref, compile)
        self._sigmoid_mul = _compiled(sigmoid_mul_ref, compile)
        self.plan = OpPlan()

    def configure(self, dims: HeadDims, dtype: str, kv_dtype: str) -> OpPlan:
        """Decides the fast paths for a model with head dims `dims` in `dtype` / `kv_dtype`
        (names, as MemoryGeometry's) and warns once per op that falls back. Returns the plan."""
        self.plan = plan_ops(dims, dtype, kv_dtype)
        for line in self.plan.warnings():
            logger.warning(line)
        return self.plan

    @property
    def capturable(self) -> bool:
        """Whether a decode step can be captured in a CUDA graph (`OpPlan.decode_graphs`)."""
        return self.plan.decode_graphs

    @property
    def prefill_capturable(self) -> bool:
        return self.plan.prefill_graphs

    @property
    def attention_planner(self):
        """The FlashInfer attention op, for the CUDA-graph runner (`graph_wrapper`, `plan`,
        `frozen`)."""
        return self._attention

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if delta is None:
            return x, self._rms_norm(x, weight, eps)
        return self._add_rms_norm(x, delta, weight, eps)

    def gdn_gates(
        self, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._gdn_gates(a, b, a_log, dt_bias)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if gate.dim() == 2 and gate.shape == up.shape and gate.stride(1) == up.stride(1) == 1:
            return self._glue.silu_mul(gate, up)  # Triton: the compiled one divides per element
        return self._silu_mul(gate, up)

    def sigmoid_mul(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        # the attention's output gate: Triton
        if self.plan.fast("sigmoid_mul") and self._glue.gate_fits(x, gate):
            return self._glue.sigmoid_gate(x, gate)
        return self._sigmoid_mul(x, gate)

    def gated_rms_norm(
        self, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        # the GDN output norm over strided z: Triton
        if self.plan.fast("gated_rms_norm") and self._glue.gated_norm_fits(x, z, weight):
            return self._glue.gated_norm(x, z, weight, eps)
        return self._gated_rms_norm(x, z, weight, eps)

    def rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
        rotary_dim: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rope(q, k, positions, inv_freq, rotary_dim)

    def qk_norm_rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        eps: float,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
        rotary_dim: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One Triton launch per tensor (`glue.norm_rope`, 1-D positions), else the compiled
        norms and RoPE."""
        glue = self._glue
        fits = self.plan.fast("qk_norm_rope") and positions.dim() == 1
        fits = fits and glue.norm_rope_fits(q, rotary_dim)
        if fits and glue.norm_rope_fits(k, rotary_dim):
            return (
                glue.norm_rope(q, q_weight, eps, positions, inv_freq, rotary_dim),
                glue.norm_rope(k, k_weight, eps, positions, inv_freq, rotary_dim),
            )
        return super().qk_norm_rope(q, k, q_weight, k_weight, eps, positions, inv_freq, rotary_dim)

    def moe(
        self,
        x: torch.Tensor,
        router_weight: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        top_k: int,
    ) -> torch.Tensor:
        if isinstance(gate_up, Fp8Weight) or isinstance(down, Fp8Weight):
            return moe_fp8(x, router_weight, gate_up, down, top_k)
        return moe_grouped(x, router_weight, gate_up, down, top_k)

    def moe_block(
        self,
        x: torch.Tensor,
        router_weight: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        shared_gate_up: torch.Tensor,
        shared_down: torch.Tensor,
        top_k: int,
    ) -> torch.Tensor:
        """Decode-sized blocks `block_fusable` accepts (bf16 or FP8 experts): `moe_block_decode`
        (four launches, the router GEMV through self.linear). Otherwise the reference's
        composition over this class's own ops (`moe`, linear, silu_mul, sigmoid_mul)."""
        args = (x, router_weight, gate_up, down, shared_gate_up, shared_down, top_k)
        if block_fusable(*args):
            return moe_block_decode(*args, self.linear)
        return moe_block_ref(*args, self.moe, self.linear, self.silu_mul, self.sigmoid_mul)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        batch: ForwardBatch,
        scale: float,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> torch.Tensor:
        if not self.plan.fast("attention"):
            return super().attention(q, k, v, kv_cache, batch, scale, k_scale, v_scale)
        return self._attention(q, k, v, kv_cache, batch, scale, k_scale, v_scale)

    def causal_conv(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        conv_state: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        if batch.is_decode:
            return self._conv.causal_conv(x, weight, conv_state, batch)
        meta = self.pass_meta(batch)
        taps = meta.taps  # the initial conv state near-start taps need: read before the conv
        init = None if taps is None else self._conv.tap_init(conv_state, batch.state_slots, meta)
        y = self._conv.causal_conv(x, weight, conv_state, batch, meta, self.conv_tile)
        if taps is not None:
            self._conv.write_taps(x, weight.shape[1], conv_state, meta.taps, init)
        return y

    def pass_meta(self, batch: ForwardBatch):
        """The `PassMeta` tables of a prefill pass, built by its first GDN layer and shared by
        the rest (host-built and copied once per pass, not once per layer), or the ones bound
        to `batch` by `bind_pass`."""
        key = (tuple(batch.q_lens), tuple(batch.ctx_lens))
        for held, held_key, meta in self._passes:
            if held is batch and held_key == key:
                return meta
        meta = PassMeta.of(batch.q_lens, batch.ctx_lens, batch.cu_q.device, batch.state_taps)
        self.bind_pass(batch, meta)
        return meta

    def bind_pass(self, batch: ForwardBatch, meta) -> None:
        """Makes `meta` (a `PassMeta`) the tables of `batch`'s pass: the prefill-graph runner
        binds its static buffers before a capture (their contents are refilled per replay)."""
        key = (tuple(batch.q_lens), tuple(batch.ctx_lens))
        held = [p for p in self._passes if p[0] is not batch]
        self._passes = [(batch, key, meta), *held[: PASSES_HELD - 1]]

    def gated_delta(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        a_log: torch.Tensor,
        dt_bias: torch.Tensor,
        state: torch.Tensor,
        batch: ForwardBatch,
        scale: float,
    ) -> torch.Tensor:
        if batch.is_decode and self.plan.fast("gdn_decode"):  # gates inside: one launch
            slots = batch.state_slots
            return self._gdn.gdn_decode(q, k, v, a, b, state, slots, scale, (a_log, dt_bias))
        return super().gated_delta(q, k, v, a, b, a_log, dt_bias, state, batch, scale)

    def conv_gated_delta(
        self,
        x: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_state: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        a_log: torch.Tensor,
        dt_bias: torch.Tensor,
        state: torch.Tensor,
        batch: ForwardBatch,
        scale: float,
    ) -> torch.Tensor:
        """Prefill: the conv writes q, k (L2-normalised) and v contiguous, as fla reads them
        (`conv.causal_conv_qkv`), then the gates and the chunked rule, or, for the verify
        graphs' short rows (`PassMeta.tap_tok`), `gdn.gdn_rows` with the gates in its kernel;
        decode, or channels the conv kernel cannot split by head: the composition of
        `causal_conv` and `gated_delta`."""
        key_dim, dk = gdn_key_dim(x.shape[1], state), state.shape[2]
        fast = self.plan.fast("gdn_prefill") and self._conv.splits_heads(x.shape[1], key_dim, dk)
        if batch.is_decode or not fast:
            return super().conv_gated_delta(
                x, conv_weight, conv_state, a, b, a_log, dt_bias, state, batch, scale
            )
        meta = self.pass_meta(batch)
        taps = meta.taps  # the initial conv state near-start taps need: read before the conv
        init = None if taps is None else self._conv.tap_init(conv_state, batch.state_slots, meta)
        q, k, v = self._conv.causal_conv_qkv(
            x, conv_weight, conv_state, batch, meta, key_dim, dk, self.conv_tile
        )
        if taps is not None:
            self._conv.write_taps(x, conv_weight.shape[1], conv_state, meta.taps, init)
        slots = batch.state_slots
        if meta.tap_tok is not None:  # the verify graphs' short rows: the gates in the kernel
            gates = (a_log, dt_bias)
            return self._gdn.gdn_rows(q, k, v, a, b, state, slots, scale, meta, gates=gates)
        g, beta = self.gdn_gates(a, b, a_log, dt_bias)
        return self._gdn.gdn_prefill(q, k, v, g, beta, state, slots, scale, meta, normalized=True)

    def gdn(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
        batch: ForwardBatch,
        scale: float,
    ) -> torch.Tensor:
        if batch.is_decode and self.plan.fast("gdn_decode"):
            return self._gdn.gdn_decode(q, k, v, g, beta, state, batch.state_slots, scale)
        if batch.is_decode or not self.plan.fast("gdn_prefill"):
            return super().gdn(q, k, v, g, beta, state, batch, scale)
        meta = self.pass_meta(batch)
        return self._gdn.gdn_prefill(q, k, v, g, beta, state, batch.state_slots, scale, meta)
