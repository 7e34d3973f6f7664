"""The speculator's replay route on the CPU (`ninfer.engine.speculative`): with stand-ins for its
captured graphs that run the same calls eagerly, a greedy step takes the route a CUDA step
takes in the steady state: the drafts of the device-fed chain go into the verify pass without
a read (`Draft.pending`), the bridge runs before the step's targets are read, its inputs worked
out from them on the device (`bridge_inputs`, `Speculator._bridge_ahead`), and the targets and
drafts come back in one read. Greedy output stays plain decode's (K = 1..4, dense and MoE, the
random head and a controlled draft), and a bench's controlled acceptance draws what it draws
off the route. The captured graphs themselves run in tests/engine/test_speculative_cuda.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_helpers import VOCAB, assert_idle, greedy
from hypothesis import given, settings
from hypothesis import strategies as st
from test_speculative import _prompts, controlled, make_spec_llm  # noqa: F401

from ninfer.bench.speculative import controlled_acceptance
from ninfer.engine.executor.runner import Row
from ninfer.engine.speculative import bridge_inputs
from ninfer.page import PAGE_SIZE
from ninfer.request import SamplingParams
from ninfer.sampling import accept_greedy, greedy_outcome

EVERY = SamplingParams(max_tokens=1, temperature=0.0)  # a verify row: logits of every token


class _Eager:
    """Stands in for one kind of `executor.spec_graphs.SpecGraphs` (verify, bridge or chain):
    `fits` as the captured kind decides, `run` as its replay returns, computed eagerly."""

    def __init__(self, runner, width: int, verify: bool) -> None:
        self.runner, self.width, self.verify = runner, width, verify
        self.replays = self.fed = self.indexed = self.padded = 0
        self._ids: torch.Tensor | None = None

    def fits(self, rows) -> bool:
        w = self.width
        return all(
            len(t) == w and ctx > 0 and -(-(ctx + w) // PAGE_SIZE) <= len(pages)
            for t, ctx, _, pages in rows
        )

    def ids(self, bs: int) -> torch.Tensor:
        assert self._ids is not None and self._ids.shape[0] == bs
        return self._ids

    def run(self, rows, *args, fed=None, index=None, pads=None):
        r, w = self.runner, self.width
        if self.verify and len(args) > 1:  # VerifyGraphs.run(rows, tap_slots, fed)
            args, fed = args[:1], args[1]
        ids = torch.tensor([t for t, *_ in rows], dtype=torch.int64).view(len(rows), w)
        if fed is not None:
            self.fed += 1
            if self.verify:
                ids[:, 1:] = fed
            else:
                ids = fed.view(len(rows), w).clone()
        self._ids = ids
        self.replays += 1
        if self.verify:  # args: tap slots, K per row
            (taps,) = args
            k = w - 1
            batch = r.build_batch([
                Row(ids[i].tolist(), ctx, slot, pages, EVERY, verify=True,
                    taps=tuple((o + 1, taps[i * k + o]) for o in range(k)))
                for i, (_, ctx, slot, pages) in enumerate(rows)
            ])  # fmt: skip
            return r.model.forward_hidden(batch, r.cache, r.ops)
        hidden, last = args
        batch = r.build_batch([
            Row(ids[i].tolist(), ctx, slot, pages, EVERY, verify=True)
            for i, (_, ctx, slot, pages) in enumerate(rows)
        ])  # fmt: skip
        if pads is not None:  # a chain window: the K/V before row m to the trash page
            slot, m = pads
            before = torch.arange(w)[None, :] < m[:, None]
            batch.slot_mapping.view(len(rows), w).masked_fill_(before, slot)
            self.padded += int(before.sum())
        logits, out = r.model.mtp(batch, hidden, r.cache, r.ops, r.model)
        if index is not None:
            self.indexed += 1
        else:
            index = torch.tensor([i * w + j for i, j in enumerate(last)])
        return logits[index], out


def _route(llm):
    """Put the stand-ins in the speculator's place of its graphs; returns them."""
    spec = llm.engine.speculator
    w = spec.k + 1
    kinds = {
        "verify": _Eager(spec.runner, w, True),
        "bridge": _Eager(spec.runner, w, False),
        "ahead": [_Eager(spec.runner, w, False) for _ in range(spec.k - 1)],
        "chain": _Eager(spec.runner, 1, False),
    }

    def install():
        spec.graphs = type("Graphs", (), kinds)()

    llm.engine.call(install)
    return kinds


@pytest.mark.parametrize(
    ("kind", "k"), [("dense", 1), ("moe", 2), ("dense", 3), ("moe", 3), ("moe", 4)]
)
def test_the_replay_route_decodes_what_plain_decode_does(make_spec_llm, kind, k):  # noqa: F811
    """Three lanes with different lengths (rows leave the route near their ends), the random
    head, then a controlled draft at acceptance 0.6: plain decode's tokens; the verify pass
    took the chain's drafts on the device and the bridge ran ahead, indexed on the device."""
    prompts = _prompts(40 + k)
    params = [greedy(n) for n in (37, 50, 23)]
    plain = make_spec_llm(kind)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    spec = make_spec_llm(kind, speculative="mtp", num_speculative_tokens=k)
    kinds = _route(spec)
    assert [o.token_ids for o in spec.generate(prompts, params)] == want
    v, b = kinds["verify"], kinds["bridge"]
    assert v.replays > 10 and v.fed > 5 and b.indexed > 10, (v.replays, v.fed, b.indexed)
    windows = kinds["chain"].replays + sum(a.replays for a in kinds["ahead"])
    assert (windows > 0) == (k > 1)
    again = [p + [7] for p in prompts]
    want2 = [o.token_ids for o in plain.generate(again, params)]
    controlled(spec, {tuple(p): p + w for p, w in zip(again, want2, strict=True)}, 0.6, k)
    before = spec.engine.call(lambda: dataclasses.replace(spec.engine.speculator.stats))
    assert [o.token_ids for o in spec.generate(again, params)] == want2
    st_ = spec.engine.call(lambda: spec.engine.speculator.stats).since(before)
    assert 0 < st_.accepted < st_.drafted
    assert_idle(spec)


def test_controlled_acceptance_draws_the_same_on_the_route(make_spec_llm):  # noqa: F811
    """A bench's controlled acceptance (`Speculator.control`), drawn ahead of the read on the
    route: the same tokens and counters as off it, from the same seed."""
    prompts = _prompts(7)
    params = [greedy(n) for n in (40, 31, 52)]
    got = []
    for route in (False, True):
        spec = make_spec_llm(speculative="mtp", num_speculative_tokens=3)
        if route:
            kinds = _route(spec)
        spec.engine.speculator.control = controlled_acceptance(0.7, 0)
        outs = [o.token_ids for o in spec.generate(prompts, params)]
        st_ = spec.engine.call(lambda s=spec: dataclasses.replace(s.engine.speculator.stats))
        got.append((outs, st_))
    assert got[0] == got[1]
    assert kinds["bridge"].indexed > 10
    assert 0 < got[1][1].accepted < got[1][1].drafted


@pytest.mark.parametrize("k", [2, 3])
def test_the_chain_run_ahead_drafts_what_the_chain_after_the_read_does(
    make_spec_llm,  # noqa: F811
    monkeypatch,
    k,
):
    """On the route, the draft chain runs ahead of the read (`Speculator._chain_ahead`: each
    step a window of K + 1 positions, its real row picked on the device, the padding before
    it sent to the trash page). With the lanes' outputs pinned to plain decode's by a
    proposal that depends only on the position (so both runs keep the same histories and
    accept the same counts), the head's own drafts made ahead equal, step by step, those the
    chain makes after the read: the K/V the windows write, and what they read, is the
    one-token chain's."""
    from ninfer.engine.speculative import Speculator

    prompts = _prompts(11)
    params = [greedy(n) for n in (36, 47, 25)]
    plain = make_spec_llm()
    want = [o.token_ids for o in plain.generate(prompts, params)]
    expected = {tuple(p): p + w for p, w in zip(prompts, want, strict=True)}

    def pinned(lane, n: int) -> list[int]:  # plain decode's tokens, one position in 4 wrong
        tokens = lane.request.tokens
        at = len(tokens)
        full = next(v for p, v in expected.items() if tokens[: len(p)] == list(p)) + [0] * n
        return [t if (at + j) % 4 != 2 else t + 1 for j, t in enumerate(full[at : at + n])]

    seen: dict[bool, dict] = {True: {}, False: {}}
    propose = Speculator._propose

    def recording(self, lane, draft, n):  # the head's own drafts, before the proposal
        key = (tuple(lane.request.tokens[:3]), lane.computed)
        seen[self.chain_ahead][key] = tuple(draft.tokens)
        propose(self, lane, draft, n)

    monkeypatch.setattr(Speculator, "_propose", recording)
    for ahead in (True, False):
        spec = make_spec_llm(speculative="mtp", num_speculative_tokens=k)
        kinds = _route(spec)

        def setup(sp=spec.engine.speculator, on=ahead):
            sp.chain_ahead, sp.propose = on, pinned

        spec.engine.call(setup)
        assert [o.token_ids for o in spec.generate(prompts, params)] == want
        runs = spec.engine.call(lambda s=spec: s.engine.speculator.ahead_runs)
        if ahead:
            assert runs > 5 and all(a.replays > 5 for a in kinds["ahead"]), runs
            assert sum(a.padded for a in kinds["ahead"]) > 5  # accepted drafts: windows pad
        else:
            assert runs == 0 and kinds["chain"].replays > 5
        assert_idle(spec)
    assert len(seen[True]) > 20 and seen[True] == seen[False]


def test_a_sampled_lane_that_drafts_after_the_read_draws_as_without_the_chain_ahead(
    make_spec_llm,  # noqa: F811
    monkeypatch,
):
    """Seeded sampled lanes decoding up to max_model_len: near it a lane has room for fewer
    than K drafts, so it drafts after the read although its chain ran ahead, and its
    generator must first go back to before that chain's draws. The same tokens with the
    chain ahead as without it, and that fallback happened."""
    from ninfer.engine.speculative import Speculator

    prompts = _prompts(13)
    params = [
        SamplingParams(max_tokens=400, temperature=t, seed=s, ignore_eos=True)
        for t, s in ((0.9, 21), (1.2, 22), (0.7, 23))
    ]
    declined = []
    take = Speculator._take_ahead

    def counting(self, ahead, lane, k):
        got = take(self, ahead, lane, k)
        if not got and lane.lane_id in ahead and not lane.request.params.greedy:
            declined.append(lane.lane_id)
        return got

    monkeypatch.setattr(Speculator, "_take_ahead", counting)
    outs = {}
    for ahead in (True, False):
        spec = make_spec_llm(speculative="mtp", num_speculative_tokens=3, max_model_len=220)
        _route(spec)
        spec.engine.call(lambda sp=spec.engine.speculator, on=ahead: setattr(sp, "chain_ahead", on))
        outs[ahead] = [(o.token_ids, o.finish_reason) for o in spec.generate(prompts, params)]
        assert_idle(spec)
    assert declined  # sampled lanes whose chain ran ahead drafted after the read
    assert all(reason == "length" for _, reason in outs[True])
    assert outs[True] == outs[False]


def test_a_lane_cut_at_an_output_boundary_drafts_as_without_the_chain_ahead(
    make_spec_llm,  # noqa: F811
    monkeypatch,
):
    """A chat's output boundary cuts a verify row's accepted run (`Speculator.cut`), so the
    lane settles before the frontier its chain run ahead assumed and drafts after the read,
    a sampled lane's generator set back first. Every fifth token id marks a boundary here,
    so cuts are frequent: seeded sampled and greedy lanes give the same tokens with the
    chain ahead as without it, and sampled lanes fell back so."""
    from ninfer.engine.speculative import Speculator
    from ninfer.llm import LLM

    job = LLM._job

    def with_boundaries(self, *args, **kwargs):
        request = job(self, *args, **kwargs)
        request.hints.output_after = tuple(range(0, VOCAB, 5))
        return request

    monkeypatch.setattr(LLM, "_job", with_boundaries)
    missed = []
    take = Speculator._take_ahead

    def counting(self, ahead, lane, k):
        got = ahead.get(lane.lane_id)
        if got is not None and got[1] != lane.computed and not lane.request.params.greedy:
            missed.append(lane.lane_id)
        return take(self, ahead, lane, k)

    monkeypatch.setattr(Speculator, "_take_ahead", counting)
    prompts = _prompts(5, n=5)
    params = [
        SamplingParams(max_tokens=n, temperature=t, seed=s, ignore_eos=True)
        for n, t, s in ((70, 0.9, 31), (55, 1.1, 32), (64, 0, None), (48, 0.8, 33), (60, 0, None))
    ]
    outs = {}
    for ahead in (True, False):
        spec = make_spec_llm(speculative="mtp", num_speculative_tokens=3)
        _route(spec)
        spec.engine.call(lambda sp=spec.engine.speculator, on=ahead: setattr(sp, "chain_ahead", on))
        outs[ahead] = [o.token_ids for o in spec.generate(prompts, params)]
        assert_idle(spec)
    assert missed  # sampled lanes cut before the frontier their chain assumed
    assert [len(t) for t in outs[True]] == [p.max_tokens for p in params]
    assert outs[True] == outs[False]


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_seeded_sampling_draws_the_same_on_and_off_the_route(
    make_spec_llm,  # noqa: F811
    monkeypatch,
    kind,
):
    """Seeded sampled requests (and a greedy one beside them): the same tokens on the route
    (each row's rejection rule on the device, `sampling.accept_on_device`, its draws from the
    request's generator in the same order), off it, and with the draft chain read back step
    by step (`_pick`)."""
    from ninfer.engine.speculative import Speculator

    prompts = _prompts(9)
    params = [
        SamplingParams(max_tokens=n, temperature=t, top_k=k, seed=s, ignore_eos=True)
        for n, t, k, s in ((38, 0.8, 50, 11), (45, 1.2, -1, 12), (29, 0.0, -1, None))
    ]
    got, stats = {}, {}
    for mode in ("route", "eager", "host"):
        if mode == "host":
            monkeypatch.setattr(Speculator, "_fed", staticmethod(lambda picks: False))
        spec = make_spec_llm(kind, speculative="mtp", num_speculative_tokens=3)
        if mode == "route":
            kinds = _route(spec)
        got[mode] = [o.token_ids for o in spec.generate(prompts, params)]
        stats[mode] = spec.engine.call(
            lambda s=spec: dataclasses.replace(s.engine.speculator.stats)
        )
    assert got["route"] == got["eager"] == got["host"]
    assert stats["route"] == stats["eager"] == stats["host"]
    assert kinds["bridge"].indexed > 10 and kinds["verify"].fed > 5
    assert stats["route"].accepted > 0


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda k: st.lists(
            st.tuples(
                st.lists(st.integers(0, 5), min_size=k + 1, max_size=k + 1),
                st.lists(st.integers(0, 5), min_size=k, max_size=k),
                st.integers(0, k),
            ),
            min_size=1,
            max_size=8,
        )
    )
)
def test_bridge_inputs_are_the_accepted_run(rows):
    """`greedy_outcome` and `bridge_inputs`: each row's head input ids begin with the tokens
    the host accepts (`accept_greedy`: the drafts the target agrees with, then the target's
    own), and the logits index is that run's last position; with a preset count m (a bench's
    control), the first m drafts and the target's token after them."""
    top = torch.tensor([t for t, _, _ in rows])
    drafts = torch.tensor([d for _, d, _ in rows])
    w = top.shape[1]
    m, after = greedy_outcome(top, drafts)
    ids, index = bridge_inputs(drafts, m, after)
    for i, (t, d, _) in enumerate(rows):
        run = accept_greedy(t, d)
        assert ids[i, : len(run)].tolist() == run and int(m[i]) == len(run) - 1
        assert int(index[i]) == i * w + len(run) - 1 and int(after[i]) == run[-1]
    preset = torch.tensor([p for _, _, p in rows])
    m, after = greedy_outcome(top, drafts, preset)
    ids, index = bridge_inputs(drafts, m, after)
    for i, (t, d, p) in enumerate(rows):
        assert ids[i, : p + 1].tolist() == [*d[:p], t[p]] and int(index[i]) == i * w + p


@settings(max_examples=8, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(5, 80),  # prompt length
            st.integers(1, 30),  # max_tokens
            st.sampled_from([0.0, 0.7, 1.3]),  # temperature
            st.integers(0, 2**31 - 1),  # seed
            st.booleans(),  # a stop token among the likely ones
        ),
        max_size=3,
    ),
    st.integers(1, 4),
)
def test_any_mix_of_requests_decodes_the_same_on_the_route(mtp_models, requests, k):  # noqa: F811
    """Any mix of greedy and seeded sampled requests, of any length, some with stop tokens,
    beside a longer greedy one (which outlives them, so the route is taken): on the replay
    route each yields exactly what it yields off it (the same draws in the same order), none
    is cut short (it ends at max_tokens or at its stop token), and the engine ends idle."""
    import random

    from ninfer.llm import LLM

    requests = [*requests, (40, 40, 0.0, 0, False)]
    rng = random.Random(len(requests) * 10 + k)
    prompts = [[rng.randrange(4, 2000) for _ in range(n)] for n, *_ in requests]
    params = [
        SamplingParams(max_tokens=m, temperature=t, seed=s, ignore_eos=True,
                       stop_token_ids=[rng.randrange(4, 2000) for _ in range(40)] if stop else None)
        for _, m, t, s, stop in requests
    ]  # fmt: skip
    outs = {}
    for route in (False, True):
        llm = LLM.from_model(mtp_models["dense"], device="cpu", prefill_chunk=64,
                             max_concurrency=4, kv_capacity=16384, host_cache_mib=16,
                             check_invariants=True, speculative="mtp",
                             num_speculative_tokens=k)  # fmt: skip
        try:
            kinds = _route(llm) if route else None
            outs[route] = [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params)]
            assert_idle(llm)
            if kinds is not None:
                assert kinds["verify"].replays > 0 and kinds["bridge"].indexed > 0
        finally:
            llm.close()
    assert outs[True] == outs[False]
    for (tokens, reason), p in zip(outs[True], params, strict=True):
        if reason == "length":
            assert len(tokens) == p.max_tokens
        else:
            assert reason == "stop" and tokens and tokens[-1] in p.stop_token_ids
