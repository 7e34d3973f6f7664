"""`ReferenceOps`: the op contract (`ninfer.ops.base.Ops`) in plain PyTorch, CPU and CUDA.

This is the oracle the CUDA ops are tested against, so it favours obvious code over speed: it
loops over rows in Python and syncs with the host freely. The pure functions it is built from
are exported for kernel tests. Knows nothing about the model's structure.
"""

from __future__ import annotations

import torch

from ninfer.forward import ForwardBatch, row_taps
from ninfer.ops.fp8 import Fp8Weight
from ninfer.ops.reference.attention import gather_kv_ref, paged_attention_ref, write_kv_ref
from ninfer.ops.reference.conv import causal_conv1d_ref, causal_conv1d_update_ref
from ninfer.ops.reference.dense import (
    add_rms_norm_ref,
    apply_rope_ref,
    gated_rms_norm_ref,
    gdn_gates_ref,
    linear_ref,
    moe_block_ref,
    moe_ref,
    rms_norm_ref,
    rope_cos_sin,
    route_ref,
    sigmoid_mul_ref,
    silu_mul_ref,
)
from ninfer.ops.reference.gdn import (
    chunk_gated_delta_rule_ref,
    l2norm,
    recurrent_gated_delta_rule_ref,
)

__all__ = [
    "ReferenceOps",
    "apply_rope_ref",
    "causal_conv1d_ref",
    "causal_conv1d_update_ref",
    "chunk_gated_delta_rule_ref",
    "gated_rms_norm_ref",
    "gather_kv_ref",
    "l2norm",
    "linear_ref",
    "moe_block_ref",
    "moe_ref",
    "paged_attention_ref",
    "recurrent_gated_delta_rule_ref",
    "rms_norm_ref",
    "rope_cos_sin",
    "route_ref",
    "write_kv_ref",
]


def _row_starts(batch: ForwardBatch) -> list[int]:
    starts, t = [], 0
    for n in batch.q_lens:
        starts.append(t)
        t += n
    return starts


def _read_states(pool: torch.Tensor, batch: ForwardBatch, rows: list[int]) -> torch.Tensor:
    """The pool entries of `rows` at their slots, zeros for rows starting a sequence."""
    idx = torch.tensor(rows, device=pool.device)
    states = pool[batch.state_slots[idx]]
    fresh = torch.tensor([batch.ctx_lens[r] == 0 for r in rows], device=pool.device)
    return torch.where(fresh.view(-1, *[1] * (states.dim() - 1)), 0, states)


def _write_states(pool: torch.Tensor, batch: ForwardBatch, rows: list[int], new) -> None:
    idx = torch.tensor(rows, device=pool.device)
    pool[batch.state_slots[idx]] = new.to(pool.dtype)


def gdn_key_dim(channels: int, state: torch.Tensor) -> int:
    """Hk * dk of a GDN layer whose fused q | k | v has `channels` channels, from its state pool
    [slots, Hv, dk, dv] (`Ops.conv_gated_delta`: C = 2 Hk dk + Hv dv)."""
    hv, _, dv = state.shape[1:]
    return (channels - hv * dv) // 2


def split_qkv(y: torch.Tensor, state: torch.Tensor):
    """A GDN layer's conv output y [T, C] as views q, k [T, Hk, dk], v [T, Hv, dv], with Hv, dk
    and dv from its state pool [slots, Hv, dk, dv] (`Ops.conv_gated_delta`)."""
    hv, dk, dv = state.shape[1:]
    key_dim = gdn_key_dim(y.shape[1], state)
    q, k, v = y.split([key_dim, key_dim, hv * dv], dim=-1)
    t = y.shape[0]
    return q.view(t, -1, dk), k.view(t, -1, dk), v.view(t, hv, dv)


class ReferenceOps:
    """Plain-PyTorch `Ops`. Decode rows (q_len == 1) of conv and GDN run batched in their
    one-step forms; prefill rows run one at a time in the chunked forms. A prefill row with
    state taps runs its recurrence in parts split at the taps (the state between two parts goes
    through the pool's dtype, as a pass ending there would leave it), so a tap equals the
    state of a pass ending at it, bit for bit."""

    name = "reference"
    tap_stride = 1

    def linear(self, x: torch.Tensor, weight: torch.Tensor | Fp8Weight) -> torch.Tensor:
        return linear_ref(x, weight)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm_ref(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm_ref(x, delta, weight, eps)

    def gdn_gates(
        self, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return gdn_gates_ref(a, b, a_log, dt_bias)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return silu_mul_ref(gate, up)

    def sigmoid_mul(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return sigmoid_mul_ref(x, gate)

    def gated_rms_norm(
        self, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        return gated_rms_norm_ref(x, z, weight, eps)

    def rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
        rotary_dim: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rope_cos_sin(positions, inv_freq, q.dtype)
        return apply_rope_ref(q, cos, sin, rotary_dim), apply_rope_ref(k, cos, sin, rotary_dim)

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
        q, k = self.rms_norm(q, q_weight, eps), self.rms_norm(k, k_weight, eps)
        return self.rope(q, k, positions, inv_freq, rotary_dim)

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
        write_kv_ref(k, v, kv_cache, batch.slot_mapping, k_scale, v_scale)
        return paged_attention_ref(
            q, kv_cache, batch.block_table, batch.q_lens, batch.ctx_lens, scale, k_scale, v_scale
        )

    def causal_conv(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        conv_state: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        y = torch.empty_like(x)
        starts = _row_starts(batch)
        decode = [r for r, n in enumerate(batch.q_lens) if n == 1]
        if decode:
            tok = torch.tensor([starts[r] for r in decode], device=x.device)
            y[tok], new = causal_conv1d_update_ref(
                x[tok], weight, _read_states(conv_state, batch, decode)
            )
            _write_states(conv_state, batch, decode, new)
        for r, n in enumerate(batch.q_lens):
            if n > 1:
                s = starts[r]
                init = _read_states(conv_state, batch, [r])[0]
                y[s : s + n], final = causal_conv1d_ref(x[s : s + n], weight, init)
                _write_states(conv_state, batch, [r], final[None])
                width = init.shape[1]
                for offset, slot in row_taps(batch.state_taps, r):
                    # the last K-1 inputs before the tap (the conv's own state rule)
                    xs = torch.cat([init.t().to(x.dtype), x[s : s + offset]])
                    conv_state[slot] = xs[offset : offset + width].t().to(conv_state.dtype)
        return y

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
        g, beta = self.gdn_gates(a, b, a_log, dt_bias)
        return self.gdn(q, k, v, g, beta, state, batch, scale)

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
        y = self.causal_conv(x, conv_weight, conv_state, batch)
        q, k, v = split_qkv(y, state)
        return self.gated_delta(q, k, v, a, b, a_log, dt_bias, state, batch, scale)

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
        o = torch.empty_like(v)
        starts = _row_starts(batch)
        decode = [r for r, n in enumerate(batch.q_lens) if n == 1]
        if decode:
            tok = torch.tensor([starts[r] for r in decode], device=v.device)
            step = (x[tok][:, None] for x in (q, k, v, g, beta))  # [N, 1, ...]
            out, final = recurrent_gated_delta_rule_ref(
                *step, scale=scale, initial_state=_read_states(state, batch, decode)
            )
            o[tok] = out[:, 0]
            _write_states(state, batch, decode, final)
        for r, n in enumerate(batch.q_lens):
            if n > 1:
                s = _read_states(state, batch, [r])
                cuts = [0, *(offset for offset, _ in row_taps(batch.state_taps, r)), n]
                dsts = [slot for _, slot in row_taps(batch.state_taps, r)]
                for i in range(len(cuts) - 1):
                    sl = slice(starts[r] + cuts[i], starts[r] + cuts[i + 1])
                    part = (x[sl][None] for x in (q, k, v, g, beta))
                    # a one-token part runs as a one-token pass would: the recurrent form
                    one = cuts[i + 1] - cuts[i] == 1
                    form = recurrent_gated_delta_rule_ref if one else chunk_gated_delta_rule_ref
                    out, s = form(*part, scale=scale, initial_state=s)
                    o[sl] = out[0]
                    s = s.to(state.dtype)
                    if i < len(dsts):
                        state[dsts[i]] = s[0]
                _write_states(state, batch, [r], s)
        return o

    def moe(
        self,
        x: torch.Tensor,
        router_weight: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        top_k: int,
    ) -> torch.Tensor:
        return moe_ref(x, router_weight, gate_up, down, top_k)

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
        return moe_block_ref(x, router_weight, gate_up, down, shared_gate_up, shared_down, top_k)
