"""The speculative graphs' static tables and fills (`ninfer.engine.executor.spec_graphs`), on the
CPU: a replay must read what the eager pass builds for the same rows. For random verify, bridge
and chain rows (contexts across page boundaries, pages anywhere): ids, positions, KV slots,
state slots, logits indices and FlashInfer's page metadata equal `Runner.build_batch` and
`attention.page_metadata`; the verify pass's GDN tables and state taps equal `PassMeta.of`. The
replays themselves run in tests/engine/test_speculative_cuda.py."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.engine.executor.runner import Row, Runner
from ninfer.engine.executor.spec_graphs import HeadGraphs, VerifyGraphs, _Shape
from ninfer.forward import StateTap
from ninfer.ops.cuda.attention import page_metadata
from ninfer.ops.cuda.passmeta import PassMeta
from ninfer.page import PAGE_SIZE

CPU = torch.device("cpu")


class _Planner:
    """Stands in for the FlashInfer planner: records the last plan's metadata."""

    frozen = False

    def plan(self, batch, shape, wrapper, metadata, limits):
        self.batch, self.metadata, self.limits = batch, metadata, limits


class _Ops:
    def bind_pass(self, batch, meta):
        self.bound = (batch, meta)


def _graphs(cls, max_batch: int, max_pages: int, **kw):
    """A `cls` (VerifyGraphs or HeadGraphs) over stand-ins, its shapes built, nothing
    captured."""
    g = cls.__new__(cls)
    g.ops, g.attn, g.device, g.shape = _Ops(), _Planner(), CPU, None
    g._copied, g.replays = None, 0
    g.max_batch, g.max_pages = max_batch, max_pages
    n_ind = max_batch * max_pages
    g.indices_host = torch.zeros(n_ind, dtype=torch.int32)
    g.indices_np = g.indices_host.numpy()
    g.indices_dev = torch.zeros(n_ind, dtype=torch.int32)
    g.width, g.taps = kw["width"], kw.get("taps", 0)
    sizes = range(1, max_batch + 1)
    g.shapes = {bs: _Shape(bs, g.width, g._n_logits(bs), g.taps, CPU) for bs in sizes}
    return g


def _rows(rng: random.Random, bs: int, width: int, verify: bool) -> list[Row]:
    rows = []
    for i in range(bs):
        ctx = rng.choice([1, 5, PAGE_SIZE - width, PAGE_SIZE - 1, PAGE_SIZE, 3 * PAGE_SIZE + 7])
        n_pages = -(-(ctx + width) // PAGE_SIZE) + rng.randrange(3)
        pages = rng.sample(range(1, 400), n_pages)
        tokens = [rng.randrange(1000) for _ in range(width)]
        rows.append(Row(tokens, ctx, 10 + i, pages, SimpleNamespace(), verify=verify))
    return rows


def _meta(rows: list[Row]):
    return [(r.token_ids, r.ctx_len, r.slot, r.pages) for r in rows]


def _check_fill(g, s, rows: list[Row]) -> None:
    """The shape's device buffers and the recorded plan against the eager batch of `rows`."""
    eager = Runner(None, None, None, CPU, None).build_batch(rows)
    b = s.batch
    for name in ("input_ids", "positions", "slot_mapping", "state_slots"):
        assert torch.equal(getattr(b, name), getattr(eager, name)), name
    assert b.q_lens == eager.q_lens and b.ctx_lens == eager.ctx_lens
    assert torch.equal(b.cu_q, eager.cu_q)
    want = page_metadata(eager)
    got = g.attn.metadata
    for a, w in zip(got[:3], want[:3], strict=True):
        assert torch.equal(a, w)
    assert torch.equal(got[3], want[3])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), bs=st.integers(1, 8), k=st.integers(1, 4))
def test_verify_fill_and_tables_are_the_eager_pass(seed, bs, k):
    rng = random.Random(seed)
    g = _graphs(VerifyGraphs, 8, 8, width=k + 1, taps=k)
    rows = _rows(rng, bs, k + 1, verify=True)
    s = g.shapes[bs]
    tap_slots = rng.sample(range(500, 600), bs * k)
    g._fill(s, _meta(rows), range(bs * (k + 1)), tap_slots)
    _check_fill(g, s, rows)
    eager = Runner(None, None, None, CPU, None).build_batch(rows)
    assert torch.equal(s.batch.logits_indices, eager.logits_indices)  # every token's
    assert g.ops.bound == (s.batch, s.meta)
    taps = [StateTap(r, o, tap_slots[r * k + o - 1]) for r in range(bs) for o in range(1, k + 1)]
    want = PassMeta.of(eager.q_lens, eager.ctx_lens, CPU, taps)
    got = s.meta
    for name in ("tok_row", "has_state", "cu_seqlens", "chunk_offsets", "chunk_indices"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    for name in ("cut", "chunk", "slot"):
        assert torch.equal(getattr(got.taps, name), getattr(want.taps, name)), name
    for name in ("tokens", "cu", "chunk", "slot", "opening", "opening_row"):
        assert torch.equal(getattr(got.taps.rest, name), getattr(want.taps.rest, name)), name
    for name in ("index", "row", "offset"):
        assert torch.equal(getattr(got.taps.near, name), getattr(want.taps.near, name)), name
    # the GDN layers' per-token slots (`gdn.gdn_rows`): the state after token t of a row
    # goes to its tap at offset t + 1, none after the row's last token
    per_tok = [-1] * (bs * (k + 1))
    for t in taps:
        per_tok[t.row * (k + 1) + t.offset - 1] = t.slot
    assert got.tap_tok.tolist() == per_tok


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), bs=st.integers(1, 8), width=st.sampled_from([1, 2, 4, 5]))
def test_head_fill_is_the_eager_pass(seed, bs, width):
    """Bridge (width K + 1, logits at one token per row) and chain (width 1) fills."""
    rng = random.Random(seed)
    g = _graphs(HeadGraphs, 8, 8, width=width)
    rows = _rows(rng, bs, width, verify=False)
    s = g.shapes[bs]
    last = [rng.randrange(width) for _ in range(bs)]
    g._fill(s, _meta(rows), [i * width + j for i, j in enumerate(last)])
    _check_fill(g, s, rows)
    assert s.batch.logits_indices.tolist() == [i * width + j for i, j in enumerate(last)]
    assert s.meta is None and not hasattr(g.ops, "bound")  # the head has no GDN layer
    assert s.batch.is_decode == (width == 1)


def test_fits_needs_the_width_a_context_and_the_pages():
    g = _graphs(VerifyGraphs, 4, 4, width=4, taps=3)
    for s in g.shapes.values():
        s.graph = object()
    ok = ([1, 2, 3, 4], PAGE_SIZE - 4, 0, [5])
    assert g.fits([ok])
    assert not g.fits([([1, 2, 3], PAGE_SIZE - 4, 0, [5])])  # a row with fewer drafts
    assert not g.fits([([1, 2, 3, 4], 0, 0, [5])])  # no context
    assert not g.fits([([1, 2, 3, 4], PAGE_SIZE - 3, 0, [5])])  # crosses into a missing page
    assert not g.fits([ok] * 5)  # more rows than captured
    g.shapes[2].graph = None
    assert not g.fits([ok] * 2)
