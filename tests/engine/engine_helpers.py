"""Helpers of the engine tests: the tiny model configuration and an engine-independent greedy
oracle (one unchunked prefill, then one-token steps, on a private cache)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch

from ninfer.forward import ForwardBatch, ModelCache
from ninfer.models.config import Qwen35Config
from ninfer.ops.reference import ReferenceOps
from ninfer.page import PAGE_SIZE

VOCAB = 2560  # the demo tokenizer's, so chat tests can render with it
EOS = 3

TINY = Qwen35Config(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=4,
    layer_types=("linear_attention",) * 3 + ("full_attention",),
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    intermediate_size=128,
    max_position_embeddings=4096,
    eos_token_ids=(EOS,),
)

# TINY with routed experts and a shared expert (the speculative tests' MoE model)
TINY_MOE = dataclasses.replace(
    TINY, intermediate_size=0, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)  # fmt: skip

INJECTED = "injected fault"


@contextlib.contextmanager
def failing_forward(obj, due: Callable[[int], bool], method: str = "forward") -> Iterator[dict]:
    """Within the block, `obj`'s `method` (a module's forward, a graph's run) raises
    RuntimeError(INJECTED) on the calls `due(n)` picks (n counts its calls from 1; the
    yielded dict's "n"); after it, the class's method again."""
    calls = {"n": 0}
    real = getattr(obj, method)

    def failing(*args, **kwargs):
        calls["n"] += 1
        if due(calls["n"]):
            raise RuntimeError(INJECTED)
        return real(*args, **kwargs)

    setattr(obj, method, failing)
    try:
        yield calls
    finally:
        vars(obj).pop(method, None)


# The engine's real kernel shapes (head_dim 256, GDN dk = dv = 128), small: the GPU tests' model
# (the carried FlashInfer JIT cache serves these shapes).
CUDA_TINY = Qwen35Config(
    vocab_size=2560,
    hidden_size=512,
    num_hidden_layers=8,
    layer_types=("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3
    + ("full_attention",),
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    intermediate_size=1024,
    max_position_embeddings=8192,
    eos_token_ids=(3,),
)  # fmt: skip


@torch.no_grad()
def reference_greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens from one unchunked prefill then one-token decode steps, on a private cache:
    no scheduler, no prefix cache, no page sharing."""
    cfg = model.config
    n_pages = -(-(len(prompt) + max_tokens) // PAGE_SIZE)
    kv = [
        torch.zeros(n_pages, 2, PAGE_SIZE, cfg.num_key_value_heads, cfg.head_dim)
        for _ in cfg.full_layer_ids
    ]
    n_gdn = len(cfg.gdn_layer_ids)
    conv = torch.zeros(1, n_gdn, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1)
    ssm = torch.zeros(
        1, n_gdn, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    )
    cache = ModelCache(kv=kv, conv=conv, ssm=ssm)
    ops = ReferenceOps()
    table = torch.arange(n_pages, dtype=torch.int32).unsqueeze(0)
    tokens, out, ctx = list(prompt), [], 0
    feed = list(prompt)
    for _ in range(max_tokens):
        pos = torch.arange(ctx, ctx + len(feed))
        batch = ForwardBatch(
            input_ids=torch.tensor(feed),
            positions=pos,
            q_lens=[len(feed)],
            ctx_lens=[ctx],
            cu_q=torch.tensor([0, len(feed)], dtype=torch.int32),
            state_slots=torch.tensor([0]),
            block_table=table,
            slot_mapping=pos,
            logits_indices=torch.tensor([len(feed) - 1]),
        )
        logits = model(batch, cache, ops)
        t = int(logits[0].argmax())
        out.append(t)
        ctx += len(feed)
        tokens.append(t)
        feed = [t]
    return out


def rand_tokens(rng, n: int) -> list[int]:
    """n random token ids of the demo vocabulary: no unk, EOS or chat markers (ids 0..3);
    the reasoning and tool tags (`<think>` 4, `</think>` 5, 6..9) may come."""
    return [rng.randrange(4, VOCAB - 60) for _ in range(n)]


def greedy(n: int):
    from ninfer.request import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def run(llm, prompt, n: int):
    """One greedy request through the batch path (errors come back as outputs)."""
    return llm.generate([prompt], greedy(n))[0]


def assert_idle(llm) -> None:
    """Nothing pinned, reserved or leaked once every request has finished."""
    llm.check_idle()


def distinct_blocks(sequences: list[list[int]]) -> int:
    """Number of distinct full-block prefixes over token sequences (pages counted once)."""
    seen = set()
    for seq in sequences:
        for b in range(len(seq) // PAGE_SIZE):
            seen.add(tuple(seq[: (b + 1) * PAGE_SIZE]))
    return len(seen)
