"""Shared fixtures for the model and op tests (kept small on purpose)."""

from __future__ import annotations

import pytest

from ninfer.ops.reference import ReferenceOps


@pytest.fixture
def ref_ops() -> ReferenceOps:
    return ReferenceOps()
