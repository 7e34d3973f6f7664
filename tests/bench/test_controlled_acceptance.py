"""The benches' controlled acceptance reaches the acceptance it names within a few dozen
verify steps, not only on average over seeds."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.bench.speculative import controlled_acceptance


@settings(max_examples=60, deadline=None)
@given(
    accept=st.floats(0.05, 0.98),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(40, 300),
)
def test_counts_match_their_probabilities_after_n_calls(accept, k, seed, n):
    control = controlled_acceptance(accept, seed)
    counts = [control(k) for _ in range(n)]
    assert all(0 <= m <= k for m in counts)
    for j in range(1, k + 1):
        # P(count >= j) = accept**j; independent draws miss this bound by several times at
        # these n (their spread is about 0.5 / sqrt(n)).
        assert abs(sum(m >= j for m in counts) / n - accept**j) <= 2.5 / n


def test_mean_tokens_per_step_at_the_issue_setting():
    # a = 0.7, K = 3: 1 + 0.7 + 0.49 + 0.343 = 2.533 tokens a verify step on average; 28 steps
    # (a batch-1 bench of 64 tokens) already reach it within 0.1.
    control = controlled_acceptance(0.7, 0)
    steps = [1 + control(3) for _ in range(28)]
    assert abs(sum(steps) / len(steps) - 2.533) < 0.1
