"""Speculative decoding in the benches: a controlled draft and the acceptance figures.

Random weights accept almost nothing, so a speed figure needs a draft of known quality: the
controlled draft proposes the target's own next tokens (known from a plain greedy run of the
same prompt) and replaces each with another token with probability 1 - `accept`, so that the
per-position acceptance is `accept` whatever the model. The head still runs (its cost is in
the figure); only its proposals are replaced (`Speculator.propose`).
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
