"""Qwen3.5 dense and MoE text models (Gated DeltaNet + gated full attention) over a ragged batch.

Attribute names mirror the checkpoint keys (`model.layers.N.linear_attn.in_proj_qkv.weight`,
...), so weight loading is a plain name match. Every op with a kernel (linears included), and
the elementwise glue a fast path fuses (residual add + norm, GDN gates, SwiGLU, the attention
output gate), goes through the `Ops` object passed to `forward`. The forward has no host syncs
of its own.

`fuse_projections()` (called by the engine on CUDA) concatenates the projections that read the
same input (GDN in_proj_qkv | z | b | a, attention q | k | v, MLP gate | up, MoE router | shared
expert gate) into one weight each, so a decode step runs 4 skinny GEMMs per layer instead of 7
or 8, and a fused MoE block is one `ops.moe_block` (4 launches on CUDA at decode). The original
parameters become row views of the fused weight: names, `state_dict` and in-place loads are
unchanged, and no memory is added. Products are computed row by row either way, so outputs
match the unfused path up to the GEMM library's choice of reduction order (with the reference
ops, bit for bit on the CPU; `CudaOps.moe_block` rounds the MoE sum once, see `Ops.moe_block`).
Only parts of one kind fuse (`fuses_with`): dense with dense, FP8 with FP8 when every part's
rows are whole blocks; an FP8 GDN layer whose b and a stay dense fuses qkv | z and b | a.

A linear slot holds an nn.Linear or an `Fp8Linear` (`ninfer.models.quantize` decides which);
`weight_of` gives the op set either's weight, and the experts hand theirs through
`Experts.weights()`.

Knows nothing about requests, scheduling, pages or state slots beyond the indices carried by
`ForwardBatch`; it never allocates cache memory.
"""

from __future__ import annotations

import torch
from torch import nn

from ninfer.forward import ForwardBatch, ModelCache
from ninfer.models.config import Qwen35Config
from ninfer.models.fp8 import Fp8Linear, fuses_with
from ninfer.ops.base import Ops
from ninfer.ops.fp8 import FP8_DTYPE, Fp8Weight, quantize_fp8, scale_shape


class RMSNorm(nn.Module):
    """Holds a norm weight [D] and its eps; the maths is the op's: `ops.rms_norm` (zero-centred,
    1 + w, weight starts at 0) or, for `linear_attn.norm`, `ops.gated_rms_norm` (plain w, starts
    at 1)."""

    def __init__(self, dim: int, eps: float, init: float = 0.0, **factory) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), init, **factory))
        self.eps = eps


def _linear(n_in: int, n_out: int, factory: dict) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=False, **factory)


def weight_of(m: nn.Module) -> torch.Tensor | Fp8Weight:
    """What `ops.linear` multiplies by for linear module `m` (nn.Linear or `Fp8Linear`)."""
    return m.packed if isinstance(m, Fp8Linear) else m.weight


def _cat_rows(linears: list[nn.Module], attr: str) -> torch.Tensor:
    """One tensor holding the rows of each module's `attr` in order; each module's `attr`
    becomes a view of its rows."""
    parts = [getattr(m, attr) for m in linears]
    fused = torch.cat([p.detach() for p in parts])
    start = 0
    for m, p in zip(linears, parts, strict=True):
        setattr(m, attr, nn.Parameter(fused[start : start + p.shape[0]], requires_grad=False))
        start += p.shape[0]
    return fused


def fuse_rows(linears: list[nn.Module]) -> torch.Tensor | Fp8Weight:
    """One weight [sum of N_i, K] holding the rows of `linears` in order (FP8: the values and
    the scales, `fuses_with` must hold); each module's weight becomes a view of its rows (the
    separate copies are freed once nothing else holds them)."""
    first = linears[0]
    if isinstance(first, Fp8Linear):
        qweight, scale = _cat_rows(linears, "weight"), _cat_rows(linears, "weight_scale_inv")
        return Fp8Weight(qweight, scale, first.block)
    return _cat_rows(linears, "weight")


def _views(fused: torch.Tensor, linears, attr: str) -> bool:
    ptr, row_bytes = fused.data_ptr(), fused.stride(0) * fused.element_size()
    for m in linears:
        part = getattr(m, attr)
        if part.data_ptr() != ptr:
            return False
        ptr += part.shape[0] * row_bytes
    return True


def fused_weight(
    fused: torch.Tensor | Fp8Weight | None, linears: tuple[nn.Module, ...]
) -> torch.Tensor | Fp8Weight | None:
    """`fused` while every one of `linears` still views its rows (None when never fused, or when
    a parameter was replaced or moved since: then the separate weights are used)."""
    if fused is None:
        return None
    if isinstance(fused, Fp8Weight):
        ok = _views(fused.qweight, linears, "weight")
        ok = ok and _views(fused.scale, linears, "weight_scale_inv")
    else:
        ok = _views(fused, linears, "weight")
    return fused if ok else None


def fuse(fused, linears: tuple[nn.Module, ...]) -> torch.Tensor | Fp8Weight | None:
    """`fused` if still valid, else `linears` fused anew, or None when they cannot share one
    weight (`fuses_with`: dense with FP8, or FP8 parts off the block grid)."""
    if fused_weight(fused, linears) is not None:
        return fused
    return fuse_rows(list(linears)) if fuses_with(list(linears)) else None


def project(x: torch.Tensor, fused, parts, ops: Ops) -> list[torch.Tensor]:
    """x through each of `parts` (linear modules): one GEMM split by rows while `fused` is
    valid, else one GEMM per part."""
    if fused_weight(fused, parts) is None:
        return [ops.linear(x, weight_of(m)) for m in parts]
    return list(ops.linear(x, fused).split([m.weight.shape[0] for m in parts], dim=-1))


class GatedDeltaNet(nn.Module):
    """`linear_attn`: projections, causal conv, gated delta rule, gated norm, out_proj."""

    def __init__(self, cfg: Qwen35Config, state_index: int, factory: dict) -> None:
        super().__init__()
        self.state_index = state_index  # this layer's position in the conv / ssm pools
        self.cfg = cfg
        h, hv = cfg.hidden_size, cfg.linear_num_value_heads
        self.in_proj_qkv = _linear(h, cfg.conv_dim, factory)
        self.in_proj_z = _linear(h, cfg.value_dim, factory)
        self.in_proj_b = _linear(h, hv, factory)
        self.in_proj_a = _linear(h, hv, factory)
        self.conv1d = nn.Conv1d(
            cfg.conv_dim, cfg.conv_dim, cfg.linear_conv_kernel_dim, groups=cfg.conv_dim,
            bias=False, **factory,
        )  # fmt: skip
        self.dt_bias = nn.Parameter(torch.ones(hv, **factory))
        self.A_log = nn.Parameter(torch.zeros(hv, **factory))
        self.norm = RMSNorm(cfg.linear_value_head_dim, cfg.rms_norm_eps, init=1.0, **factory)
        self.out_proj = _linear(cfg.value_dim, h, factory)
        # set by fuse(): qkv | z | b | a, or (FP8 qkv and z, dense b and a) qkv | z and b | a
        self.in_proj: torch.Tensor | Fp8Weight | None = None
        self.in_proj_qkvz: torch.Tensor | Fp8Weight | None = None
        self.in_proj_ba: torch.Tensor | None = None

    def _parts(self) -> tuple[nn.Module, ...]:
        return self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a

    def fuse(self) -> None:
        self.in_proj = fuse(self.in_proj, self._parts())
        if self.in_proj is None:
            self.in_proj_qkvz = fuse(self.in_proj_qkvz, self._parts()[:2])
            self.in_proj_ba = fuse(self.in_proj_ba, self._parts()[2:])

    def _project(self, x: torch.Tensor, ops: Ops) -> list[torch.Tensor]:
        """[T, C] q | k | v, [T, value_dim] z, [T, Hv] b and a (views of one GEMM when fused)."""
        parts = self._parts()
        if fused_weight(self.in_proj, parts) is not None:
            return project(x, self.in_proj, parts, ops)
        return [
            *project(x, self.in_proj_qkvz, parts[:2], ops),
            *project(x, self.in_proj_ba, parts[2:], ops),
        ]

    def forward(
        self, x: torch.Tensor, batch: ForwardBatch, cache: ModelCache, ops: Ops
    ) -> torch.Tensor:
        cfg, t = self.cfg, x.shape[0]
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        mixed, z, b, a = self._project(x, ops)  # mixed [T, C] = q | k | v
        z = z.view(t, -1, dv)

        conv_weight = self.conv1d.weight.squeeze(1)  # [C, K]
        conv_state, state = cache.conv[:, self.state_index], cache.ssm[:, self.state_index]
        o = ops.conv_gated_delta(
            mixed, conv_weight, conv_state, a, b, self.A_log, self.dt_bias, state, batch,
            dk**-0.5,
        )  # fmt: skip
        o = ops.gated_rms_norm(o, z, self.norm.weight, self.norm.eps)
        return ops.linear(o.reshape(t, cfg.value_dim), weight_of(self.out_proj))


class GatedAttention(nn.Module):
    """`self_attn`: q (with per-head output gate), k, v, q/k norms, partial RoPE, paged
    attention, sigmoid gate, o_proj."""

    def __init__(self, cfg: Qwen35Config, kv_index: int, factory: dict) -> None:
        super().__init__()
        self.kv_index = kv_index  # this layer's entry in cache.kv
        self.cfg = cfg
        h, hd = cfg.hidden_size, cfg.head_dim
        nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = _linear(h, nh * hd * 2, factory)
        self.k_proj = _linear(h, nkv * hd, factory)
        self.v_proj = _linear(h, nkv * hd, factory)
        self.o_proj = _linear(nh * hd, h, factory)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, **factory)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, **factory)
        self.qkv_proj: torch.Tensor | Fp8Weight | None = None  # q | k | v, set by fuse()

    def fuse(self) -> None:
        self.qkv_proj = fuse(self.qkv_proj, (self.q_proj, self.k_proj, self.v_proj))

    def _project(self, x: torch.Tensor, ops: Ops) -> list[torch.Tensor]:
        return project(x, self.qkv_proj, (self.q_proj, self.k_proj, self.v_proj), ops)

    def forward(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        cache: ModelCache,
        ops: Ops,
        inv_freq: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`positions`: the rotary positions ([T], or [T, R/2] per frequency: multimodal RoPE,
        `Qwen35ForCausalLM.rope_positions`); None: `batch.positions`."""
        cfg, t, hd = self.cfg, x.shape[0], self.cfg.head_dim
        positions = batch.positions if positions is None else positions
        # Per head, q_proj rows are [q_h | gate_h] (interleaved, not all q then all gates).
        q, k, v = self._project(x, ops)
        q, gate = q.view(t, -1, 2 * hd).chunk(2, dim=-1)
        k, v = k.view(t, -1, hd), v.view(t, -1, hd)
        q, k = ops.qk_norm_rope(
            q, k, self.q_norm.weight, self.k_norm.weight, cfg.rms_norm_eps, positions, inv_freq,
            cfg.rotary_dim,
        )  # fmt: skip
        f = self.kv_index
        k_scale = cache.k_scale[f] if cache.k_scale is not None else None
        v_scale = cache.v_scale[f] if cache.v_scale is not None else None
        o = ops.attention(q, k, v, cache.kv[f], batch, hd**-0.5, k_scale, v_scale)
        o = ops.sigmoid_mul(o.view(t, -1, hd), gate)
        return ops.linear(o.view(t, -1), weight_of(self.o_proj))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); also the MoE shared expert."""

    def __init__(self, hidden: int, intermediate: int, factory: dict) -> None:
        super().__init__()
        self.gate_proj = _linear(hidden, intermediate, factory)
        self.up_proj = _linear(hidden, intermediate, factory)
        self.down_proj = _linear(intermediate, hidden, factory)
        self.gate_up_proj: torch.Tensor | Fp8Weight | None = None  # gate | up, set by fuse()

    def fuse(self) -> None:
        self.gate_up_proj = fuse(self.gate_up_proj, (self.gate_proj, self.up_proj))

    def forward(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        gate, up = project(x, self.gate_up_proj, (self.gate_proj, self.up_proj), ops)
        return ops.linear(ops.silu_mul(gate, up), weight_of(self.down_proj))


class Experts(nn.Module):
    """Fused expert weights: gate_up_proj [E, 2I, H] (first I rows gate), down_proj [E, H, I].
    FP8 (`to_fp8`): both e4m3, with `gate_up_proj_scale_inv` / `down_proj_scale_inv`
    [E, ceil(rows / bn), ceil(cols / bk)] (`ninfer.ops.fp8`) and their blocks in `blocks`."""

    NAMES = ("gate_up_proj", "down_proj")

    def __init__(self, cfg: Qwen35Config, factory: dict) -> None:
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h, **factory))
        self.down_proj = nn.Parameter(torch.empty(e, h, i, **factory))
        self.blocks: dict[str, tuple[int, int]] = {}  # weight name -> FP8 block; {}: dense

    @torch.no_grad()
    def to_fp8(self, block_for, quantize: bool) -> None:
        """Makes both weights FP8, in blocks of `block_for(K)`: quantised from their values one
        expert at a time (`quantize`), else empty on the meta device (to be loaded)."""
        for name in self.NAMES:
            w = getattr(self, name)
            block = block_for(w.shape[-1])
            device = w.device if quantize else "meta"
            q = torch.empty(w.shape, dtype=FP8_DTYPE, device=device)
            s = torch.empty(scale_shape(tuple(w.shape), block), dtype=torch.float32, device=device)
            if quantize:
                for e in range(w.shape[0]):
                    packed = quantize_fp8(w[e], block)
                    q[e], s[e] = packed.qweight, packed.scale
            setattr(self, name, nn.Parameter(q, requires_grad=False))
            setattr(self, f"{name}_scale_inv", nn.Parameter(s, requires_grad=False))
            self.blocks[name] = block

    def weights(self) -> tuple[torch.Tensor | Fp8Weight, torch.Tensor | Fp8Weight]:
        """(gate_up, down) as `ops.moe` takes them."""
        if not self.blocks:
            return self.gate_up_proj, self.down_proj
        return tuple(
            Fp8Weight(getattr(self, n), getattr(self, f"{n}_scale_inv"), self.blocks[n])
            for n in self.NAMES
        )


class SparseMoE(nn.Module):
    """Routed experts plus a sigmoid-gated shared expert. Unfused: `ops.moe`, then the shared
    expert and its gate as separate ops. `fuse()` makes the router and the shared expert's gate
    one weight [E + 1, H] (`router`) and fuses the shared expert's gate | up; while both stay
    valid, forward is one `ops.moe_block` (same maths; on CUDA at decode one router GEMV and
    three kernels, the shared expert run as one more pair per token)."""

    def __init__(self, cfg: Qwen35Config, factory: dict) -> None:
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.gate = _linear(cfg.hidden_size, cfg.num_experts, factory)
        self.experts = Experts(cfg, factory)
        self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size, factory)
        self.shared_expert_gate = _linear(cfg.hidden_size, 1, factory)
        self.router: torch.Tensor | None = None  # gate | shared_expert_gate, set by fuse()

    def _router_parts(self) -> tuple[nn.Linear, nn.Linear]:
        return self.gate, self.shared_expert_gate

    def fuse(self) -> None:
        self.router = fuse(self.router, self._router_parts())
        self.shared_expert.fuse()

    def forward(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        shared = self.shared_expert
        gate_up, down = self.experts.weights()
        router = fused_weight(self.router, self._router_parts())
        shared_gate_up = fused_weight(shared.gate_up_proj, (shared.gate_proj, shared.up_proj))
        if router is not None and shared_gate_up is not None:
            return ops.moe_block(
                x, router, gate_up, down, shared_gate_up, weight_of(shared.down_proj), self.top_k
            )
        routed = ops.moe(x, self.gate.weight, gate_up, down, self.top_k)
        shared_gate = ops.linear(x, weight_of(self.shared_expert_gate))
        return routed + ops.sigmoid_mul(shared(x, ops), shared_gate)


class DecoderLayer(nn.Module):
    """Layer `layer_id` of the model; or, with `kv_index`, a full-attention layer outside
    `cfg.layer_types` (the MTP head's) whose K/V go to `cache.kv[kv_index]`."""

    def __init__(
        self, cfg: Qwen35Config, layer_id: int, factory: dict, kv_index: int | None = None
    ) -> None:
        super().__init__()
        self.is_full = kv_index is not None or cfg.layer_types[layer_id] == "full_attention"
        if self.is_full:
            if kv_index is None:
                kv_index = cfg.full_layer_ids.index(layer_id)
            self.self_attn = GatedAttention(cfg, kv_index, factory)
        else:
            self.linear_attn = GatedDeltaNet(cfg, cfg.gdn_layer_ids.index(layer_id), factory)
        if cfg.is_moe:
            self.mlp = SparseMoE(cfg, factory)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, factory)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)

    def fuse(self) -> None:
        (self.self_attn if self.is_full else self.linear_attn).fuse()
        self.mlp.fuse()  # MLP or SparseMoE

    def forward(
        self,
        x: torch.Tensor,
        delta: torch.Tensor | None,
        batch: ForwardBatch,
        cache: ModelCache,
        ops: Ops,
        inv_freq: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual stream, the previous layer's MLP output not yet added to it) ->
        (residual stream, this layer's MLP output). The add is fused into the next norm.
        `positions`: as `GatedAttention.forward`'s."""
        norm = self.input_layernorm
        x, h = ops.add_rms_norm(x, delta, norm.weight, norm.eps)
        if self.is_full:
            delta = self.self_attn(h, batch, cache, ops, inv_freq, positions)
        else:
            delta = self.linear_attn(h, batch, cache, ops)
        norm = self.post_attention_layernorm
        x, h = ops.add_rms_norm(x, delta, norm.weight, norm.eps)
        return x, self.mlp(h, ops)


class TextModel(nn.Module):
    """`model.*`: embed_tokens, layers, norm, the rotary buffers inv_freq and rope_axes (not
    weights), and `visual`: the vision tower (`ninfer.models.vision.VisionModel`, set by
    `ninfer.models.vision.add_vision_tower`, run by the caller: its output reaches the model
    as `ForwardBatch.embeds`) or None."""

    def __init__(self, cfg: Qwen35Config, factory: dict) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, **factory)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, factory) for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)
        # set by Qwen35ForCausalLM.init_buffers
        self.register_buffer("inv_freq", torch.empty(0), persistent=False)
        self.register_buffer("rope_axes", torch.empty(0, dtype=torch.int64), persistent=False)
        self.visual: nn.Module | None = None


class Qwen35ForCausalLM(nn.Module):
    """Qwen3.5 text model with its LM head. `forward` returns fp32 logits of the tokens at
    `batch.logits_indices`; `forward_hidden` also the final-norm hidden state of every token
    (what the MTP draft head reads). State is read from and written to `cache` in place.
    `mtp`: the checkpoint's MTP draft head (`ninfer.models.mtp.Qwen35MTP`, set by
    `ninfer.models.mtp.add_mtp_head`) or None."""

    def __init__(
        self,
        config: Qwen35Config,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        factory = {"dtype": dtype, "device": device}
        self.model = TextModel(config, factory)
        self.lm_head = _linear(config.hidden_size, config.vocab_size, factory)
        self.quant_scheme = None  # the QuantScheme of its FP8 modules (`ninfer.models.quantize`)
        self.mtp: nn.Module | None = None
        self.tie_weights()
        self.init_buffers()

    @property
    def supports_images(self) -> bool:
        """Whether image content parts can be served: the model has a vision tower."""
        return self.model.visual is not None

    def tie_weights(self) -> None:
        """Points lm_head at the embedding when the config ties them (call after replacing the
        embedding parameter)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_buffers(self) -> None:
        """(Re)computes the non-persistent rotary buffers on the embedding's device (needed
        after building on the meta device): inv_freq [R/2] fp32 and rope_axes [R/2] int64
        (`Qwen35Config.rope_axes`)."""
        r = self.config.rotary_dim
        device = self.model.embed_tokens.weight.device
        exponents = torch.arange(0, r, 2, dtype=torch.float32, device=device) / r
        self.model.inv_freq = 1.0 / (self.config.rope_theta**exponents)
        self.model.rope_axes = torch.tensor(self.config.rope_axes, device=device)

    def rope_positions(self, batch: ForwardBatch) -> torch.Tensor:
        """The rotary positions of the pass: `batch.positions` [T], or with
        `batch.mrope_positions` [3, T] the position of each token and frequency [T, R/2]
        (frequency i at axis rope_axes[i])."""
        if batch.mrope_positions is None:
            return batch.positions
        return batch.mrope_positions[self.model.rope_axes].t()

    def input_embeddings(self, batch: ForwardBatch) -> torch.Tensor:
        """[T, H]: the token embeddings, `batch.embeds` replacing its rows."""
        x = self.model.embed_tokens(batch.input_ids)
        if batch.embeds is None:
            return x
        return x.index_copy(0, batch.embeds.rows, batch.embeds.values.to(x.dtype))

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """Fuses the projections of every layer (see the module docstring). Idempotent."""
        for layer in self.model.layers:
            layer.fuse()
        if self.mtp is not None:
            self.mtp.fuse()

    def _layers(self, batch: ForwardBatch, cache: ModelCache, ops: Ops):
        """(residual stream, last MLP output) of every token after the last layer."""
        x, delta = self.input_embeddings(batch), None
        positions = self.rope_positions(batch)
        for i, layer in enumerate(self.model.layers):
            if batch.before_layer is not None:
                batch.before_layer(i)
            x, delta = layer(x, delta, batch, cache, ops, self.model.inv_freq, positions)
        return x, delta

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, cache: ModelCache, ops: Ops) -> torch.Tensor:
        x, delta = self._layers(batch, cache, ops)
        rows = batch.logits_indices
        _, x = ops.add_rms_norm(x[rows], delta[rows], self.model.norm.weight, self.model.norm.eps)
        return ops.linear(x, weight_of(self.lm_head)).float()

    @torch.no_grad()
    def forward_hidden(
        self, batch: ForwardBatch, cache: ModelCache, ops: Ops
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(fp32 logits of the tokens at `batch.logits_indices`, the final-norm hidden state
        [T, H] of every token). The norm is row-wise, so the logits are `forward`'s."""
        x, delta = self._layers(batch, cache, ops)
        _, hidden = ops.add_rms_norm(x, delta, self.model.norm.weight, self.model.norm.eps)
        logits = ops.linear(hidden[batch.logits_indices], weight_of(self.lm_head)).float()
        return logits, hidden
