"""Sampling: greedy is argmax, filters keep the right support, draws follow the distribution,
seeds reproduce, logprobs are log_softmax of the raw logits."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.request import SamplingParams
from ninfer.sampling import apply_token_mask, make_generator, sample

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])
LOGITS = PROBS.log() + 3.0  # any shift: same softmax


def _rows(n: int, logits: torch.Tensor = LOGITS) -> torch.Tensor:
    return logits.unsqueeze(0).repeat(n, 1)


def _counts(params: SamplingParams, n: int = 20_000, logits: torch.Tensor = LOGITS):
    torch.manual_seed(1234)
    out = sample(_rows(n, logits), [params] * n, [None] * n).token_ids
    return torch.bincount(out, minlength=logits.numel()).double()


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a filtered-out token was drawn"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_greedy_is_argmax_including_ties():
    torch.manual_seed(0)
    logits = torch.randn(16, 1000)
    logits[3, 10] = logits[3, 20] = logits[3].max() + 1  # a tie: the first index wins
    res = sample(logits, [SamplingParams(temperature=0.0)] * 16, [None] * 16)
    assert res.token_ids.dtype == torch.int64
    assert torch.equal(res.token_ids, logits.argmax(-1))
    assert res.token_ids[3] == 10
    assert res.logprobs == [None] * 16


def test_top_k_1_equals_greedy():
    torch.manual_seed(0)
    logits = torch.randn(8, 300)
    logits[0, 5] = logits[0, 7] = logits[0].max() + 1
    res = sample(logits, [SamplingParams(top_k=1, temperature=1.3)] * 8, [None] * 8)
    assert torch.equal(res.token_ids, logits.argmax(-1))


@pytest.mark.parametrize(
    "params, probs",
    [
        (SamplingParams(), PROBS),
        (SamplingParams(temperature=2.0), PROBS.sqrt() / PROBS.sqrt().sum()),
        (SamplingParams(top_k=2), torch.tensor([0.5, 0.3, 0, 0]) / 0.8),
        (SamplingParams(top_p=0.7), torch.tensor([0.5, 0.3, 0, 0]) / 0.8),
        (SamplingParams(top_p=0.85), torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95),
        (SamplingParams(min_p=0.2), torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95),
        (SamplingParams(min_p=0.5, top_k=3), torch.tensor([0.5, 0.3, 0, 0]) / 0.8),
    ],
    ids=["plain", "temp2", "topk2", "topp.7", "topp.85", "minp.2", "minp.5+topk3"],
)
def test_distribution(params, probs):
    # chi-square critical value for p = 0.001 with <= 3 degrees of freedom is 16.3
    assert _chi_square(_counts(params), probs) < 16.3


def test_seed_reproducible_and_independent_of_neighbours():
    torch.manual_seed(0)
    logits = torch.randn(1, 50)
    seeded = SamplingParams(seed=7)

    def run(batch_logits, params, gens, steps=20):
        return [sample(batch_logits, params, gens).token_ids.tolist() for _ in range(steps)]

    alone = run(logits, [seeded], [make_generator(7, "cpu")])
    noisy = torch.cat([torch.randn(2, 50), logits])
    mixed = run(
        noisy,
        [SamplingParams(), SamplingParams(seed=3), seeded],
        [None, make_generator(3, "cpu"), make_generator(7, "cpu")],
    )
    assert [r[0] for r in alone] == [r[2] for r in mixed]
    assert len({tuple(r) for r in alone}) > 1  # it does sample
    other = run(logits, [SamplingParams(seed=8)], [make_generator(8, "cpu")])
    assert other != alone
    assert make_generator(None, "cpu") is None


def test_mixed_greedy_and_sampled_rows():
    torch.manual_seed(0)
    logits = torch.randn(4, 100)
    params = [SamplingParams(temperature=0.0), SamplingParams(), SamplingParams(temperature=0.0)]
    params.append(SamplingParams(top_k=1))
    res = sample(logits, params, [None] * 4)
    assert res.token_ids[[0, 2, 3]].tolist() == logits.argmax(-1)[[0, 2, 3]].tolist()


def test_logprobs_are_raw_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(3, 64) * 3
    params = [
        SamplingParams(logprobs=5, temperature=0.5, top_k=3),
        SamplingParams(),
        SamplingParams(logprobs=0, temperature=0.0),
    ]
    res = sample(logits, params, [None] * 3)
    ref = logits.log_softmax(-1)
    row = res.logprobs[0]
    chosen = int(res.token_ids[0])
    top5 = ref[0].topk(5).indices.tolist()
    assert set(row) == set(top5) | {chosen}
    for t, lp in row.items():
        assert math.isclose(lp, float(ref[0, t]), abs_tol=1e-5)
    assert res.logprobs[1] is None
    greedy = int(res.token_ids[2])
    assert res.logprobs[2] == pytest.approx({greedy: float(ref[2, greedy])}, abs=1e-5)


def test_filters_never_remove_everything():
    logits = torch.full((2, 10), -1e30)
    logits[:, 4] = 0.0
    params = [SamplingParams(top_p=0.01, min_p=1.0), SamplingParams(top_k=3, temperature=1e-4)]
    assert sample(logits, params, [None, None]).token_ids.tolist() == [4, 4]


def test_bad_shapes():
    with pytest.raises(ValueError, match="logits"):
        sample(torch.zeros(2, 5), [SamplingParams()], [None])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
def test_cuda_matches_rules():
    logits = _rows(4096).cuda()
    params = [SamplingParams(top_p=0.7, seed=1)] * 4096
    gens = [make_generator(1, "cuda")] + [None] * 4095
    out = sample(logits, params, gens).token_ids
    assert out.device.type == "cuda" and set(out.tolist()) <= {0, 1}
    greedy = sample(logits, [SamplingParams(temperature=0.0)] * 4096, [None] * 4096).token_ids
    assert torch.equal(greedy, logits.argmax(-1))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.sets(st.integers(0, 69), min_size=1, max_size=5),
    st.sampled_from([0.0, 0.7, 1.5]),
    st.sampled_from([-1, 1, 2, 50]),
    st.sampled_from([1.0, 0.5, 0.05]),
    st.sampled_from([0.0, 0.3, 0.9]),
)
def test_a_masked_token_is_never_sampled_under_any_filter(seed, allowed, temp, top_k, top_p, min_p):
    """The grammar's mask comes before temperature, min-p, top-k and top-p: whatever the
    filters keep of the raw distribution, the draw is among the allowed tokens (greedy: the
    best of them), even when every token the filters would keep is forbidden."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 70, generator=gen) * 4
    bits = torch.zeros(2, 3, dtype=torch.int32)
    for t in allowed:
        bits[:, t // 32] |= torch.tensor(1 << (t % 32)).to(torch.int32)
    apply_token_mask(logits, [0, 2], bits)  # rows 0 and 2 constrained, row 1 free
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    gens = [make_generator(seed + r, "cpu") for r in range(3)]
    chosen = sample(logits, [params.validated()] * 3, gens).token_ids.tolist()
    assert chosen[0] in allowed and chosen[2] in allowed
    if temp == 0.0:
        best = max(allowed, key=lambda t: float(logits[0, t]))
        assert chosen[0] == best
