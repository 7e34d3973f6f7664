"""CPU checks of the CUDA-graph decode metadata
(`ninfer.engine.executor.graphs.DecodeGraphs._fill`): the static buffers and the FlashInfer CSR
it plans with equal what the eager path builds (`Runner.build_batch` + `page_metadata`) for the
same decode rows. Capture itself needs CUDA
(tests/engine/test_engine_cuda.py)."""

from __future__ import annotations

import random

import torch
from engine_helpers import TINY

from ninfer.engine.executor.graphs import DecodeGraphs
from ninfer.engine.executor.runner import Row, Runner
from ninfer.forward import ModelCache
from ninfer.models.presets import build_random_model
from ninfer.ops.choices import GATHER_MIN_ROWS, OpChoices
from ninfer.ops.cuda.attention import gather_pays, page_metadata
from ninfer.ops.reference import ReferenceOps
from ninfer.page import PAGE_SIZE
from ninfer.request import SamplingParams


class _Planner:
    def __init__(self) -> None:
        self.planned = []

    def graph_wrapper(self, bs, kv_dtype, indices_buf):
        return f"wrapper-{bs}"

    def plan(self, batch, shape, wrapper, metadata):
        self.planned.append((batch, shape, wrapper, [m.clone() for m in metadata]))


class _Ops(ReferenceOps):
    def __init__(self) -> None:
        self.attention_planner = _Planner()


def test_fill_matches_eager_batch():
    model = build_random_model(TINY, torch.float32, "cpu", seed=3)
    cache = ModelCache(kv=[torch.zeros(40, 2, PAGE_SIZE, 1, 32)], conv=None, ssm=None)
    ops = _Ops()
    graphs = DecodeGraphs(model, ops, cache, torch.device("cpu"), 4, max_pages_per_row=8)
    greedy = SamplingParams(temperature=0.0)
    rows = [
        Row([11], 63, 2, [5, 9], greedy),
        Row([12], 64, 0, [7, 3, 8], greedy),
        Row([13], 200, 3, [1, 2, 4, 6, 30], greedy),
    ]
    assert graphs.can_run(rows) is False  # nothing captured yet
    graphs.graphs[3] = object()
    assert graphs.can_run(rows)
    assert not graphs.can_run([Row([1, 2], 63, 2, [5, 9], greedy)])
    assert not graphs.can_run([Row([1], 0, 2, [5], greedy)])
    assert not graphs.can_run([Row([1], 63, 2, [5], None)])

    batch = graphs._fill([(r.token_ids[0], r.ctx_len, r.slot, r.pages) for r in rows])
    eager = Runner(model, ops, cache, torch.device("cpu"), None).build_batch(rows)
    for name in ("input_ids", "positions", "slot_mapping", "state_slots", "cu_q"):
        assert torch.equal(getattr(batch, name).long(), getattr(eager, name).long()), name
    assert torch.equal(batch.logits_indices, eager.logits_indices)
    assert batch.ctx_lens == eager.ctx_lens and batch.q_lens == eager.q_lens
    assert batch.is_decode
    _, shape, wrapper, (qo, indptr, last, indices) = ops.attention_planner.planned[-1]
    assert wrapper == "wrapper-3"
    assert shape[:3] == (TINY.num_attention_heads, TINY.num_key_value_heads, TINY.head_dim)
    ref_qo, ref_indptr, ref_last, ref_indices = page_metadata(eager)
    assert torch.equal(indptr, ref_indptr) and torch.equal(last, ref_last)
    assert torch.equal(qo, ref_qo) and torch.equal(indices, ref_indices)


def test_build_batch_layout():
    """The packed single-copy build_batch keeps the documented ragged layout."""
    model = build_random_model(TINY, torch.float32, "cpu", seed=3)
    runner = Runner(model, ReferenceOps(), None, torch.device("cpu"), None)
    rows = [
        Row([1, 2, 3], 62, 1, [4, 5], SamplingParams(temperature=0.0)),
        Row([9], 10, 0, [7], None),
        Row([8, 7], 0, 2, [6], SamplingParams(temperature=0.0)),
    ]
    b = runner.build_batch(rows)
    assert b.input_ids.tolist() == [1, 2, 3, 9, 8, 7]
    assert b.positions.tolist() == [62, 63, 64, 10, 0, 1]
    assert b.slot_mapping.tolist() == [4 * 64 + 62, 4 * 64 + 63, 5 * 64, 7 * 64 + 10, 6 * 64, 385]
    assert b.cu_q.tolist() == [0, 3, 4, 6] and b.cu_q.dtype == torch.int32
    assert b.state_slots.tolist() == [1, 0, 2]
    assert b.logits_indices.tolist() == [2, 5]
    assert b.block_table.tolist() == [[4, 5], [7, 0], [6, 0]]
    assert b.block_table.dtype == torch.int32


def test_build_batch_token_by_token():
    """Random ragged batches (decode-only ones, which take the vectorised path, and prefill
    ones, filled row by row): every token's id, position and KV slot as computed one token at
    a time from its row."""
    rng = random.Random(5)
    runner = Runner(None, ReferenceOps(), None, torch.device("cpu"), None)
    for trial in range(60):
        rows = []
        for i in range(rng.randint(1, 6)):
            ctx = rng.choice([0, 5, 63, 64, 130])
            q = 1 if trial % 3 == 0 else rng.choice([1, 2, 63, 64, 65, 200])
            pages = rng.sample(range(1, 500), -(-(ctx + q) // 64) + rng.randint(0, 1))
            ids = [rng.randrange(1000) for _ in range(q)]
            rows.append(Row(ids, ctx, i, pages, SamplingParams(temperature=0.0)))
        b = runner.build_batch(rows)
        ids = [t for r in rows for t in r.token_ids]
        pos = [r.ctx_len + j for r in rows for j in range(len(r.token_ids))]
        slots = [
            r.pages[(r.ctx_len + j) // 64] * 64 + (r.ctx_len + j) % 64
            for r in rows
            for j in range(len(r.token_ids))
        ]
        assert b.input_ids.tolist() == ids
        assert b.positions.tolist() == pos
        assert b.slot_mapping.tolist() == slots


# ---- the graph decode path end to end on the CPU, with a CSR-reading stand-in for FlashInfer ----


class _CsrWrapper:
    """Stand-in for FlashInfer's paged wrappers: attention computed from exactly the CSR
    metadata (indptr / indices / last_page_len) a plan() received, as the real kernels do."""

    def __init__(self, *args, **kwargs) -> None:
        self.graph = kwargs.get("use_cuda_graph", False)

    def plan(self, *args, **kw):
        if len(args) == 7:  # decode: indptr, indices, last_page_len, Hq, Hkv, D, page
            self.qo = torch.arange(len(args[2]) + 1)
            indptr, indices, last = args[:3]
        else:  # prefill: qo_indptr, indptr, indices, last_page_len, ...
            self.qo, indptr, indices, last = args[:4]
        self.indptr, self.indices, self.last = indptr.clone(), indices.clone(), last.clone()
        self.scale = kw["sm_scale"]

    def run(self, q, kv, k_scale=None, v_scale=None):
        out = torch.empty_like(q)
        hq, hkv = q.shape[1], kv.shape[-2]
        for r in range(len(self.last)):
            pages = self.indices[self.indptr[r] : self.indptr[r + 1]].long()
            n = (len(pages) - 1) * PAGE_SIZE + int(self.last[r])
            k = kv[pages, 0].reshape(-1, hkv, kv.shape[-1])[:n].repeat_interleave(hq // hkv, 1)
            v = kv[pages, 1].reshape(-1, hkv, kv.shape[-1])[:n].repeat_interleave(hq // hkv, 1)
            a, b = int(self.qo[r]), int(self.qo[r + 1])
            for i in range(a, b):
                pos = n - (b - a) + (i - a)
                s = torch.einsum("hd,thd->ht", q[i].float(), k[: pos + 1].float()) * self.scale
                out[i] = torch.einsum("ht,thd->hd", s.softmax(-1), v[: pos + 1].float())
        return out


class _RaggedWrapper:
    """FlashInfer's ragged prefill wrapper's contract in torch: each row's queries (qo indptr)
    attend causally over the row's k, v (kv indptr), aligned to the end of the keys (a row
    with a context sees it all: query i of q sees keys [0, kv_len - q + i])."""

    def __init__(self, *args, **kwargs) -> None:
        self.runs = 0

    def plan(self, qo_indptr, kv_indptr, hq, hkv, dim, causal, sm_scale, **kw):
        assert causal
        self.qo, self.kv, self.scale = qo_indptr.clone(), kv_indptr.clone(), sm_scale

    def run(self, q, k, v):
        self.runs += 1
        out = torch.empty_like(q)
        group = q.shape[1] // k.shape[1]
        for r in range(len(self.qo) - 1):
            a, b = int(self.qo[r]), int(self.qo[r + 1])
            c, d = int(self.kv[r]), int(self.kv[r + 1])
            kr, vr = (x[c:d].repeat_interleave(group, 1).float() for x in (k, v))
            s = torch.einsum("ihd,jhd->hij", q[a:b].float(), kr) * self.scale
            mask = torch.ones(b - a, d - c).triu(d - c - (b - a) + 1).bool()
            s = s.masked_fill(mask, float("-inf"))
            out[a:b] = torch.einsum("hij,jhd->ihd", s.softmax(-1), vr).to(q.dtype)
        return out


class _Graph:
    """Replays the forward on the static batch with planning frozen (what the capture holds)."""

    def __init__(self, graphs: DecodeGraphs, bs: int) -> None:
        self.graphs, self.bs = graphs, bs

    def replay(self) -> None:
        g = self.graphs
        g.attn.frozen = True
        try:
            g.logits[self.bs] = g.model(g.batches[self.bs], g.cache, g.ops)
        finally:
            g.attn.frozen = False


def _csr_ops(monkeypatch):
    import sys
    import types

    from ninfer.ops.cuda.attention import PagedAttention

    fake = types.ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = _CsrWrapper
    fake.BatchPrefillWithPagedKVCacheWrapper = _CsrWrapper
    fake.BatchPrefillWithRaggedKVCacheWrapper = _RaggedWrapper
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.setattr("ninfer.ops.cuda.attention.WORKSPACE_BYTES", 16)

    class CsrOps(ReferenceOps):
        name = "csr"

        def __init__(self, choices: OpChoices | None = None) -> None:
            self._attention = PagedAttention(torch.device("cpu"), choices)

        @property
        def attention_planner(self):
            return self._attention

        def attention(self, q, k, v, kv_cache, batch, scale, k_scale=None, v_scale=None):
            return self._attention(q, k, v, kv_cache, batch, scale, k_scale, v_scale)

    return CsrOps


def _tiny_cache(slots: int = 6, pages: int = 24) -> ModelCache:
    n_gdn = len(TINY.gdn_layer_ids)
    return ModelCache(
        kv=[torch.zeros(pages, 2, PAGE_SIZE, 1, 32) for _ in TINY.full_layer_ids],
        conv=torch.zeros(slots, n_gdn, TINY.conv_dim, TINY.linear_conv_kernel_dim - 1),
        ssm=torch.zeros(slots, n_gdn, 2, 16, 16),
    )


def test_graph_decode_path_matches_eager(monkeypatch):
    """Prefill, then decode steps of 3 then 2 rows: the static-buffer path (plan from the
    pinned mirrors, frozen forward on the static batch) gives the eager logits."""
    csr_ops = _csr_ops(monkeypatch)
    model = build_random_model(TINY, torch.float32, "cpu", seed=5)
    greedy = SamplingParams(temperature=0.0)
    eager = Runner(model, csr_ops(), _tiny_cache(), torch.device("cpu"), None)
    ref = Runner(model, ReferenceOps(), _tiny_cache(), torch.device("cpu"), None)
    graph = Runner(model, csr_ops(), _tiny_cache(), torch.device("cpu"), None)
    graph.graphs = DecodeGraphs(model, graph.ops, graph.cache, torch.device("cpu"), 4, 8)
    for bs in range(1, 5):
        graph.graphs.graphs[bs] = _Graph(graph.graphs, bs)
    prompts = [list(range(3, 73)), list(range(100, 163)), [9] * 5]
    slots, pages = [4, 0, 2], [[3, 7, 1], [5, 6, 2], [9, 8, 10]]
    rows = [Row(p, 0, s, pg, greedy) for p, s, pg in zip(prompts, slots, pages, strict=True)]
    ctx = [len(p) for p in prompts]
    for step in range(8):
        outs = [r.forward(rows) for r in (eager, graph, ref)]
        if step == 0:  # the all-fresh prefill ran on the ragged wrapper (over its own k, v)
            assert eager.ops.attention_planner.ragged_passes == 1
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(outs[0], outs[2], rtol=1e-4, atol=1e-4)
        ids = outs[0].argmax(-1).tolist()
        n = 3 if step < 4 else 2
        grid = zip(ids[:n], ctx[:n], slots[:n], pages[:n], strict=True)
        rows = [Row([t], c, s, pg, greedy) for t, c, s, pg in grid]
        ctx = [c + 1 for c in ctx[:n]]
    assert graph.graphs.replays == 7


def test_gathered_prefill_matches_reference(monkeypatch):
    """Later prefill chunks over a cached context on the gathered path (K/V pages copied into
    contiguous buffers, then the ragged kernel; forced here, the GPU threshold aside) and on
    the paged path give the reference's logits, with a decode row in the same pass and
    partial last pages; the gathered plans ran, the paged runner planned none."""
    csr_ops = _csr_ops(monkeypatch)
    model = build_random_model(TINY, torch.float32, "cpu", seed=7)
    greedy = SamplingParams(temperature=0.0)
    cpu = torch.device("cpu")
    runners = []
    for min_rows in (0, float("inf"), 0):  # gathered, paged, gathered but over the byte cap
        ops = csr_ops(OpChoices(gather_min_rows=min_rows))
        runners.append(Runner(model, ops, _tiny_cache(), cpu, None))
    ref = Runner(model, ReferenceOps(), _tiny_cache(), cpu, None)
    a, b = list(range(3, 153)), list(range(200, 261))
    pages_a, pages_b = [7, 1, 9], [4, 11]
    steps = [
        [Row(a[:70], 0, 1, pages_a, greedy), Row(b[:60], 0, 3, pages_b, greedy)],
        [Row(a[70:130], 70, 1, pages_a, greedy), Row(b[60:61], 60, 3, pages_b, greedy)],
        [Row(a[130:], 130, 1, pages_a, greedy)],
    ]
    wants = [ref.forward(rows) for rows in steps]
    kv_bytes = 2 * 4 * TINY.num_key_value_heads * TINY.head_dim  # per KV token, fp32
    for i, runner in enumerate(runners):
        if i == 2:  # a cap of 139 KV tokens: neither later pass (191, 150 tokens) may copy
            monkeypatch.setattr("ninfer.ops.cuda.attention.GATHER_SCRATCH_BYTES", 139 * kv_bytes)
        for rows, want in zip(steps, wants, strict=True):
            torch.testing.assert_close(runner.forward(rows), want, rtol=1e-4, atol=1e-4)
    assert [r.ops.attention_planner.gathered_passes for r in runners] == [2, 0, 0]


def test_gather_pays():
    # one 2048-token chunk after 30k tokens, 9B heads (group 4): pays; one decode-sized row
    # after the same context does not; nor a short suffix of 64 tokens
    assert gather_pays([2048], [30720], 4, GATHER_MIN_ROWS)
    assert not gather_pays([1], [30720], 4, GATHER_MIN_ROWS)
    assert not gather_pays([64], [30720], 4, GATHER_MIN_ROWS)
    # a big chunk beside decode rows with long contexts: weighed by KV tokens
    assert gather_pays([2048, 1, 1], [4096, 8192, 8192], 4, GATHER_MIN_ROWS)
    assert not gather_pays([512, 1, 1], [4096, 30000, 30000], 4, GATHER_MIN_ROWS)
