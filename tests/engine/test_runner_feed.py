"""The runner's launch / feed contract on the CPU (the GPU twin, with graphs, is in
test_engine_cuda.py): a step launched with its input ids fed from an earlier launch's sampled
ids on the device computes what a plain step fed the same ids on the host computes, in the
earlier order (a slice) or reordered (a gather); misuse is refused with a clear error."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import TINY

from ninfer.engine.executor.runner import Row, Runner
from ninfer.forward import ModelCache
from ninfer.ops.reference import ReferenceOps
from ninfer.page import PAGE_SIZE
from ninfer.request import SamplingParams
from ninfer.sampling import sample

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [list(range(5, 80)), list(range(200, 211)), list(range(90, 160))]


def _runner(model) -> Runner:
    n_gdn = len(TINY.gdn_layer_ids)
    kv = [
        torch.zeros(24, 2, PAGE_SIZE, TINY.num_key_value_heads, TINY.head_dim)
        for _ in TINY.full_layer_ids
    ]
    conv = torch.zeros(4, n_gdn, TINY.conv_dim, TINY.linear_conv_kernel_dim - 1)
    ssm = torch.zeros(
        4, n_gdn, TINY.linear_num_value_heads, TINY.linear_key_head_dim,
        TINY.linear_value_head_dim,
    )  # fmt: skip
    return Runner(model, ReferenceOps(), ModelCache(kv, conv, ssm), torch.device("cpu"), sample)


def _decode(runner, order, steps: int, fed: bool):
    pages = [list(range(8 * i, 8 * i + 8)) for i in range(3)]
    first = runner.step([Row(p, 0, i, pages[i], GREEDY) for i, p in enumerate(PROMPTS)]).tokens
    ctx = [len(p) for p in PROMPTS]
    last = dict(enumerate(first))
    flight, prev, out = None, None, []
    for step in range(steps):
        now = order(step)
        rows = [Row([last[i]], ctx[i] + step, i, pages[i], GREEDY) for i in now]
        if fed and flight is not None:
            feed = flight.feed([prev.index(i) for i in now])
            rows = [Row([0], r.ctx_len, r.slot, r.pages, GREEDY) for r in rows]
            nxt = runner.launch(rows, feed)
            out.append(dict(zip(prev, flight.result().tokens, strict=True)))
            flight = nxt
        else:
            flight = runner.launch(rows)
            if not fed:
                out.append(dict(zip(now, flight.result().tokens, strict=True)))
        if not fed:
            last = out[-1]
        prev = now
    if fed:
        out.append(dict(zip(prev, flight.result().tokens, strict=True)))
    return [[d[i] for i in range(3)] for d in out]


@pytest.mark.parametrize("reorder", [False, True])
def test_fed_launches_equal_plain_steps(tiny_model, reorder):
    def order(step):
        return [2, 0, 1] if reorder and step % 2 else [0, 1, 2]

    plain = _decode(_runner(tiny_model), order, 6, fed=False)
    fed = _decode(_runner(tiny_model), order, 6, fed=True)
    assert fed == plain


def test_feed_misuse_is_refused(tiny_model):
    runner = _runner(tiny_model)
    flight = runner.launch([Row(list(range(5, 20)), 0, 0, [0], GREEDY)])
    with pytest.raises(ValueError, match="feed"):
        runner.launch([Row([0, 1], 15, 0, [0], GREEDY)], flight.feed([0]))
    with pytest.raises(ValueError, match="feed"):
        runner.launch([Row([0], 15, 0, [0], GREEDY)], flight.feed([0, 0]))
    nothing = runner.launch([Row(list(range(5, 20)), 0, 1, [1], None)])
    with pytest.raises(ValueError, match="sampled nothing"):
        nothing.feed([0])
