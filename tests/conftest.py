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


def _share_the_cores() -> None:
    """Each pytest-xdist worker takes its share of the cores for torch's intra-op threads (and
    passes it to the processes its tests start): two workers each running torch's default of
    one thread per core oversubscribe the machine, and the tiny models' many small ops then
    spend their time waiting on each other (two engine test modules ran 20-40 % slower)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 1:
        return
    import torch

    share = max(1, (os.cpu_count() or 1) // workers)
    os.environ.setdefault("OMP_NUM_THREADS", str(share))
    torch.set_num_threads(share)


_share_the_cores()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """pyproject's addopts run the suite on two pytest-xdist workers (`-n 2`; `-n 0` for one
    process). Mutation runs stay in one process: mutmut records in its own process which tests
    reach which function, and a worker's calls would not reach it."""
    if os.environ.get("NINFER_HYPOTHESIS_PROFILE") == "mutation" and hasattr(
        config.option, "numprocesses"
    ):
        config.option.numprocesses = 0


# A mutant that blocks (waits without using CPU) escapes mutmut's CPU-time limit. Mutation runs
# set NINFER_MUTATION_TEST_WALL_S: a test running longer ends its process with SIGXCPU, which
# mutmut records as a timeout.
_WALL_S = float(os.environ.get("NINFER_MUTATION_TEST_WALL_S", "0"))
if _WALL_S > 0:
    import signal

    @pytest.fixture(autouse=True)
    def _mutation_wall_clock():
        signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGXCPU))
        signal.setitimer(signal.ITIMER_REAL, _WALL_S)
        yield
        signal.setitimer(signal.ITIMER_REAL, 0)


@pytest.fixture
def ref_ops() -> ReferenceOps:
    return ReferenceOps()
