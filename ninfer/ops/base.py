"""The op contract between the model and its kernels.

The model calls every non-trivial op through an `Ops` object that it is given, never a global:
`ninfer.ops.reference.ReferenceOps` (plain PyTorch, CPU and CUDA: the oracle) and
`ninfer.ops.cuda.CudaOps` (FlashInfer, fla-core / Triton; same signatures, same results within
the stated tolerances). Linear layers go through `linear` too (the fast path may pick another
GEMM kernel for decode-sized inputs). Shapes use T = tokens of the ragged batch, R = rows, see
`ninfer.forward`.

Ops that take `batch` may read its host lists (q_lens, ctx_lens) and device tensors (cu_q,
state_slots, block_table, slot_mapping). Ops that update state write in place into the pool
tensors they are given, at the rows' slots; they never allocate per-slot copies that outlive
the call.

In-pass snapshots (`batch.state_taps`, `ninfer.forward.StateTap`): `causal_conv` writes each
tap's conv state and `gdn` its recurrent state (so `gated_delta` and `conv_gated_delta` both)
into the tap's slot: the state a pass ending after the row's first `offset` tokens would leave
in the row's slot. An op set serves any offset of at least its `tap_stride`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ninfer.forward import ForwardBatch
from ninfer.ops.fp8 import Fp8Weight


class Ops(Protocol):
    name: str
    # `batch.state_taps` offsets this op set serves: any offset of at least it (1: any offset);
    # the grid of snapshot positions it serves cheapest
    tap_stride: int

    def linear(self, x: torch.Tensor, weight: torch.Tensor | Fp8Weight) -> torch.Tensor:
        """x [T, K] @ weight[N, K]^T -> [T, N] in x.dtype (F.linear without bias). An FP8
        weight (`ninfer.ops.fp8`) means its dequantised values rounded to x.dtype; a fast path
        may quantise x per token (and per block of K columns) to e4m3 and multiply in FP8,
        within the error of that quantisation."""
        ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """Zero-centred RMSNorm over the last dim: x * rsqrt(mean(x^2) + eps) * (1 + w).

        x [..., D] any float dtype (math in fp32, result cast to x.dtype); weight [D].
        """
        ...

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual add then `rms_norm`: returns (s, rms_norm(s, weight, eps)) with s = x + delta
        rounded to x.dtype (s = x when delta is None). x, delta [..., D]."""
        ...

    def gdn_gates(
        self, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GDN gates from the a, b projections [T, Hv] (any row stride): g = -exp(A_log) *
        softplus(a + dt_bias) in fp32, beta = sigmoid(b) in b.dtype; a_log, dt_bias [Hv]."""
        ...

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up in gate.dtype; gate, up [..., I] (may be views of one tensor)."""
        ...

    def sigmoid_mul(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x * sigmoid(gate), gate broadcast to x; in x.dtype."""
        ...

    def gated_rms_norm(
        self, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """Qwen3.5 GDN output norm: n = x * rsqrt(mean(x^2) + eps) (fp32), cast to x.dtype,
        y = (w * n) * silu(z.float()), cast to x.dtype. x, z [..., dv]; weight [dv] (not
        zero-centred)."""
        ...

    def rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
        rotary_dim: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Partial NeoX RoPE on the first `rotary_dim` dims of each head (pairs (i, i + R/2)).

        q [T, Hq, D], k [T, Hkv, D], positions [T] int64 (or [T, R/2]: a position per token
        and frequency, frequency i rotating by positions[:, i] * inv_freq[i]; the multimodal
        RoPE of passes over image tokens), inv_freq [R/2] fp32. cos/sin are computed in fp32
        and cast to the q dtype before use (as transformers does). Returns new tensors (q, k) of
        the same shapes; dims >= rotary_dim pass through.
        """
        ...

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
        """An attention layer's q / k norms then RoPE: exactly
        `rope(rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps), positions, inv_freq,
        rotary_dim)` (q, k [T, H, D], any token and head strides; positions as `rope`'s). A
        fast path may do both in one kernel per tensor (rotation in fp32, rounded once)."""
        ...

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
        """Paged causal attention with KV write.

        q [T, Hq, D], k, v [T, Hkv, D] (k already normed and rotated); kv_cache
        [pages, 2, 64, Hkv, D]. First writes every token's k, v at batch.slot_mapping (divided
        by k_scale / v_scale and cast when the cache is fp8), then each row's queries attend,
        causally, to absolute positions [0, ctx_lens[r] + i] of that row's pages (GQA: q head h
        uses kv head h // (Hq // Hkv)), softmax in fp32 with `scale`. Returns o [T, Hq, D] in
        q's dtype.
        """
        ...

    def causal_conv(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        conv_state: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Causal depthwise conv1d (width K, no bias) followed by SiLU, per row, with state.

        x [T, C] pre-conv inputs; weight [C, K] (weight[:, K-1] multiplies the current token);
        conv_state [slots, C, K-1] (a view of one GDN layer in the pool): row r reads the K-1
        inputs before its chunk from conv_state[state_slots[r]] (zeros when ctx_lens[r] == 0)
        and leaves there the last K-1 inputs up to its last token. Returns y [T, C] in x.dtype.
        """
        ...

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
        """Gated delta rule over each row, with fp32 state.

        q, k [T, Hk, dk] (not yet L2-normalised: the op applies l2norm with eps 1e-6, then
        q *= scale), v [T, Hv, dv], g [T, Hv] fp32 log-decay (<= 0), beta [T, Hv] (post-sigmoid),
        state [slots, Hv, dk, dv] fp32 (a view of one GDN layer in the pool). Value head j uses
        key head j // (Hv // Hk). Per row: S starts at state[slot] (zeros when ctx_lens[r] == 0);
        per token S = exp(g) S; d = beta (v - S^T k); S += k d^T; o = S^T q. The final S is
        written back to state[slot]. Returns o [T, Hv, dv] in v.dtype.
        """
        ...

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
        """`gdn` with its gates from the raw a, b projections [T, Hv]: exactly
        `gdn(q, k, v, *gdn_gates(a, b, a_log, dt_bias), state, batch, scale)` (a fast path may
        compute the gates inside the recurrence kernel)."""
        ...

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
        """A GDN layer's token mixer on its fused projection q | k | v: exactly
        `y = causal_conv(x, conv_weight, conv_state, batch)`, y split by channels into
        q, k [T, Hk, dk] and v [T, Hv, dv] (Hv, dk, dv from `state` [slots, Hv, dk, dv];
        Hk * dk = (C - Hv * dv) / 2), then `gated_delta(q, k, v, a, b, a_log, dt_bias, state,
        batch, scale)`. x [T, C] (unit channel stride). Returns o [T, Hv, dv] in x.dtype.
        A fast path may write q, k and v from the conv kernel straight into the layout the
        recurrence reads, L2-normalised (the same values: normalised from the conv output
        rounded to x.dtype)."""
        ...

    def moe(
        self,
        x: torch.Tensor,
        router_weight: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        top_k: int,
    ) -> torch.Tensor:
        """Routed experts of Qwen3.5-MoE (the shared expert is the model's).

        x [N, H]; router_weight [E, H]; gate_up [E, 2I, H] (first I rows gate); down [E, H, I]
        (either may be a stacked `Fp8Weight`, multiplied as `linear` multiplies one).
        p = softmax(x @ router^T in fp32); top-k (ties to the lowest expert id in the fast
        path; torch.topk promises no order), renormalised, cast to x.dtype;
        out = sum_j w_j * down_e(silu(gate_e x) * up_e x). Returns [N, H] in x.dtype.
        """
        ...

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
        """The whole Qwen3.5-MoE block: `moe` plus the sigmoid-gated shared expert.

        router_weight [E + 1, H]: the router's E rows, then the shared expert's gate row (one
        GEMV gives both); gate_up [E, 2I, H], down [E, H, I] as `moe`; shared_gate_up [2Is, H]
        (first Is rows gate), shared_down [H, Is] (any of these four may be an `Fp8Weight`).
        out = moe(x, router_weight[:E], gate_up, down, top_k)
              + sigmoid(x @ router_weight[E]^T) * shared_down(silu(g) * u),
        with g | u = x @ shared_gate_up^T. Returns [N, H] in x.dtype.
        The reference rounds to x.dtype after each step, as the model's separate ops (linear,
        silu_mul, linear, sigmoid_mul, add); a fast path may treat the shared expert as one more
        pair (weight sigmoid(logit) rounded to x.dtype) and add it to the routed terms in fp32
        before one rounding: within about an ulp of x.dtype of the reference (one rounding
        fewer, so usually closer to the exact sum).
        """
        ...
