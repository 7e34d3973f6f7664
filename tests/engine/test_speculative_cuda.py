"""MTP speculative decoding on CUDA (CudaOps, bf16; rejected drafts roll back through the
verify pass's per-position taps, or, forced, by save-and-replay, `Speculator.replay`; the
steady state replays the speculator's CUDA graphs, their verify attention on FlashInfer's fa3
or fa2 (`verify_backend`), or runs eagerly with `cuda_graphs=False`):
greedy output of three lanes against plain decode on the same engine settings, with a
controlled draft so that every acceptance length occurs. bf16 verify passes (K + 1 tokens a
row) do not match one-token decode bit for bit, so the outputs must agree until a near-tie:
at the first difference, plain decode's own logprob gap between its token and the
speculative one is small. Skipped without CUDA or without flashinfer / fla / triton."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import CUDA_TINY, failing_forward

from ninfer.bench.speculative import controlled_draft
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.request import SamplingParams

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
for _mod in ("triton", "flashinfer", "fla"):
    pytest.importorskip(_mod)

PROMPTS = [list(range(5, 155)), [(7 * i) % 2000 + 4 for i in range(70)], list(range(300, 333))]
NEAR_TIE = 0.1  # nats between plain decode's token and another where bf16 may pick either


def _agree_up_to_near_ties(want, got, max_tokens: int, k: int) -> None:
    """Each speculative output equals plain decode's until a token where plain decode's own
    logprob gap to the speculative one is under NEAR_TIE."""
    for w, g in zip(want, got, strict=True):
        pairs = enumerate(zip(w.token_ids, g.token_ids, strict=True))
        n = next((i for i, (a, b) in pairs if a != b), None)
        if n is None:
            assert len(g.token_ids) == max_tokens
            continue
        lp = w.logprobs[n]
        gap = lp[w.token_ids[n]] - lp.get(g.token_ids[n], float("-inf"))
        rank = sorted(lp, key=lp.get, reverse=True).index(g.token_ids[n]) if gap < 1e9 else None
        assert gap < NEAR_TIE, (k, n, gap, rank)  # rank None: not in plain decode's top 20


@pytest.mark.parametrize("backend", ["fa3", "fa2"])
def test_verify_graphs_over_long_contexts(backend):
    """The verify graphs are captured at warm-up over short contexts and replayed, planned
    afresh each step, over contexts of thousands of tokens beside short ones (FlashInfer's fa2
    plan then splits a row's context over several CTAs, a split the capture never saw):
    greedy output as plain decode's up to near-ties, the steps replayed."""
    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=5, mtp=True)
    opts = dict(device="cuda", compile=False, max_concurrency=4, kv_capacity=32768,
                host_cache_mib=64)  # fmt: skip
    prompts = [[(11 * i) % 2500 + 4 for i in range(n)] for n in (7000, 2600, 300)]
    plain = LLM.from_model(model, **opts)
    want = plain.generate(
        prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=20)
    )
    plain.close()
    spec = LLM.from_model(model, speculative="mtp", num_speculative_tokens=3,
                          verify_backend=backend, **opts)  # fmt: skip
    expected = {tuple(p): p + o.token_ids for p, o in zip(prompts, want, strict=True)}
    spec.engine.speculator.propose = controlled_draft(expected, 0.7, CUDA_TINY.vocab_size, 3)
    got = spec.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    _agree_up_to_near_ties(want, got, 24, 3)
    assert spec.engine.speculator.graphs.verify.replays > 5
    spec.check_idle()
    spec.close()


@pytest.mark.parametrize("rollback", ["taps", "taps-fa3", "taps-eager", "replay"])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_matches_plain_decode_up_to_near_ties(k, rollback):
    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=11, mtp=True)
    opts = dict(device="cuda", compile=False, max_concurrency=4, kv_capacity=16384,
                host_cache_mib=64, check_invariants=True)  # fmt: skip
    plain = LLM.from_model(model, **opts)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=20)
    want = plain.generate(PROMPTS, params)
    graphs = rollback in ("taps", "taps-fa3")  # taps-fa3: the verify graphs' attention on fa3
    backend = "fa3" if rollback == "taps-fa3" else "fa2"
    opts |= {"cuda_graphs": graphs, "verify_backend": backend}
    spec = LLM.from_model(model, speculative="mtp", num_speculative_tokens=k, **opts)
    speculator = spec.engine.speculator
    assert not speculator.replay  # the CUDA ops snapshot at offsets 1 .. k
    assert (speculator.graphs is not None) == graphs
    speculator.replay = rollback == "replay"  # (replay never replays a verify graph)
    expected = {tuple(p): p + o.token_ids for p, o in zip(PROMPTS, want, strict=True)}
    spec.engine.speculator.propose = controlled_draft(expected, 0.6, CUDA_TINY.vocab_size, k)
    got = spec.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    _agree_up_to_near_ties(want, got, 40, k)
    st = spec.engine.speculator.stats
    assert 0 < st.accepted < st.drafted
    if graphs:  # the steady state replayed: verify, bridge and (K > 1) the chain, run ahead
        g = speculator.graphs
        assert g.verify.replays > 10 and g.bridge.replays > 10, (g.verify.replays, st)
        assert speculator.ahead_runs > 10, speculator.ahead_runs
        windows = sum(head.replays for head in g.ahead)
        assert (windows > 10) == (k > 1), windows
    spec.check_idle()
    plain.close()
    spec.close()


def test_grammar_and_logprobs_rows_verify_in_the_graphs():
    """Rows with a grammar (a regex) and with logprobs speculate in the replayed verify graphs
    (their drafts read before the pass, the grammar's masks applied to the graph's logits,
    the bridge run after the read): greedy output as plain decode's up to
    near-ties, replies that stop match the regex, and each token's logprob lies within bf16's
    reach of plain decode's where the outputs agree."""
    import re

    from ninfer.chat_template import ChatTemplate
    from ninfer.demo import DEMO_DIR
    from ninfer.request import StructuredOutputsParams
    from ninfer.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEMO_DIR)  # CUDA_TINY's vocabulary
    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=11, mtp=True)
    opts = dict(device="cuda", compile=False, max_concurrency=4, kv_capacity=16384,
                host_cache_mib=64, check_invariants=True)  # fmt: skip
    pattern = r"[0-9]{2,6}(-[a-z]{1,4}){1,3}"
    so = StructuredOutputsParams(regex=pattern)
    params = [
        SamplingParams(max_tokens=24, temperature=0.0, structured_outputs=so, logprobs=20),
        SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=20),
        SamplingParams(max_tokens=24, temperature=0.0, structured_outputs=so, logprobs=20),
    ]
    plain = LLM.from_model(model, tok, ChatTemplate(tok), **opts)
    want = plain.generate(PROMPTS, params)
    plain.close()
    spec = LLM.from_model(model, tok, ChatTemplate(tok), speculative="mtp",
                          num_speculative_tokens=3, **opts)  # fmt: skip
    expected = {tuple(p): p + o.token_ids for p, o in zip(PROMPTS, want, strict=True)}
    spec.engine.speculator.propose = controlled_draft(expected, 0.6, CUDA_TINY.vocab_size, 3)
    got = spec.generate(PROMPTS, params)
    for w, g in zip(want, got, strict=True):
        assert g.error is None, g.error
        pairs = zip(w.token_ids, g.token_ids, strict=False)
        n = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        if n is None:
            assert g.token_ids == w.token_ids
        else:
            lp = w.logprobs[n]
            assert lp[w.token_ids[n]] - lp.get(g.token_ids[n], float("-inf")) < NEAR_TIE, n
        agree = len(g.token_ids) if n is None else n
        for j in range(agree):
            t = g.token_ids[j]
            assert abs(g.logprobs[j][t] - w.logprobs[j][t]) < 0.05, (j, g.logprobs[j][t])
        if g.finish_reason == "stop" and g is not got[1]:
            assert re.fullmatch(pattern, g.text), g.text
    st = spec.engine.speculator.stats
    assert 0 < st.accepted < st.drafted
    assert spec.engine.speculator.graphs.verify.replays > 5
    spec.check_idle()
    spec.close()


def test_greedy_chain_fed_on_the_device_drafts_what_the_host_chain_does(monkeypatch):
    """With the speculator's graphs, the greedy draft chain fed on the device (the chain
    graph's input ids copied from the previous step's argmax, one read at the end) proposes
    exactly what the chain that reads each step back proposes: same kernels, same order.
    (The chain runs after the read here; `test_chain_run_ahead_*` for the one run ahead.)"""
    from ninfer.engine.speculative import Speculator

    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=12, mtp=True)
    opts = dict(device="cuda", compile=False, max_concurrency=4, kv_capacity=16384,
                host_cache_mib=64, speculative="mtp", num_speculative_tokens=3)  # fmt: skip
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (30, 17, 41)]
    seen: dict[str, list] = {}
    draft = Speculator.draft

    def recording(self, pending, live, max_model_len):
        draft(self, pending, live, max_model_len)
        seen[mode].append(sorted((i, tuple(d.tokens)) for i, d in self.drafts.items()))

    monkeypatch.setattr(Speculator, "draft", recording)
    for mode in ("device", "host"):
        seen[mode] = []
        if mode == "host":
            monkeypatch.setattr(Speculator, "_fed", staticmethod(lambda picks: False))
        llm = LLM.from_model(model, **opts)
        llm.engine.speculator.chain_ahead = False
        llm.generate(PROMPTS, params)
        assert llm.engine.speculator.graphs.chain.replays > 10
        llm.close()
    assert seen["device"] == seen["host"]


def test_seeded_sampling_on_the_replay_route(monkeypatch):
    """Seeded sampled lanes beside a greedy one, with the speculator's graphs: the draft chain
    drawn on the device and each verify row's rejection rule on the device (the bridge run
    ahead of the read) give the same tokens as the chain read back step by step; the chain
    run ahead of the read gives the same tokens again in a second engine; the steady state
    replays the graphs."""
    from ninfer.engine.speculative import Speculator

    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=13, mtp=True)
    opts = dict(device="cuda", compile=False, max_concurrency=4, kv_capacity=16384,
                host_cache_mib=64, speculative="mtp", num_speculative_tokens=3)  # fmt: skip
    params = [
        SamplingParams(max_tokens=n, temperature=t, seed=s, ignore_eos=True)
        for n, t, s in ((36, 0.8, 1), (41, 1.1, 2), (30, 0.0, None))
    ]
    got = []
    for mode in ("ahead", "ahead", "device", "host"):
        if mode == "host":
            monkeypatch.setattr(Speculator, "_fed", staticmethod(lambda picks: False))
        llm = LLM.from_model(model, **opts)
        sp = llm.engine.speculator
        sp.chain_ahead = mode == "ahead"
        got.append([o.token_ids for o in llm.generate(PROMPTS, params)])
        g = sp.graphs
        assert g.verify.replays > 10 and g.bridge.replays > 10
        chained = sp.ahead_runs if mode == "ahead" else g.chain.replays
        assert chained > 10, (mode, chained)
        llm.close()
    assert got[0] == got[1]
    assert got[2] == got[3]


def test_chain_window_writes_only_its_real_position_and_agrees_with_the_chain():
    """One chain step run ahead (`HeadGraphs.run` with `pads`) over a window of K + 1
    positions whose real one is the m-th: the head's K/V at the positions before it (history
    the real position reads) stays as it was, the window's padding there goes to the trash
    page, the real position's K/V is written; its logits and hidden state are the one-token
    chain step's at that position, up to bf16 rounding (other kernels at other row counts)."""
    from ninfer.page import PAGE_SIZE

    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=14, mtp=True)
    llm = LLM.from_model(model, device="cuda", compile=False, max_concurrency=2,
                         kv_capacity=8192, host_cache_mib=64, speculative="mtp",
                         num_speculative_tokens=3)  # fmt: skip
    eng = llm.engine
    sp, kv = eng.speculator, eng.runner.cache.kv[-1]  # the head's K/V entry
    pool, states = eng.kv_state.kv, eng.kv_state.states
    pages, slot = pool.alloc(2), states.acquire()
    try:
        gen = torch.Generator(device="cuda").manual_seed(0)
        noise = torch.randn(kv[pages].shape, generator=gen, device="cuda").to(kv.dtype)
        kv[pages] = noise
        trash = sp.trash // PAGE_SIZE
        kv[trash] = 0
        width, hidden_size = sp.k + 1, CUDA_TINY.hidden_size
        hidden = torch.randn(width, hidden_size, generator=gen, device="cuda").to(torch.bfloat16)
        tok = torch.full((width,), 17, device="cuda")

        def at(p: int) -> torch.Tensor:
            return kv[pages[p // PAGE_SIZE], :, p % PAGE_SIZE].clone()

        for m, ctx in ((2, 90), (3, 60), (0, 30)):  # (60: the window crosses a page)
            before = kv[pages].clone()
            first = ctx + 1  # chain step 1's window: F + 1 .. F + 1 + K
            index = torch.tensor([m], device="cuda")
            row = ([0] * width, first, slot, pages)
            logits, out = sp.graphs.ahead[0].run(
                [row], hidden, [0], fed=tok, index=index, pads=(sp.trash, index)
            )
            logits, out = logits.clone(), out.clone()
            torch.cuda.synchronize()
            real = first + m
            for p in range(real):
                assert torch.equal(at(p), before[p // PAGE_SIZE, :, p % PAGE_SIZE]), (m, p)
            assert not torch.equal(at(real), before[real // PAGE_SIZE, :, real % PAGE_SIZE])
            assert (kv[trash] != 0).any() == (m > 0), m
            want, want_out = sp.graphs.chain.run(
                [([17], real, slot, pages)], hidden[m : m + 1], [0]
            )
            scale = want.abs().max().item()
            assert (logits[0] - want[0]).abs().max().item() <= 0.03 * scale, m
            err = (out[m].float() - want_out[0].float()).abs().max().item()
            assert err <= 0.03 * want_out[0].float().abs().max().item(), m
            kv[trash] = 0
    finally:
        states.release(slot)
        pool.free(pages)
    llm.close()


def test_chain_run_ahead_drafts_what_the_chain_does(monkeypatch):
    """Greedy lanes whose output a controlled proposal pins to plain decode's (so both runs
    see the same histories): the head's own drafts from the chain run ahead of the read
    equal those of the chain run after it at nearly every step (other kernels at K + 1 rows:
    a near-tie may part), and the steady state runs the chain ahead."""
    from ninfer.engine.speculative import Speculator

    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=15, mtp=True)
    opts = dict(device="cuda", compile=False, max_concurrency=4, kv_capacity=16384,
                host_cache_mib=64, check_invariants=True)  # fmt: skip
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = LLM.from_model(model, **opts)
    want = plain.generate(PROMPTS, params)
    plain.close()
    expected = {tuple(p): p + o.token_ids for p, o in zip(PROMPTS, want, strict=True)}

    def pinned(lane, k: int) -> list[int]:  # plain decode's tokens, one position in 5 wrong
        tokens = lane.request.tokens
        n = len(tokens)
        full = next(v for p, v in expected.items() if tokens[: len(p)] == list(p)) + [0] * k
        return [t if (n + j) % 5 != 3 else (t + 1) % 2000 for j, t in enumerate(full[n : n + k])]

    seen: dict[bool, list] = {}
    propose = Speculator._propose

    def recording(self, lane, draft, k):  # the head's drafts, before the proposal
        key = (tuple(lane.request.tokens[:3]), lane.computed)
        seen[self.chain_ahead].append((key, tuple(draft.tokens)))
        propose(self, lane, draft, k)

    monkeypatch.setattr(Speculator, "_propose", recording)
    outs = {}
    for ahead in (True, False):
        seen[ahead] = []
        llm = LLM.from_model(model, speculative="mtp", num_speculative_tokens=3, **opts)
        sp = llm.engine.speculator
        sp.chain_ahead = ahead
        sp.propose = pinned
        outs[ahead] = [o.token_ids for o in llm.generate(PROMPTS, params)]
        assert (sp.ahead_runs > 10) == ahead, sp.ahead_runs
        assert 0 < sp.stats.accepted < sp.stats.drafted
        llm.check_idle()
        llm.close()
    assert outs[True] == outs[False]
    drafts = {mode: dict(seen[mode]) for mode in seen}
    assert drafts[True].keys() == drafts[False].keys()
    same = sum(drafts[True][key] == d for key, d in drafts[False].items())
    assert same >= 0.9 * len(drafts[False]), (same, len(drafts[False]))


def test_an_fp8_draft_layer_in_the_graphs_keeps_plain_decode_output():
    """`draft_quantization="fp8"`: the head's passes run the FP8 kernels inside the
    speculator's graphs (their configs tuned in the eager run before each capture); greedy
    output as plain decode's up to near-ties, the steady state replayed."""
    from ninfer.models.fp8 import Fp8Linear

    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=12, mtp=True)
    opts = dict(device="cuda", compile=False, max_concurrency=4, kv_capacity=16384,
                host_cache_mib=64)  # fmt: skip
    plain = LLM.from_model(model, **opts)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=20)
    want = plain.generate(PROMPTS, params)
    plain.close()
    spec = LLM.from_model(model, speculative="mtp", num_speculative_tokens=3,
                          draft_quantization="fp8", **opts)  # fmt: skip
    assert any(isinstance(m, Fp8Linear) for m in model.mtp.modules())
    expected = {tuple(p): p + o.token_ids for p, o in zip(PROMPTS, want, strict=True)}
    spec.engine.speculator.propose = controlled_draft(expected, 0.6, CUDA_TINY.vocab_size, 3)
    got = spec.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    _agree_up_to_near_ties(want, got, 40, 3)
    g = spec.engine.speculator.graphs
    assert g is not None and g.verify.replays > 10 and g.bridge.replays > 10
    spec.close()


def _every_third(call: int) -> bool:
    return call % 3 == 0


def _graph(graphs, where: str):
    """The speculator's bridge graph (`where="bridge"`: run ahead at launch and at settle) or
    its first chain window run ahead (`"window"`)."""
    return graphs.bridge if where == "bridge" else graphs.ahead[0]


@pytest.mark.parametrize("where", ["bridge", "window"])
def test_head_faults_on_the_graph_route_fail_no_request(where):
    """On the graph route, the head's passes queued behind the verify pass (the bridge, or a
    chain window run ahead) raise at every third call: no request fails, greedy output is
    plain decode's up to near-ties, the faults are counted, and the graphs go on replaying
    between them. Seeded sampled lanes with the same fault schedule finish whole and give
    the same tokens in two engines (a faulted step's draws are made again on the host)."""
    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=11, mtp=True)
    opts = dict(device="cuda", compile=False, max_concurrency=4, kv_capacity=16384,
                host_cache_mib=64, check_invariants=True)  # fmt: skip
    plain = LLM.from_model(model, **opts)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=20)
    want = plain.generate(PROMPTS, params)
    plain.close()
    expected = {tuple(p): p + o.token_ids for p, o in zip(PROMPTS, want, strict=True)}
    spec = LLM.from_model(model, speculative="mtp", num_speculative_tokens=3, **opts)
    sp = spec.engine.speculator
    sp.propose = controlled_draft(expected, 0.7, CUDA_TINY.vocab_size, 3)
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    with failing_forward(_graph(sp.graphs, where), _every_third, method="run") as calls:
        got = spec.generate(PROMPTS, greedy)
    assert all(o.finish_reason == "length" for o in got), [o.finish_reason for o in got]
    _agree_up_to_near_ties(want, got, 40, 3)
    assert calls["n"] >= 6 and sp.stats.head_faults == calls["n"] // 3, (calls, sp.stats)
    assert 0 < sp.stats.accepted < sp.stats.drafted
    assert sp.graphs.verify.replays > 10 and sp.ahead_runs > 5, sp.ahead_runs
    spec.check_idle()
    spec.close()

    sampled = [
        SamplingParams(max_tokens=n, temperature=t, seed=s, ignore_eos=True)
        for n, t, s in ((36, 0.8, 1), (41, 1.1, 2), (30, 0.0, None))
    ]
    runs = []
    for _ in range(2):
        llm = LLM.from_model(model, speculative="mtp", num_speculative_tokens=3, **opts)
        graph = _graph(llm.engine.speculator.graphs, where)
        with failing_forward(graph, _every_third, method="run") as calls:
            outs = llm.generate(PROMPTS, sampled)
        assert [len(o.token_ids) for o in outs] == [36, 41, 30]
        assert llm.engine.speculator.stats.head_faults == calls["n"] // 3 > 0
        runs.append([o.token_ids for o in outs])
        llm.check_idle()
        llm.close()
    assert runs[0] == runs[1]
