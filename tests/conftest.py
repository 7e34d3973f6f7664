"""Shared fixtures for the model and op tests (kept small on purpose)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from ninfer.ops.reference import ReferenceOps

# Mutation runs (tools/mutation.sh sets NINFER_HYPOTHESIS_PROFILE=mutation) need every run of a
# test to draw the same examples: a mutant counts as killed only by a failure the clean code does
# not have, so the examples are derandomised, never replayed from a database, and free of
# deadlines and speed health checks (mutated code under a tracing trampoline runs slower).
settings.register_profile(
    "mutation",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow],
)
if os.environ.get("NINFER_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["NINFER_HYPOTHESIS_PROFILE"])


@pytest.fixture
def ref_ops() -> ReferenceOps:
    return ReferenceOps()
