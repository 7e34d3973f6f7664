"""Speculative decoding in the benches and tests: controlled drafts and the acceptance figures.

Random weights accept almost nothing, so a speed figure needs a draft of known quality. Two
controls:

    controlled_acceptance  (the benches) each draft position is accepted with probability
                           `accept` until the first rejection, whatever the tokens
                           (`Speculator.control`): the acceptance holds on any weights and
                           device; the output is then the drafts', not the target's
    controlled_draft       (the exactness tests) proposes the target's own next tokens, known
                           from an earlier greedy run of the same prompt, each replaced with
                           probability 1 - `accept` (`Speculator.propose`): the output stays
                           the target's, but the acceptance holds only while the run
                           reproduces that earlier output token for token (on a GPU, random
                           weights' near-ties make a verify pass part from it within a few
                           tokens, and nothing is accepted after)

The head still runs either way (its cost is in the figure).
"""

from __future__ import annotations

import random
from collections.abc import Callable


def controlled_draft(
    expected: dict[tuple[int, ...], list[int]], accept: float, vocab: int, seed: int = 0
) -> Callable:
    """A `Speculator.propose`: `expected` maps each prompt to the prompt plus its greedy
    output; proposals past that output are arbitrary."""
    rng = random.Random(seed)

    def propose(lane, k: int) -> list[int]:
        tokens = lane.request.tokens
        full = next((v for p, v in expected.items() if tokens[: len(p)] == list(p)), tokens)
        out = []
        for t in full[len(tokens) : len(tokens) + k]:
            out.append(t if rng.random() < accept else (t + 1 + rng.randrange(vocab - 1)) % vocab)
        return out + [0] * (k - len(out))

    return propose


_GOLDEN = (5**0.5 - 1) / 2  # the Weyl sequence's stride (`controlled_acceptance`)


def controlled_acceptance(accept: float, seed: int = 0) -> Callable[[int], int]:
    """A `Speculator.control`: of k drafts, the count before the first rejection when each
    position is accepted with probability `accept`.

    One uniform u a call gives the count, the number of j in 1..k with u < accept**j, so
    P(count >= j) = accept**j. The u are a Weyl sequence (a golden-ratio stride from a seeded
    start), not independent draws: the counts' frequencies then match their probabilities to
    O(1/n) after n calls instead of O(1/sqrt(n)), and a bench's few dozen verify steps reach
    the acceptance it names rather than a seed's luck."""
    u = random.Random(seed).random()

    def control(k: int) -> int:
        nonlocal u
        u = (u + _GOLDEN) % 1.0
        m = 0
        while m < k and u < accept ** (m + 1):
            m += 1
        return m

    return control


def stats_since(llm, before) -> dict:
    """Acceptance (accepted / drafted) and tokens per verify row since `before` (`snapshot`)."""
    st = snapshot(llm).since(before)
    return {
        "spec_verify_rows": st.verify_rows,
        "spec_acceptance": st.accepted / st.drafted if st.drafted else None,
        "spec_tokens_per_step": st.tokens_per_row if st.verify_rows else None,
    }


def snapshot(llm):
    """A copy of the engine's speculation counters, read on the engine thread (None without
    speculation)."""
    import dataclasses

    spec = llm.engine.speculator
    return None if spec is None else llm.engine.call(lambda: dataclasses.replace(spec.stats))
