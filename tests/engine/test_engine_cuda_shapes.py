"""GPU: any Qwen3.5-architecture checkpoint runs on CUDA (`ninfer.ops.cuda.support`). Tiny
models with head dims no kernel takes (head_dim 80 / 48, GDN dk and dv not powers of two) and
a power-of-two one in fp32, through the whole engine (`LLM.from_model`, CudaOps, prefill
chunks, decode, a cached second turn): fp32 against transformers (greedy tokens, logprobs),
bf16 against the reference ops on the same weights (logprob gaps). Each op that falls back
warns once, naming itself. Skipped without CUDA or the kernel libraries."""

from __future__ import annotations

import logging

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
for _mod in ("triton", "flashinfer", "fla", "transformers"):
    pytest.importorskip(_mod)

from ninfer.llm import LLM  # noqa: E402
from ninfer.models.config import Qwen35Config  # noqa: E402
from ninfer.models.qwen3_5 import Qwen35ForCausalLM  # noqa: E402
from ninfer.ops.reference import ReferenceOps  # noqa: E402
from ninfer.request import SamplingParams  # noqa: E402
from tests.models.hf_util import CONFIGS, hf_logits, random_hf_model  # noqa: E402
from tests.models.util import Row, make_batch, make_cache  # noqa: E402

SHAPES = {
    "odd-80": dict(
        vocab_size=211, hidden_size=96, intermediate_size=160, num_hidden_layers=4,
        full_attention_interval=2, num_attention_heads=2, num_key_value_heads=1, head_dim=80,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=48,
        linear_value_head_dim=40, tie_word_embeddings=False,
    ),
    "odd-48": dict(
        vocab_size=173, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        full_attention_interval=2, num_attention_heads=4, num_key_value_heads=2, head_dim=48,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=24,
        linear_value_head_dim=56, tie_word_embeddings=True,
    ),
    "pow2": dict(
        vocab_size=199, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        full_attention_interval=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, tie_word_embeddings=False,
    ),
}  # fmt: skip
PROMPTS = [[(7 * i + 3) % 150 + 2 for i in range(150)], [(11 * i) % 140 + 5 for i in range(37)]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, logprobs=2, ignore_eos=True)


def _hf(name: str):
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(CONFIGS, name, (False, SHAPES[name]))
        return random_hf_model(name, seed=len(name))


def _twin(hf, dtype: torch.dtype) -> Qwen35ForCausalLM:
    """The ninfer model on CUDA in `dtype` with the transformers model's weights."""
    cfg = Qwen35Config.from_hf_dict(hf.config.to_dict())
    model = Qwen35ForCausalLM(cfg, dtype=dtype, device="cuda")
    model.load_state_dict(hf.state_dict(), strict=True)
    return model.eval()


def _run(model, dtype: str, caplog):
    """Both prompts twice through an engine over `model` (the second turn resumes from the
    cache); the outputs and the fallback warnings."""
    with caplog.at_level(logging.WARNING):
        llm = LLM.from_model(
            model, device="cuda", dtype=dtype, max_concurrency=2, kv_capacity=4096,
            host_cache_mib=0, prefill_chunk=64, check_invariants=True,
        )  # fmt: skip
    try:
        assert llm.engine.runner.graphs is None  # a reference op cannot be captured
        prompts = [{"prompt_token_ids": p} for p in PROMPTS]
        cold = llm.generate(prompts, PARAMS)
        warm = llm.generate(prompts, PARAMS)
    finally:
        llm.close()
    assert warm[0].usage.cached_tokens >= 64
    warnings = [r.getMessage() for r in caplog.records if "runs the reference op" in r.getMessage()]
    return cold, warm, warnings


def _check(outs, cold, ref_logprobs, tol: float, decisive: float) -> None:
    """Each output's chosen tokens, up to where it leaves the cold run's sequence (the one the
    reference was run on; only at a near tie): logprob within `tol` of the reference's, and
    the reference's argmax wherever its top-2 gap exceeds `decisive`."""
    checked = 0
    for out, base, prompt, ref in zip(outs, cold, PROMPTS, ref_logprobs, strict=True):
        for i, tok in enumerate(out.token_ids):
            row = ref[len(prompt) - 1 + i]
            top = row.topk(2).values
            if tok != base.token_ids[i]:
                assert top[0] - top[1] <= decisive, (i, tok)
                break
            assert abs(out.logprobs[i][tok] - row[tok].item()) <= tol, (i, tok)
            if top[0] - top[1] > decisive:
                assert tok == row.argmax().item(), (i, tok)
                checked += 1
    assert checked >= 5


@pytest.mark.parametrize("name", list(SHAPES))
def test_fp32_engine_equals_transformers(name, caplog):
    hf = _hf(name)
    cold, warm, warnings = _run(_twin(hf, torch.float32), "float32", caplog)
    assert any("CudaOps.attention" in w and "float32" in w for w in warnings)
    assert any("CudaOps.gdn_prefill" in w for w in warnings)
    assert len(warnings) == len(set(warnings))  # one per op
    ref = [
        torch.log_softmax(hf_logits(hf, p + o.token_ids[:-1]), -1)
        for p, o in zip(PROMPTS, cold, strict=True)
    ]
    _check(cold, cold, ref, tol=2e-3, decisive=5e-3)
    _check(warm, cold, ref, tol=2e-3, decisive=5e-3)


@pytest.mark.parametrize("name", ["odd-80", "odd-48"])
def test_bf16_engine_equals_reference_ops(name, caplog):
    model = _twin(_hf(name), torch.bfloat16)
    cold, warm, warnings = _run(model, "bfloat16", caplog)
    for op in ("attention", "gdn_prefill", "gdn_decode", "qk_norm_rope", "sigmoid_mul"):
        assert sum(f"CudaOps.{op} " in w for w in warnings) == 1, op
    ref = []
    for prompt, out in zip(PROMPTS, cold, strict=True):
        ids = prompt + out.token_ids[:-1]
        cache = make_cache(model.config, 8, 2, torch.bfloat16, "cuda")
        with torch.no_grad():
            logits = model(make_batch([Row(ids, 0, 1, list(range(8)))], "cuda"), cache,
                           ReferenceOps())  # fmt: skip
        ref.append(torch.log_softmax(logits.float().cpu(), -1))
    _check(cold, cold, ref, tol=0.2, decisive=0.4)
    _check(warm, cold, ref, tol=0.2, decisive=0.4)
