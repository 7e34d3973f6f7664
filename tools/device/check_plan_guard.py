"""Shows that `test_attention_plan_waits_for_a_queued_pass` can fail: runs it with the plan
guard's wait taken out (its bookkeeping kept, so that the test reaches its output check).
Expected: the test FAILS (the first pass runs the second's schedule). On the device machine:

    python3 tools/device/check_plan_guard.py
"""

import sys

import pytest
import torch

import ninfer.ops.cuda.attention as attention


def unguarded(self, wrapper, *args, **kwargs):  # the guard's bookkeeping, without the wait
    event = self._events.get(wrapper)
    if event is not None and not event.query():
        self.waits += 1
    wrapper.plan(*args, **kwargs)
    event = torch.cuda.Event()
    event.record()
    self._events[wrapper] = event


if __name__ == "__main__":
    attention._PlanGuard.plan = unguarded
    args = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "-x", "--tb=line"]
    sys.exit(pytest.main([*args, "tests/ops/test_cuda_ops.py", "-k", "plan_waits"]))
