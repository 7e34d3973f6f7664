"""CPU checks of the CUDA-graph prefill's padding
(`ninfer.engine.executor.graphs.PrefillGraphs`): the bucket table, the constant chunk count that
lets one graph serve every length of its bucket, the pass tables (`ninfer.ops.cuda.passmeta`),
and, on the reference model, that the padded two-row pass gives the one-row pass's logits,
state and K/V while the padding row writes only the scratch page and slot. Capture and replay
need CUDA (tests/engine/test_engine_cuda.py)."""

from __future__ import annotations

import random

import pytest
import torch
from engine_helpers import TINY

from ninfer.engine.executor.graphs import buckets, padded
from ninfer.forward import ForwardBatch, ModelCache
from ninfer.models.presets import build_random_model
from ninfer.ops.cuda import passmeta
from ninfer.ops.reference import ReferenceOps
from ninfer.page import PAGE_SIZE


def test_buckets_cover_every_length():
    for top in (64, 320, 1024, 2048, 4096):
        ks = buckets(top)
        assert ks == sorted(set(ks)) and ks[-1] * PAGE_SIZE == top
        assert ks[:8] == list(range(1, min(8, top // PAGE_SIZE) + 1))
    assert buckets(0) == []


def test_chunk_count_is_constant_per_bucket():
    """fla's grids follow the chunk count: one graph per bucket needs it fixed for all q."""
    for k in (1, 2, 5, 16, 32):
        t = k * PAGE_SIZE + 1
        for q in range(1, k * PAGE_SIZE + 1):
            assert passmeta.num_chunks([q, t - q]) == k + 1, (k, q)
            assert len(passmeta.tables([q, t - q], [7, 0])) == sum(passmeta.layout(t, 2, k + 1))


def test_pass_tables():
    meta = passmeta.PassMeta.of([3, 130, 1], [0, 64, 9], torch.device("cpu"))
    assert meta.tok_row.tolist() == [0] * 3 + [1] * 130 + [2]
    assert meta.has_state.tolist() == [0, 1, 1]
    assert meta.cu_seqlens.tolist() == [0, 3, 133, 134]
    assert meta.chunk_offsets.tolist() == [0, 1, 4, 5]
    assert meta.chunk_indices.tolist() == [[0, 0], [1, 0], [1, 1], [1, 2], [2, 0]]


def _cache(cfg, pages: int, slots: int) -> ModelCache:
    n_gdn = sum(t == "linear_attention" for t in cfg.layer_types)
    n_fa = len(cfg.layer_types) - n_gdn
    kv = [
        torch.zeros(pages, 2, PAGE_SIZE, cfg.num_key_value_heads, cfg.head_dim) for _ in range(n_fa)
    ]
    conv = torch.zeros(slots, n_gdn, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1)
    ssm = torch.zeros(
        slots, n_gdn, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
    )  # fmt: skip
    return ModelCache(kv=kv, conv=conv, ssm=ssm)


def _batch(rows, q_lens, ctx_lens, tables, slots, logits) -> ForwardBatch:
    ids, pos, smap = rows
    width = max(len(t) for t in tables)
    block = torch.zeros(len(tables), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        block[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return ForwardBatch(
        input_ids=torch.as_tensor(ids, dtype=torch.int64),
        positions=torch.as_tensor(pos, dtype=torch.int64),
        q_lens=list(q_lens),
        ctx_lens=list(ctx_lens),
        cu_q=cu,
        state_slots=torch.tensor(slots, dtype=torch.int64),
        block_table=block,
        slot_mapping=torch.as_tensor(smap, dtype=torch.int64),
        logits_indices=torch.tensor([logits], dtype=torch.int64),
    )


@pytest.mark.parametrize(
    ("q", "ctx", "k"), [(64, 0, 1), (1, 0, 1), (37, 90, 1), (128, 5, 2), (100, 64, 3), (1, 130, 2)]
)
@torch.no_grad()
def test_padded_pass_equals_one_row_pass(q, ctx, k):
    """Row 0 of the padded pass (`padded`, as a replay fills it) gives the one-row pass's
    logits, state and K/V; the padding row writes only the scratch page and slot."""
    model = build_random_model(TINY, torch.float32, "cpu", seed=5)
    ops = ReferenceOps()
    rng = random.Random(q * 1000 + ctx + k)
    pages_total, slots_total, scratch_page, scratch_slot, slot = 12, 4, 11, 3, 1
    pages = rng.sample(range(scratch_page), -(-(ctx + q) // PAGE_SIZE))
    history = [rng.randrange(4, TINY.vocab_size) for _ in range(ctx)]
    tokens = [rng.randrange(4, TINY.vocab_size) for _ in range(q)]

    def prefix_cache() -> ModelCache:
        cache = _cache(TINY, pages_total, slots_total)
        if ctx:  # the cached context: its K/V in `pages`, its state in `slot`
            n = ctx
            pos = list(range(n))
            smap = [pages[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for p in pos]
            b = _batch((history, pos, smap), [n], [0], [pages], [slot], n - 1)
            model(b, cache, ops)
        return cache

    one = prefix_cache()
    pos = list(range(ctx, ctx + q))
    smap = [pages[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for p in pos]
    ref = model(_batch((tokens, pos, smap), [q], [ctx], [pages], [slot], q - 1), one, ops)

    two = prefix_cache()
    for kv in two.kv:  # poison the scratch entries: nothing may leak into row 0
        kv[scratch_page] = float("nan")
    two.conv[scratch_slot] = float("nan")
    two.ssm[scratch_slot] = float("nan")
    p = padded(tokens, ctx, slot, pages, k, scratch_page, scratch_slot)
    assert p.q_lens == [q, k * PAGE_SIZE + 1 - q]
    assert len(p.kv_indices) == p.kv_indptr[-1]
    rows = (p.ids, p.positions, p.slot_mapping)
    batch = _batch(rows, p.q_lens, p.ctx_lens, p.page_rows, [slot, scratch_slot], q - 1)
    out = model(batch, two, ops)

    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    keep_slots = [s for s in range(slots_total) if s != scratch_slot]
    torch.testing.assert_close(two.ssm[keep_slots], one.ssm[keep_slots], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(two.conv[keep_slots], one.conv[keep_slots], rtol=1e-5, atol=1e-5)
    keep_pages = [pg for pg in range(pages_total) if pg != scratch_page]
    for a, b in zip(two.kv, one.kv, strict=True):
        torch.testing.assert_close(a[keep_pages], b[keep_pages], rtol=1e-5, atol=1e-5)


def test_padded_rejects_a_row_too_long():
    with pytest.raises(ValueError, match="bucket"):
        padded(list(range(65)), 0, 0, [0, 1], 1, 5, 5)


class _EagerStandIn:
    """A graph runner's interface on the CPU: serves the rows `accept` takes by an eager pass."""

    def __init__(self, runner, accept) -> None:
        self.runner, self.accept, self.replays = runner, accept, 0

    def can_run(self, rows) -> bool:
        return self.accept(rows)

    def run(self, rows):
        self.replays += 1
        r = self.runner
        return r.model(r.build_batch(rows), r.cache, r.ops)


def _decode_rows(rows) -> bool:
    return all(len(r.token_ids) == 1 for r in rows)


def _one_chunk(rows) -> bool:
    return len(rows) == 1 and len(rows[0].token_ids) > 1


@pytest.mark.parametrize("chunk_samples", [True, False])
@torch.no_grad()
def test_mixed_step_split_into_two_replays_equals_the_mixed_pass(chunk_samples):
    """`Runner._split_mixed`: decode rows then one prefill chunk, run as a decode replay and a
    prefill replay, give the mixed pass's logits (sampling rows, in order) and leave the same
    states and K/V."""
    from ninfer.engine.executor.runner import Row, Runner
    from ninfer.request import SamplingParams

    model = build_random_model(TINY, torch.float32, "cpu", seed=9)
    greedy = SamplingParams(temperature=0.0)
    rng = random.Random(4)
    toks = [rng.randrange(4, TINY.vocab_size) for _ in range(400)]
    runners = []
    for split in (False, True):
        runner = Runner(model, ReferenceOps(), _cache(TINY, 16, 4), torch.device("cpu"), None)
        runner.model(  # two lanes' contexts: 70 and 130 tokens
            _batch((toks[:70] + toks[70:200], list(range(70)) + list(range(130)),
                    list(range(70)) + [3 * PAGE_SIZE + p for p in range(130)]),
                   [70, 130], [0, 0], [[0, 1], [3, 4, 5]], [0, 1], 69),
            runner.cache, runner.ops,
        )  # fmt: skip
        if split:
            runner.graphs = _EagerStandIn(runner, _decode_rows)
            runner.prefill_graphs = _EagerStandIn(runner, _one_chunk)
        runners.append(runner)
    rows = [
        Row([toks[300]], 70, 0, [0, 1], greedy),
        Row([toks[301]], 130, 1, [3, 4, 5], greedy),
        Row(toks[200:290], 0, 2, [8, 9], greedy if chunk_samples else None),
    ]
    mixed = runners[0].forward(rows)
    split = runners[1].forward(rows)
    assert runners[1].split_steps == 1 and runners[0].split_steps == 0
    assert split.shape == mixed.shape == (3 if chunk_samples else 2, TINY.vocab_size)
    torch.testing.assert_close(split, mixed, rtol=1e-5, atol=1e-5)
    a, b = runners[1].cache, runners[0].cache
    for x, y in ((a.ssm, b.ssm), (a.conv, b.conv), *zip(a.kv, b.kv, strict=True)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    # a step the stand-ins do not both serve runs as one eager pass
    runners[1].prefill_graphs.accept = lambda rows: False
    runners[1].forward([Row([toks[302]], 71, 0, [0, 1], greedy), rows[2]])
    assert runners[1].split_steps == 1


def test_pass_tables_long_and_short_agree():
    """`tables` builds long passes by vectorised ops and short ones from lists: the same
    tables, over ragged rows straddling the threshold."""
    rng = random.Random(5)
    long_seen = set()
    for _ in range(60):
        q_lens = [rng.choice([1, 2, 63, 64, 65, 300, 700]) for _ in range(rng.randint(1, 6))]
        ctx_lens = [rng.choice([0, 0, 9, 128]) for _ in q_lens]
        assert passmeta.tables(q_lens, ctx_lens).tolist() == passmeta._table_lists(
            q_lens, ctx_lens
        ), (q_lens, ctx_lens)
        long_seen.add(sum(q_lens) > passmeta.SHORT_PASS)
    assert long_seen == {False, True}  # both paths ran
