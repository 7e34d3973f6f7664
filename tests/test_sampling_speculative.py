"""Speculative decoding's acceptance rule (`ninfer.sampling.accept_drafts`): greedy keeps the
longest prefix the target's argmax agrees with; sampled outputs follow the target's
distribution whatever the draft's (chi-square over a small vocabulary, many draws, synthetic
draft / target pairs), after the temperature and the filters; seeded draws reproduce."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.request import SamplingParams
from ninfer.sampling import accept_drafts, probabilities

V = 5
# 4 degrees of freedom: P(chi2 > 18.5) = 0.001; the joint test's 24: P(chi2 > 51.2) = 0.001
CHI2_4, CHI2_24 = 18.5, 51.2
# per position: a target distribution, and a draft distribution far from it
TARGET = torch.tensor(
    [[0.40, 0.25, 0.20, 0.10, 0.05], [0.05, 0.05, 0.10, 0.30, 0.50], [0.2, 0.2, 0.2, 0.2, 0.2],
     [0.70, 0.10, 0.10, 0.05, 0.05], [0.1, 0.3, 0.1, 0.3, 0.2]]
)  # fmt: skip
DRAFT = torch.tensor(
    [[0.05, 0.05, 0.10, 0.30, 0.50], [0.40, 0.25, 0.20, 0.10, 0.05], [0.6, 0.1, 0.1, 0.1, 0.1],
     [0.0, 0.0, 0.5, 0.5, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]]
)  # fmt: skip
SAMPLED = SamplingParams(temperature=1.0)


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double().flatten() * counts.sum()
    counts = counts.double().flatten()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token the target excludes was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def _drafts(k: int, gen: torch.Generator) -> list[int]:
    return [int(torch.multinomial(DRAFT[j], 1, generator=gen)) for j in range(k)]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_first_token_follows_the_target(k):
    """Token 1 of a verify row is distributed as the target's p_0, whatever the draft."""
    gen = torch.Generator().manual_seed(k)
    logits = TARGET[: k + 1].log()
    counts = torch.zeros(V)
    for _ in range(8_000):
        tokens = accept_drafts(logits, _drafts(k, gen), DRAFT[:k], SAMPLED, gen)
        assert 1 <= len(tokens) <= k + 1
        counts[tokens[0]] += 1
    assert _chi_square(counts, TARGET[0]) < CHI2_4


@pytest.mark.parametrize("k", [1, 3])
def test_two_tokens_follow_the_target_jointly(k):
    """The first two output tokens, taking the second from a next verify row when the first row
    yields one (its positions shifted by one), are distributed as p_0 x p_1 (here the target's
    rows do not depend on the tokens before them)."""
    gen = torch.Generator().manual_seed(10 + k)
    logits = TARGET.log()  # k + 2 rows at most: a second row starts one position later
    counts = torch.zeros(V, V)
    for _ in range(10_000):
        tokens = accept_drafts(logits[: k + 1], _drafts(k, gen), DRAFT[:k], SAMPLED, gen)
        if len(tokens) == 1:
            drafts = [int(torch.multinomial(DRAFT[j + 1], 1, generator=gen)) for j in range(k)]
            more = accept_drafts(logits[1 : k + 2], drafts, DRAFT[1 : k + 1], SAMPLED, gen)
            tokens = tokens + more
        counts[tokens[0], tokens[1]] += 1
    assert _chi_square(counts, TARGET[0][:, None] * TARGET[1][None, :]) < CHI2_24


def test_a_wrong_rule_is_caught():
    """The test's power: accepting every draft outright gives the draft's distribution, which
    the chi-square rejects by far."""
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(V)
    for _ in range(8_000):
        counts[_drafts(1, gen)[0]] += 1
    assert _chi_square(counts, TARGET[0]) > 100 * CHI2_4


def test_filters_and_temperature_are_the_targets():
    """With top_k = 3 and temperature 0.7 the output follows `probabilities`, the distribution
    `sample` draws from: tokens outside the top 3 never appear."""
    params = SamplingParams(temperature=0.7, top_k=3)
    gen = torch.Generator().manual_seed(3)
    logits = TARGET[:3].log()
    target = probabilities(logits[:1], params)[0]
    assert (target > 0).sum() == 3
    counts = torch.zeros(V)
    for _ in range(8_000):
        counts[accept_drafts(logits, _drafts(2, gen), DRAFT[:2], params, gen)[0]] += 1
    assert _chi_square(counts, target) < CHI2_4


def test_a_masked_target_is_followed_and_its_masked_tokens_never_come():
    """A structured output's mask on the target's logits (the speculator applies it before
    acceptance: `Speculator._mask_drafts`): token 0 ruled out at position 0 and token 4 at
    position 1, the draft proposing token 0 first 40 % of the time. Token 1 of a row follows
    the masked target, and token 0 never comes (the chi-square's check)."""
    gen = torch.Generator().manual_seed(5)
    logits = TARGET[:3].log().clone()
    logits[0, 0] = logits[1, 4] = float("-inf")
    q = DRAFT[[1, 0]]
    counts = torch.zeros(V)
    for _ in range(8_000):
        drafts = [int(torch.multinomial(q[j], 1, generator=gen)) for j in range(2)]
        tokens = accept_drafts(logits, drafts, q, SAMPLED, gen)
        assert len(tokens) < 2 or tokens[1] != 4
        counts[tokens[0]] += 1
    assert _chi_square(counts, logits[0].softmax(dim=-1)) < CHI2_4


@pytest.mark.parametrize("where", ["host", "device"])
def test_a_draft_the_target_rules_out_is_rejected_even_at_a_zero_draw(monkeypatch, where):
    """Draft kept iff u * q(d) < p(d): with u = 0 exactly (torch.rand's [0, 1) includes it)
    a `<=` rule kept a draft of target probability 0, a token the grammar forbids, which
    would then fail the request when its matcher saw it."""
    from ninfer.sampling import accept_on_device

    logits = TARGET[:2].log().clone()
    logits[0, 3] = float("-inf")
    q = DRAFT[3:4]  # proposes token 3 half the time
    monkeypatch.setattr(torch, "rand", lambda n, **kw: torch.zeros(n))
    gen = torch.Generator().manual_seed(0)
    if where == "host":
        first = accept_drafts(logits, [3], q, SAMPLED, gen)[0]
    else:
        m, token = accept_on_device(logits, torch.tensor([3]), q, SAMPLED, gen)
        first = 3 if int(m) else int(token)
    assert first != 3


def test_seeded_draws_reproduce():
    logits = TARGET[:4].log()
    runs = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(7)
        runs.append([accept_drafts(logits, [3, 0, 4], DRAFT[:3], SAMPLED, gen) for _ in range(50)])
    assert runs[0] == runs[1]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, V - 1), min_size=2, max_size=5),
    st.lists(st.integers(0, V - 1), min_size=4, max_size=4),
)
def test_greedy_keeps_the_longest_agreeing_prefix(argmax, drafts):
    """Greedy: the drafts while each equals the target's argmax at its position, then the
    target's argmax where they stop (or after the last draft)."""
    k = len(argmax) - 1
    drafts = drafts[:k]
    logits = torch.nn.functional.one_hot(torch.tensor(argmax), V).float()
    got = accept_drafts(logits, drafts, None, SamplingParams(temperature=0), None)
    n = next((j for j in range(k) if drafts[j] != argmax[j]), k)
    assert got == drafts[:n] + [argmax[n]]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 4),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.0, 0.6, 1.0, 1.7]),
    st.sampled_from([-1, 2, 4]),
    st.booleans(),
)
@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                          reason="needs CUDA"))],
)  # fmt: skip
def test_the_device_rule_yields_what_the_host_rule_does(device, k, seed, temperature, top_k,
                                                        exact):  # fmt: skip
    """`accept_on_device` (no host sync: the speculator's replayed steps) yields, from the same
    generator state, exactly the tokens `accept_drafts` yields: greedy and sampled, every
    acceptance length, drafts the target excludes, and a draft distribution equal to the
    target's (`exact`: every draft kept)."""
    from ninfer.sampling import accept_on_device

    gen = torch.Generator(device).manual_seed(seed)
    logits = torch.randn(k + 1, 7, generator=gen, device=device) * 2
    params = SamplingParams(temperature=temperature, top_k=top_k)
    if params.greedy:
        q = None
        drafts = [int(t) for t in logits.argmax(dim=-1)[:k]]
        cut = int(torch.randint(0, k + 1, (1,), generator=gen, device=device))
        drafts = [d if j < cut else (d + 1) % 7 for j, d in enumerate(drafts)]
    else:
        p = probabilities(logits, params)
        q = p[:k].clone() if exact else torch.rand(k, 7, generator=gen, device=device)
        q = q.softmax(dim=-1) if not exact else q
        drafts = [int(torch.multinomial(q[j], 1, generator=gen)) for j in range(k)]
    state = gen.get_state()
    want = accept_drafts(logits, drafts, q, params, gen)
    gen.set_state(state)
    ids = torch.tensor(drafts, dtype=torch.int64, device=device)
    m, token = accept_on_device(logits, ids, q, params, gen)
    assert drafts[: int(m)] + [int(token)] == want
