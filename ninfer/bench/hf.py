"""The side-by-side baseline: Hugging Face transformers on the same model, in the same run.

The transformers model is built from the same `Qwen35Config` and loaded with the very same
state dict (ninfer's parameter names mirror the checkpoint keys, so the match is strict), or
read from the checkpoint folder when there is one. It runs the same prefill sizes and greedy
decode as the ninfer benchmarks, with transformers' own cache, one batch at a time; the first
greedy tokens are compared with ninfer's as a sanity check. transformers is an optional
dependency (the `test` extra).
"""

from __future__ import annotations

import inspect
import time

import torch

from ninfer.models.config import Qwen35Config
from ninfer.probe import sync


def hf_config(cfg: Qwen35Config, dtype: torch.dtype):
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    kwargs = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        layer_types=list(cfg.layer_types),
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        linear_num_key_heads=cfg.linear_num_key_heads,
        linear_num_value_heads=cfg.linear_num_value_heads,
        linear_key_head_dim=cfg.linear_key_head_dim,
        linear_value_head_dim=cfg.linear_value_head_dim,
        linear_conv_kernel_dim=cfg.linear_conv_kernel_dim,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.partial_rotary_factor,
        },
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        dtype=dtype,
    )
    if not cfg.is_moe:
        return Qwen3_5TextConfig(intermediate_size=cfg.intermediate_size, **kwargs)
    return Qwen3_5MoeTextConfig(
        num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        moe_intermediate_size=cfg.moe_intermediate_size,
        shared_expert_intermediate_size=cfg.shared_expert_intermediate_size,
        **kwargs,
    )


@torch.no_grad()
def build_hf_model(cfg: Qwen35Config, state_dict: dict, dtype: torch.dtype, device: torch.device):
    """A transformers model holding `state_dict` (strict), in eval mode on `device`."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM

    cls = Qwen3_5MoeForCausalLM if cfg.is_moe else Qwen3_5ForCausalLM
    with torch.device(device):  # built in place: its rotary buffers are computed at init
        model = cls(hf_config(cfg, dtype)).to(dtype)
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def _timed(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


@torch.no_grad()
def _decode_seconds(model, ids: list[int], batch: int, steps: int, device: torch.device) -> float:
    """Seconds of `steps` greedy decode steps after a prefill, with transformers' own cache."""
    # transformers renamed `past_key_values` to `cache` (the old name warns, then goes away).
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(torch.tensor([ids] * batch, device=device), use_cache=True)
    cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)

    def loop() -> None:
        nonlocal cache, tok
        for _ in range(steps):
            out = model(tok, use_cache=True, **{name: cache})
            cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)

    return _timed(loop, device)


@torch.no_grad()
def bench_hf(
    model, prompts: list[list[int]], decode_tokens: int, batch_sizes: list[int],
    device: torch.device,
) -> dict:  # fmt: skip
    """Prefill seconds per prompt length (median of 3) and greedy decode tokens/s per batch."""
    prefill = []
    for ids in prompts:
        x = torch.tensor([ids], device=device)
        model(x)  # warm-up at this shape
        seconds = sorted(_timed(lambda x=x: model(x, use_cache=True), device) for _ in range(3))[1]
        prefill.append({"prompt_tokens": len(ids), "seconds": seconds,
                        "tokens_per_s": len(ids) / seconds})  # fmt: skip
    decode = []
    steps = max(1, decode_tokens - 1)
    for batch in batch_sizes:
        _decode_seconds(model, prompts[0], batch, 1, device)  # warm-up
        seconds = _decode_seconds(model, prompts[0], batch, steps, device)
        decode.append({"batch": batch, "decode_steps": steps, "seconds": seconds,
                       "tokens_per_s": batch * steps / seconds})  # fmt: skip
    return {"prefill": prefill, "decode": decode}


@torch.no_grad()
def greedy_tokens(model, ids: list[int], n: int, device: torch.device) -> list[int]:
    out = model.generate(torch.tensor([ids], device=device), max_new_tokens=n,
                         min_new_tokens=n, do_sample=False)  # fmt: skip
    return out[0, len(ids) :].tolist()
