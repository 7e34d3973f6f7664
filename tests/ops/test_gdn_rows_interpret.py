"""`ops.cuda.gdn.gdn_rows` (the speculative verify graphs' delta rule, token by token) under
Triton's CPU interpreter, against the reference recurrence: ragged rows, fresh rows whose slot
holds NaN, taps after any token (into slots of a strided pool view), and the final state back
in each row's slot. The interpreter reads TRITON_INTERPRET when a kernel is defined, so the
check runs in a fresh interpreter; on a GPU the kernel runs in
tests/engine/test_speculative_cuda.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

CHECK = textwrap.dedent(
    """
    import random
    import torch
    from ninfer.ops.cuda.gdn import gdn_rows
    from ninfer.ops.cuda.passmeta import PassMeta
    from ninfer.ops.reference.gdn import l2norm, recurrent_gated_delta_rule_ref
    from ninfer.ops.reference.dense import gdn_gates_ref

    torch.manual_seed(0)
    rng = random.Random(0)
    hk, hv, dk, dv = 2, 4, 16, 32
    for trial in range(6):
        q_lens = [rng.randrange(1, 6) for _ in range(rng.randrange(1, 4))]
        fresh = [rng.random() < 0.3 for _ in q_lens]
        t = sum(q_lens)
        # a pool [slots, layers, Hv, dk, dv]: the kernel reads a layer's strided view
        pool = torch.randn(12, 2, hv, dk, dv, dtype=torch.float32)
        state = pool[:, 1]
        slots = torch.tensor(rng.sample(range(12), len(q_lens)))
        for r, f in enumerate(fresh):
            if f:
                state[slots[r]] = float("nan")
        q = l2norm(torch.randn(t, hk, dk))
        k = l2norm(torch.randn(t, hk, dk))
        v = torch.randn(t, hv, dv)
        g = -torch.rand(t, hv)
        beta = torch.rand(t, hv)
        free = [s for s in range(12) if s not in slots.tolist()]
        tap_tok = torch.full((t,), -1, dtype=torch.int64)
        taps = {}
        for i in range(t):
            if free and rng.random() < 0.4:
                taps[i] = free.pop()
                tap_tok[i] = taps[i]
        before, other = state.clone(), pool[:, 0].clone()
        cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
        has = torch.tensor([0 if f else 1 for f in fresh])
        meta = PassMeta(torch.zeros(t, dtype=torch.int64), has, cu, cu, cu, tap_tok=tap_tok)
        o = gdn_rows(q, k, v, g, beta, state, slots, 0.25, meta)
        for r, n in enumerate(q_lens):
            a = int(cu[r])
            h0 = None if fresh[r] else before[slots[r]][None]
            for j in range(1, n + 1):  # the state after j tokens, and the outputs so far
                sl = slice(a, a + j)
                ref_o, ref_s = recurrent_gated_delta_rule_ref(
                    q[sl][None], k[sl][None], v[sl][None], g[sl][None], beta[sl][None],
                    0.25, h0, use_qk_l2norm=False,
                )
                assert torch.allclose(o[sl], ref_o[0], atol=1e-4), (trial, r, j)
                if a + j - 1 in taps:
                    got = state[taps[a + j - 1]]
                    assert torch.allclose(got, ref_s[0], atol=1e-4), (trial, r, j)
            assert torch.allclose(state[slots[r]], ref_s[0], atol=1e-4), (trial, r)
        untouched = [s for s in range(12) if s not in slots.tolist() and s not in taps.values()]
        assert torch.equal(state[untouched], before[untouched])
        assert torch.equal(pool[:, 0], other)  # the other layer is not written
        # the gates in the kernel (raw a, b and A_log, dt_bias; `gdn_gates_ref`'s formulas),
        # softplus' linear branch (a + dt_bias > 20) included
        a_raw, b_raw = torch.randn(t, hv) * 8, torch.randn(t, hv) * 3
        a_log, dt_bias = torch.randn(hv) * 0.5, torch.randn(hv) * 4
        g2, beta2 = gdn_gates_ref(a_raw, b_raw, a_log, dt_bias)
        fused, split = before.clone(), before.clone()
        o_fused = gdn_rows(q, k, v, a_raw, b_raw, fused, slots, 0.25, meta, gates=(a_log, dt_bias))
        o_split = gdn_rows(q, k, v, g2, beta2, split, slots, 0.25, meta)
        assert torch.allclose(o_fused, o_split, atol=1e-5), trial
        assert torch.allclose(fused, split, atol=1e-5, equal_nan=True), trial
    print("ok")
    """
)


def test_gdn_rows_matches_the_reference_recurrence():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
