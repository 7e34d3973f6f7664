"""MTP speculative decoding through the engine (`ninfer.engine.speculative`): greedy output
token-identical to plain decode for K = 1..4, with and without the prefix cache, across turns
and a Host restore; seeded sampling reproducible; the acceptance counters. Tiny dense and MoE
models with a random MTP head (it accepts almost nothing), and a controlled draft (`propose`)
that proposes the plain run's own tokens, each wrong with a set probability, so that every
acceptance length occurs."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from engine_helpers import (
    TINY,
    TINY_MOE,
    VOCAB,
    assert_idle,
    failing_forward,
    greedy,
    rand_tokens,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.bench.speculative import controlled_draft
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.request import SamplingParams


@pytest.fixture
def make_spec_llm(mtp_models):
    """make_spec_llm(kind, **kwargs) -> LLM over mtp_models[kind]; closed at teardown."""
    made: list[LLM] = []

    def factory(kind: str = "dense", tokenizer=None, chat_template=None, **kwargs) -> LLM:
        opts = dict(device="cpu", prefill_chunk=64, max_concurrency=4, kv_capacity=16384,
                    host_cache_mib=16, check_invariants=True)  # fmt: skip
        opts.update(kwargs)
        llm = LLM.from_model(mtp_models[kind], tokenizer, chat_template, **opts)
        made.append(llm)
        return llm

    yield factory
    for llm in made:
        llm.close()


def controlled(llm: LLM, expected: dict[tuple, list[int]], accept: float, seed: int) -> None:
    """Drafts of `llm` become the plain run's own next tokens (`expected`: prompt -> prompt +
    plain output), each replaced by another token with probability 1 - accept."""
    llm.engine.speculator.propose = controlled_draft(expected, accept, VOCAB, seed)


def _prompts(seed: int, n: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [rand_tokens(rng, rng.randrange(20, 150)) for _ in range(n)]


# every K with both kinds and with the cache on and off; each kind with it on and off
_KIND_K_REUSE = [(kind, k, (k + (kind == "moe")) % 2 == 1) for k in (1, 2, 3, 4)
                 for kind in ("dense", "moe")]  # fmt: skip


@pytest.mark.parametrize(("kind", "k", "reuse"), _KIND_K_REUSE)
def test_greedy_matches_plain_decode(make_spec_llm, kind, k, reuse):
    """Three lanes at once, with the random head and with a controlled draft at acceptance
    0.6: the same tokens as plain decode, and the counters add up."""
    prompts = _prompts(10 + k)
    params = [greedy(n) for n in (37, 50, 23)]
    plain = make_spec_llm(kind, prefix_reuse=reuse)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    spec = make_spec_llm(kind, prefix_reuse=reuse, speculative="mtp", num_speculative_tokens=k)
    assert [o.token_ids for o in spec.generate(prompts, params)] == want
    expected = {tuple(p): p + w for p, w in zip(prompts, want, strict=True)}
    controlled(spec, expected, accept=0.6, seed=k)
    again = [p + [7] for p in prompts]  # new prompts: no request resumes a finished reply
    want2 = [o.token_ids for o in plain.generate(again, params)]
    expected = {tuple(p): p + w for p, w in zip(again, want2, strict=True)}
    before = spec.engine.call(lambda: dataclasses.replace(spec.engine.speculator.stats))
    controlled(spec, expected, accept=0.6, seed=k)
    assert [o.token_ids for o in spec.generate(again, params)] == want2
    st = spec.engine.call(lambda: spec.engine.speculator.stats)
    rows, drafted = st.verify_rows - before.verify_rows, st.drafted - before.drafted
    accepted, emitted = st.accepted - before.accepted, st.emitted - before.emitted
    assert emitted == rows + accepted and 0 < accepted < drafted <= k * rows
    assert emitted >= sum(p.max_tokens for p in params) - len(params)  # first tokens: prefill
    assert_idle(spec)


@pytest.mark.parametrize("accept", [0.0, 1.0])
def test_acceptance_counters_at_the_extremes(make_spec_llm, accept):
    """A draft always right accepts everything it drafts (K + 1 tokens per verify row but where
    the request's end trims it); one always wrong accepts nothing (one token per row)."""
    prompts = _prompts(3, n=2)
    params = greedy(41)
    plain = make_spec_llm(prefix_reuse=False)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    spec = make_spec_llm(prefix_reuse=False, speculative="mtp", num_speculative_tokens=3)
    controlled(spec, {tuple(p): p + w for p, w in zip(prompts, want, strict=True)}, accept, 0)
    assert [o.token_ids for o in spec.generate(prompts, params)] == want
    st = spec.engine.call(lambda: spec.engine.speculator.stats)
    if accept == 1.0:
        assert st.accepted == st.drafted and st.emitted == 2 * 40
        assert st.verify_rows == 2 * 10  # 40 tokens after the first: 4 per row
    else:
        assert st.accepted == 0 and st.emitted == st.verify_rows == 2 * 40


def test_rows_near_max_tokens_draft_k_tokens_too(make_spec_llm):
    """A request's last verify rows draft K tokens like the others (the row is cut at
    max_tokens when its tokens are appended), so the steps near a request's end stay the
    verify graphs' (a row of fewer drafts, or a plain decode row beside verify rows, runs the
    whole step eagerly). The output is still plain decode's, exactly max_tokens long."""
    prompts = _prompts(21, n=3)
    params = [greedy(n) for n in (10, 13, 2)]
    plain = make_spec_llm()
    want = [o.token_ids for o in plain.generate(prompts, params)]
    spec = make_spec_llm(speculative="mtp", num_speculative_tokens=3)
    got = [o.token_ids for o in spec.generate(prompts, params)]
    assert got == want and [len(t) for t in got] == [10, 13, 2]
    st = spec.engine.call(lambda: spec.engine.speculator.stats)
    assert st.verify_rows >= 3 and st.drafted == 3 * st.verify_rows
    assert_idle(spec)


def test_stops_inside_an_accepted_run(make_spec_llm):
    """A stop token and max_tokens that fall inside a verify row's accepted tokens end the
    request where plain decode ends it; the rest of the row is dropped."""
    prompt = _prompts(4, n=1)[0]
    plain = make_spec_llm()
    full = plain.generate([prompt], greedy(60))[0].token_ids
    stop = full[17]
    params = SamplingParams(max_tokens=60, temperature=0, stop_token_ids=[stop])
    want = plain.generate([prompt], params)[0]
    spec = make_spec_llm(speculative="mtp", num_speculative_tokens=4)
    controlled(spec, {tuple(prompt): prompt + full}, accept=1.0, seed=0)
    got = spec.generate([prompt], params)[0]
    assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
    short = spec.generate([prompt + [9]], greedy(6))[0]
    assert short.token_ids == plain.generate([prompt + [9]], greedy(6))[0].token_ids
    assert_idle(spec)


@pytest.mark.parametrize("k", [1, 3])
def test_multi_turn_and_host_restore_match_plain(make_spec_llm, k):
    """A conversation of three turns, each resuming from the previous reply's endpoint (the
    head re-bridged from the resumed frontier), the last one after other requests pushed it
    off the Device (a Host restore): the same tokens as plain decode, with the same reuse."""
    kwargs = dict(host_cache_mib=4, device_snapshot_slots=2, kv_capacity=24 * 64,
                  max_concurrency=2)  # fmt: skip
    plain = make_spec_llm(**kwargs)
    spec = make_spec_llm(speculative="mtp", num_speculative_tokens=k, **kwargs)
    for llm in (plain, spec):
        rng = random.Random(20)
        history = rand_tokens(rng, 150)
        outs = []
        for turn in range(3):
            if turn == 2:
                for _ in range(7):
                    llm.generate([rand_tokens(rng, 300)], greedy(20))
            out = llm.generate([history], greedy(30))[0]
            ledger = llm.memory_ledger()  # restored pages (the head's K/V rides in each page)
            restored = out.usage.restored_host_bytes
            pages = (restored - ledger["state_image_bytes"]) / ledger["kv_page_bytes"]
            outs.append((out.token_ids, out.usage.cached_tokens, pages if restored else 0))
            history = history + out.token_ids + rand_tokens(rng, 20)
        if llm is plain:
            want = outs
    assert outs == want
    assert want[1][1] > 0 and want[2][2] > 0  # turn 2 resumed, turn 3 restored from the Host
    assert spec.memory_ledger()["kv_page_bytes"] == 2 * plain.memory_ledger()["kv_page_bytes"]
    assert_idle(spec)


def test_seeded_sampling_is_reproducible(make_spec_llm):
    """A seeded sampled request draws the same tokens in two engines, and with a neighbour."""
    prompts = _prompts(5, n=2)
    params = SamplingParams(max_tokens=30, temperature=0.8, top_k=50, seed=123, ignore_eos=True)
    a = make_spec_llm(speculative="mtp", num_speculative_tokens=2)
    b = make_spec_llm(speculative="mtp", num_speculative_tokens=2)
    first = a.generate([prompts[0]], params)[0].token_ids
    assert len(first) == 30
    other = SamplingParams(max_tokens=30, temperature=1.0, ignore_eos=True)
    assert b.generate(prompts, [params, other])[0].token_ids == first


def test_options_are_checked():
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM.from_model(build_random_model(TINY, torch.float32, "cpu"), device="cpu",
                       speculative="mtp", num_speculative_tokens=5)  # fmt: skip
    with pytest.raises(ValueError, match="speculative"):
        LLM.from_model(build_random_model(TINY, torch.float32, "cpu"), device="cpu",
                       speculative="eagle")  # fmt: skip
    with pytest.raises(ValueError, match="speculative"):  # no MTP head
        LLM.from_model(build_random_model(TINY, torch.float32, "cpu"), device="cpu",
                       kv_capacity=4096, speculative="mtp")  # fmt: skip
    with pytest.raises(ValueError, match="num_speculative_tokens needs speculative"):
        LLM.from_model(build_random_model(TINY, torch.float32, "cpu"), device="cpu",
                       kv_capacity=4096, num_speculative_tokens=2)  # fmt: skip


@pytest.mark.parametrize(
    ("tokens", "want"),
    [
        ([5, 6, 7], [5, 6, 7]),  # no boundary
        ([5, 90, 6, 7], [5, 90, 6]),  # after `</think>` (90): one more, then the frontier
        ([90, 6, 7], [90, 6]),
        ([5, 6, 91, 7], [5, 6, 91]),  # `<tool_call>` (91): the frontier lands before it
        ([91, 7], [91]),
        ([5, 6, 7, 90], [5, 6, 7, 90]),
    ],
)
def test_a_verify_row_stops_at_an_output_boundary(tokens, want):
    from types import SimpleNamespace

    from ninfer.engine.speculative import Speculator

    hints = SimpleNamespace(output_after=(90,), output_before=(91,))
    lane = SimpleNamespace(request=SimpleNamespace(hints=hints))
    assert Speculator.cut(lane, tokens) == want
    plain = SimpleNamespace(
        request=SimpleNamespace(hints=SimpleNamespace(output_after=(), output_before=()))
    )
    assert Speculator.cut(plain, tokens) == tokens


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_replay_roll_back_matches_plain(make_spec_llm, kind):
    """The roll-back an op set without per-token snapshots takes (`Speculator.replay`: the
    state saved before the verify pass, restored and the accepted tokens run again): the same
    tokens as plain decode, across partial acceptances."""
    prompts = _prompts(30)
    params = [greedy(n) for n in (33, 41, 19)]
    plain = make_spec_llm(kind)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    spec = make_spec_llm(kind, speculative="mtp", num_speculative_tokens=3)
    spec.engine.speculator.replay = True
    controlled(spec, {tuple(p): p + w for p, w in zip(prompts, want, strict=True)}, 0.6, 1)
    assert [o.token_ids for o in spec.generate(prompts, params)] == want
    st = spec.engine.call(lambda: spec.engine.speculator.stats)
    assert 0 < st.accepted < st.drafted
    assert_idle(spec)


def test_grammar_and_logprobs_lanes_speculate_with_plain_decodes_output(make_spec_llm, demo_text):
    """A request with a grammar and one with logprobs speculate beside a free one (every
    token after the first comes from a verify row), with the same tokens, logprobs and text
    as plain decode. The controlled draft's wrong tokens are mostly ones the grammar rejects:
    the masks over the drafts must stop the acceptance before them."""
    from ninfer.request import StructuredOutputsParams

    tok, template = demo_text
    prompts = _prompts(40)
    params = [
        greedy(30),
        SamplingParams(max_tokens=12, temperature=0,
                       structured_outputs=StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2,5}")),
        SamplingParams(max_tokens=25, temperature=0, ignore_eos=True, logprobs=3),
    ]  # fmt: skip
    plain = make_spec_llm(tokenizer=tok, chat_template=template)
    want = plain.generate(prompts, params)
    spec = make_spec_llm(tokenizer=tok, chat_template=template, speculative="mtp",
                         num_speculative_tokens=3)  # fmt: skip
    expected = {tuple(p): p + o.token_ids for p, o in zip(prompts, want, strict=True)}
    controlled(spec, expected, accept=0.8, seed=2)
    got = spec.generate(prompts, params)
    for w, g in zip(want, got, strict=True):
        assert (g.token_ids, g.text) == (w.token_ids, w.text)
    # the batch's shapes differ from plain decode's (verify rows), so its GEMMs round apart
    got_lp, want_lp = got[2].logprobs, want[2].logprobs
    assert [d.keys() for d in got_lp] == [d.keys() for d in want_lp]
    for g, w in zip(got_lp, want_lp, strict=True):
        assert all(abs(g[t] - w[t]) < 1e-4 for t in w)
    st = spec.engine.call(lambda: spec.engine.speculator.stats)
    assert st.accepted > 0 and st.emitted >= sum(len(o.token_ids) - 1 for o in got)
    assert_idle(spec)


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"},
                   "tags": {"type": "array", "items": {"enum": ["a", "bc", "def"]}}},
    "required": ["name", "n", "tags"],
}  # fmt: skip


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(k=st.integers(1, 4), accept=st.sampled_from([0.0, 0.5, 0.9]), seed=st.integers(0, 99),
       kind=st.sampled_from(["dense", "moe"]), budget=st.sampled_from([None, 0, 5]))  # fmt: skip
def test_structured_outputs_speculate_to_plain_decodes_documents(
    make_spec_llm, demo_text, k, accept, seed, kind, budget
):
    """Greedy JSON-schema replies (the reasoning block open, bounded by a thinking budget, or
    none) with MTP at any K and acceptance: the tokens of plain decode, the documents valid;
    the speculating run's wrong drafts are mostly tokens the grammar rejects. Seeded sampled
    replies under the same schema are valid and reproduce."""
    import json

    from ninfer.request import StructuredOutputsParams

    tok, template = demo_text
    so = StructuredOutputsParams(json=SCHEMA)
    chats = [[{"role": "user", "content": w}] for w in ("hi", "why 42")]
    params = [SamplingParams(max_tokens=40, temperature=0, structured_outputs=so,
                             thinking_token_budget=budget) for _ in chats]  # fmt: skip
    think = budget is not None
    plain = make_spec_llm(kind, tokenizer=tok, chat_template=template)
    want = plain.chat(chats, params, enable_thinking=think)
    spec = make_spec_llm(kind, tokenizer=tok, chat_template=template, speculative="mtp",
                         num_speculative_tokens=k)  # fmt: skip
    expected = {tuple(o.prompt_token_ids): o.prompt_token_ids + o.token_ids for o in want}
    controlled(spec, expected, accept=accept, seed=seed)
    got = spec.chat(chats, params, enable_thinking=think)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    close = "</think>"
    for o in got:
        if o.finish_reason == "stop":
            json.loads(o.text.split(close)[-1] if think else o.text)
    if accept:
        assert spec.engine.call(lambda: spec.engine.speculator.stats.accepted) > 0
    spec.engine.speculator.propose = None  # the head's drafts: drawn by the seeded generators
    sampled = [SamplingParams(max_tokens=40, temperature=1.0, seed=seed + j, structured_outputs=so)
               for j in range(len(chats))]  # fmt: skip
    runs = [spec.chat(chats, sampled, enable_thinking=False) for _ in range(2)]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
    for o in runs[0]:
        if o.finish_reason == "stop":
            json.loads(o.text)
    st_ = spec.engine.call(lambda: spec.engine.speculator.stats)
    assert st_.verify_rows > 0
    assert_idle(spec)


def test_bench_acceptance_holds_when_outputs_part(make_spec_llm, monkeypatch):
    """The decode bench's controlled acceptance is what it asks for even when no two runs of
    a prompt give the same tokens (a GPU's near-ties on random weights: here, logits noise
    drawn anew on every pass). A draft built from an earlier run's output accepted nothing
    then (1.07 tokens per step at a = 0.7 on an H100)."""
    from ninfer.bench.model_math import param_counts
    from ninfer.bench.throughput import bench_decode

    llm = make_spec_llm("dense", speculative="mtp", num_speculative_tokens=3)
    model = llm.engine.runner.model
    forward_hidden = model.forward_hidden

    def noisy(batch, cache, ops):
        logits, hidden = forward_hidden(batch, cache, ops)
        return logits + 50 * torch.randn_like(logits), hidden

    monkeypatch.setattr(model, "forward_hidden", noisy)
    bounds = {"copy_bytes_per_s": 1e12}
    cfg = model.config
    rows = bench_decode(llm, cfg, param_counts(cfg), 24, 40, [1, 2], bounds, 4, 4,
                        draft_acceptance=0.7)  # fmt: skip
    for row in rows:
        assert not row["errors"]
        # at a = 0.7 and K = 3: (a + a^2 + a^3) / 3 = 0.51 of the drafts accepted, and
        # 1 + a + a^2 + a^3 = 2.53 tokens per verify row (fewer drafts near max_tokens)
        got = (row["spec_acceptance"], row["spec_tokens_per_step"])
        assert 0.4 < got[0] < 0.65 and 2.1 < got[1] < 2.9, got


@pytest.mark.parametrize(("k", "vocab"), [(2, None), (4, None), (3, VOCAB // 5)])
def test_greedy_chain_on_the_device_drafts_what_the_host_chain_does(
    make_spec_llm, monkeypatch, k, vocab
):
    """The greedy draft chain kept on the device (each step's argmax fed to the next step, one
    read at the end: `Speculator._chain_fed`) proposes, step after step and lane by lane,
    exactly the tokens of the chain that reads every step back (`_pick`), with a lane whose
    chains end early (the second one reaches max_model_len) beside full ones; with a trimmed
    draft vocabulary too."""
    from ninfer.engine.speculative import Speculator

    rng = random.Random(30 + k)
    prompts = [rand_tokens(rng, n) for n in (40, 60, 30)]
    params = [greedy(n) for n in (21, 34, 9)]
    seen: dict[str, list] = {}
    draft = Speculator.draft

    def recording(self, pending, live, max_model_len):
        draft(self, pending, live, max_model_len)
        seen[mode].append(sorted((i, tuple(d.tokens)) for i, d in self.drafts.items()))

    monkeypatch.setattr(Speculator, "draft", recording)
    outs = {}
    for mode in ("device", "host"):
        seen[mode] = []
        if mode == "host":
            monkeypatch.setattr(Speculator, "_fed", staticmethod(lambda picks: False))
        llm = make_spec_llm(speculative="mtp", num_speculative_tokens=k, draft_vocab=vocab,
                            max_model_len=60 + 34)  # fmt: skip
        outs[mode] = [o.token_ids for o in llm.generate(prompts, params)]
    assert outs["device"] == outs["host"]
    assert [len(t) for t in outs["device"]] == [21, 34, 9]
    assert seen["device"] == seen["host"]
    lengths = {len(t) for step in seen["device"] for _, t in step}
    assert k in lengths and len(lengths) > 1  # full chains and chains cut short


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("mode", ["device", "host"])
def test_a_trimmed_draft_vocabulary_proposes_only_its_tokens(make_spec_llm, monkeypatch, kind,
                                                           mode):  # fmt: skip
    """`draft_vocab=n`: the head proposes only ids below n (and the tokenizer's added ones;
    none here), through the greedy chain kept on the device and the one read step by step,
    each draft being the full head's choice among those ids; the output stays plain
    decode's."""
    from ninfer.engine.speculative import Speculator

    n = VOCAB // 5
    prompts = _prompts(40)
    params = [greedy(m) for m in (29, 40, 17)]
    plain = make_spec_llm(kind)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    if mode == "host":
        monkeypatch.setattr(Speculator, "_fed", staticmethod(lambda picks: False))
    seen: list[int] = []
    head_logits: list[tuple[torch.Tensor, int]] = []
    pick, draft = Speculator._pick, Speculator.draft

    def recording(self, pending, live, max_model_len):
        draft(self, pending, live, max_model_len)
        seen.extend(t for d in self.drafts.values() for t in d.tokens)

    def checked(self, picks):  # each draft picked: the head's argmax among ids below n
        pick(self, picks)
        head_logits.extend((logits, d.tokens[-1]) for d, _, logits in picks)

    monkeypatch.setattr(Speculator, "draft", recording)
    monkeypatch.setattr(Speculator, "_pick", checked)
    spec = make_spec_llm(kind, speculative="mtp", num_speculative_tokens=3, draft_vocab=n)
    assert spec.engine.call(lambda: spec.engine.speculator.runner.model.mtp.vocab_head) == n
    assert [o.token_ids for o in spec.generate(prompts, params)] == want
    assert seen and max(seen) < n
    assert head_logits or mode == "device"  # the device chain picks without `_pick`
    for logits, token in head_logits:
        assert logits.shape[-1] == n and token == int(logits.argmax())
    spec.close()
    full = make_spec_llm(kind, speculative="mtp", num_speculative_tokens=3)
    mtp = full.engine.speculator.runner.model.mtp
    assert mtp.d2t is None  # the model is shared: a later engine gets the whole vocabulary


def test_a_trimmed_sampled_draft_stays_reproducible_and_in_its_vocabulary(make_spec_llm):
    """A sampled lane's draft distribution is zero outside the trimmed vocabulary; seeded
    requests still reproduce, and every draft lies inside it."""
    prompts = _prompts(41, n=2)
    params = SamplingParams(max_tokens=30, temperature=0.9, seed=7, ignore_eos=True)
    a = make_spec_llm(speculative="mtp", num_speculative_tokens=2, draft_vocab=VOCAB // 3)
    first = a.generate([prompts[0]], params)[0].token_ids
    b = make_spec_llm(speculative="mtp", num_speculative_tokens=2, draft_vocab=VOCAB // 3)
    other = SamplingParams(max_tokens=30, temperature=1.0, ignore_eos=True)
    assert b.generate(prompts, [params, other])[0].token_ids == first


def test_draft_vocab_ids_and_options():
    from ninfer.engine.speculative import draft_vocab

    assert draft_vocab(None, 100, frozenset({99})) is None
    assert draft_vocab(100, 100, frozenset()) is None  # as large: every token
    assert draft_vocab(4, 100, frozenset({98, 2, 150})) == [0, 1, 2, 3, 98]
    model = build_random_model(TINY, torch.float32, "cpu", mtp=True)
    with pytest.raises(ValueError, match="draft_vocab needs speculative"):
        LLM.from_model(model, device="cpu", kv_capacity=4096, draft_vocab=64)
    with pytest.raises(ValueError, match="draft_vocab"):
        LLM.from_model(model, device="cpu", kv_capacity=4096, speculative="mtp", draft_vocab=0)


@pytest.mark.parametrize(("kind", "config"), [("dense", TINY), ("moe", TINY_MOE)])
def test_an_fp8_draft_layer_keeps_plain_decode_output(make_spec_llm, kind, config):
    """`draft_quantization="fp8"`: the MTP layer's projections (and experts) become FP8 at load,
    `mtp.fc`, the routers and every target module stay as they were, and greedy output is
    plain decode's (the target verifies every draft)."""
    from torch import nn

    from ninfer.models.fp8 import Fp8Linear
    from ninfer.models.qwen3_5 import Experts

    prompts = _prompts(44)
    params = [greedy(n) for n in (31, 44, 19)]
    want = [o.token_ids for o in make_spec_llm(kind).generate(prompts, params)]
    model = build_random_model(config, torch.float32, "cpu", seed=1 if kind == "dense" else 2,
                               mtp=True)  # fmt: skip
    before = {n: type(m) for n, m in model.named_modules() if not n.startswith("mtp.")}
    with LLM.from_model(model, device="cpu", prefill_chunk=64, max_concurrency=4,
                        kv_capacity=16384, host_cache_mib=16, check_invariants=True,
                        speculative="mtp", num_speculative_tokens=3,
                        draft_quantization="fp8") as llm:  # fmt: skip
        assert [o.token_ids for o in llm.generate(prompts, params)] == want
    fp8 = {n for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
    fp8 |= {n for n, m in model.named_modules() if isinstance(m, Experts) and m.blocks}
    assert fp8 and all(n.startswith("mtp.layers.0.") for n in fp8), fp8
    assert "mtp.layers.0.self_attn.o_proj" in fp8
    assert isinstance(model.mtp.fc, nn.Linear) and model.quant_scheme is None
    after = {n: type(m) for n, m in model.named_modules() if not n.startswith("mtp.")}
    assert after == before
    if kind == "moe":
        assert "mtp.layers.0.mlp.experts" in fp8
        assert not any(n.endswith(("mlp.gate", "shared_expert_gate")) for n in fp8)


def test_draft_quantization_options():
    model = build_random_model(TINY, torch.float32, "cpu", mtp=True)
    with pytest.raises(ValueError, match="draft_quantization needs speculative"):
        LLM.from_model(model, device="cpu", kv_capacity=4096, draft_quantization="fp8")
    with pytest.raises(ValueError, match="draft_quantization"):
        LLM.from_model(model, device="cpu", kv_capacity=4096, speculative="mtp",
                       draft_quantization="int4")  # fmt: skip
    plain = build_random_model(TINY, torch.float32, "cpu")
    with pytest.raises(ValueError, match="speculative"):
        LLM.from_model(plain, device="cpu", kv_capacity=4096, speculative="mtp",
                       draft_quantization="fp8")  # fmt: skip


def test_a_trimmed_draft_over_an_fp8_lm_head_is_refused():
    """A checkpoint whose not-convert list leaves the LM head FP8: its rows carry block
    scales, so the draft cannot slice them; `draft_vocab` is refused by name before any
    pass (the whole vocabulary still drafts)."""
    model = build_random_model(TINY, torch.float32, "cpu", mtp=True)
    head = model.lm_head.weight
    head.data = head.data.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="draft_vocab: the checkpoint's LM head is FP8"):
        LLM.from_model(model, device="cpu", kv_capacity=4096, speculative="mtp", draft_vocab=64)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_grammars_forced_tokens_are_drafted_and_accepted(make_spec_llm, demo_text, temperature):
    """Drafts that are always wrong (the controlled draft at acceptance 0) are still accepted
    where the grammar allows one token only (an enum's rest, a key's quotes): the grammar
    drafts those itself. Greedy output stays plain decode's; a seeded sampled reply (its
    draft distribution one-hot at a forced position) is valid and reproduces."""
    import json

    from ninfer.request import StructuredOutputsParams

    tok, template = demo_text
    schema = {"type": "object", "properties": {"colour": {"enum": ["crimson", "turquoise"]},
                                               "size": {"enum": ["enormous", "minuscule"]}},
              "required": ["colour", "size"], "additionalProperties": False}  # fmt: skip
    so = StructuredOutputsParams(json=schema)
    chats = [[{"role": "user", "content": w}] for w in ("hi", "why 42")]
    params = [SamplingParams(max_tokens=60, temperature=temperature, seed=j, structured_outputs=so)
              for j in range(len(chats))]  # fmt: skip
    plain = make_spec_llm(tokenizer=tok, chat_template=template)
    want = plain.chat(chats, params, enable_thinking=False)
    spec = make_spec_llm(tokenizer=tok, chat_template=template, speculative="mtp",
                         num_speculative_tokens=3)  # fmt: skip
    wrong = {tuple(o.prompt_token_ids): o.prompt_token_ids + o.token_ids for o in want}
    runs = []
    for _ in range(2):
        controlled(spec, wrong, accept=0.0, seed=1)
        runs.append(spec.chat(chats, params, enable_thinking=False))
    st_ = spec.engine.call(lambda: spec.engine.speculator.stats)
    assert st_.accepted > 0
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
    if temperature == 0:
        assert [o.token_ids for o in runs[0]] == [o.token_ids for o in want]
    for o in runs[0]:
        assert o.finish_reason == "stop", o
        assert json.loads(o.text).keys() == {"colour", "size"}
    assert_idle(spec)


@pytest.fixture(scope="module")
def demo_pair(mtp_models, demo_text):
    """(plain, speculating K = 3) LLMs over the tiny dense model with the demo tokenizer,
    shared by a property's examples."""
    tok, template = demo_text
    opts = dict(device="cpu", prefill_chunk=64, max_concurrency=4, kv_capacity=16384,
                host_cache_mib=16, check_invariants=True)  # fmt: skip
    plain = LLM.from_model(mtp_models["dense"], tok, template, **opts)
    spec = LLM.from_model(mtp_models["dense"], tok, template, speculative="mtp",
                          num_speculative_tokens=3, **opts)  # fmt: skip
    yield plain, spec
    plain.close()
    spec.close()


def _every(n: int):
    """A `failing_forward` schedule: every n-th call (0: none)."""
    return lambda call: n > 0 and call % n == 0


REGEXES = (r"[0-9]{2,8}", r"(yes|no)( [a-z]{1,6}){0,4}", r"[A-Z][a-z ]{3,30}\.")


@st.composite
def _request(draw):
    from ninfer.request import StructuredOutputsParams

    rng = random.Random(draw(st.integers(0, 10**6)))
    prompt = rand_tokens(rng, draw(st.integers(3, 90)))
    regex = draw(st.sampled_from((None, None, *REGEXES)))
    params = SamplingParams(
        max_tokens=draw(st.integers(1, 30)),
        temperature=0,
        ignore_eos=draw(st.booleans()) if regex is None else False,
        logprobs=draw(st.sampled_from((None, None, 1, 3))),
        stop_token_ids=draw(st.sampled_from((None, [rng.randrange(4, VOCAB - 60)]))),
        stop=draw(st.sampled_from((None, "e", ["a", "o"]))),
        structured_outputs=None if regex is None else StructuredOutputsParams(regex=regex),
    )
    return prompt, params


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(requests=st.lists(_request(), min_size=1, max_size=5),
       accept=st.sampled_from([0.0, 0.5, 0.9]), seed=st.integers(0, 99),
       head_fault_every=st.sampled_from([0, 0, 2, 5]))  # fmt: skip
def test_any_request_mix_speculates_to_plain_decodes_output(
    demo_pair, requests, accept, seed, head_fault_every
):
    """The property: any mix of greedy requests (grammars, logprobs, stop tokens and strings,
    short and long max_tokens, EOS on or ignored) speculating together gives each request
    plain decode's tokens, text, finish reason and logprobs, at any acceptance, and whether
    or not the draft head's passes raise (every 2nd or 5th: the lanes then lose drafts, no
    request fails); nothing is left pinned."""
    plain, spec = demo_pair
    prompts, params = [r[0] for r in requests], [r[1] for r in requests]
    want = plain.generate(prompts, params)
    expected = {tuple(p): p + o.token_ids for p, o in zip(prompts, want, strict=True)}
    controlled(spec, expected, accept=accept, seed=seed)
    with failing_forward(spec.engine.runner.model.mtp, _every(head_fault_every)):
        got = spec.generate(prompts, params)
    for w, g in zip(want, got, strict=True):
        assert (g.token_ids, g.text, g.finish_reason, g.error) == (
            w.token_ids, w.text, w.finish_reason, w.error)  # fmt: skip
        assert (g.logprobs is None) == (w.logprobs is None)
        for gd, wd in zip(g.logprobs or [], w.logprobs or [], strict=True):
            assert gd.keys() == wd.keys()  # (a grammar's masked tokens: -inf on both)
            assert all(gd[t] == wd[t] or abs(gd[t] - wd[t]) < 1e-4 for t in wd), (gd, wd)
    assert_idle(spec)


@st.composite
def _sampled_request(draw):
    """A seeded sampled request: temperature, top-p and top-k drawn; a regex grammar (then no
    stop strings or ids, so a reply that stops is a whole match) or stops; logprobs or not."""
    from ninfer.request import StructuredOutputsParams

    rng = random.Random(draw(st.integers(0, 10**6)))
    prompt = rand_tokens(rng, draw(st.integers(3, 90)))
    regex = draw(st.sampled_from((None, *REGEXES)))
    stops = regex is None and draw(st.booleans())
    params = SamplingParams(
        max_tokens=draw(st.integers(1, 30)),
        temperature=draw(st.sampled_from((0.5, 1.0, 1.5))),
        top_p=draw(st.sampled_from((1.0, 0.9))),
        top_k=draw(st.sampled_from((-1, 20))),
        seed=draw(st.integers(0, 10**6)),
        ignore_eos=draw(st.booleans()) if regex is None else False,
        logprobs=draw(st.sampled_from((None, 2))),
        stop_token_ids=[rng.randrange(4, VOCAB - 60)] if stops else None,
        stop=["a", "o"] if stops else None,
        structured_outputs=None if regex is None else StructuredOutputsParams(regex=regex),
    )
    return prompt, params


def _constrained_text(tok, prompt: list[int], out) -> str | None:
    """The part of a reply that its grammar constrains (`ninfer.structured`): the whole text,
    or, when the prompt leaves a `<think>` block open (its last `<think>` after its last
    `</think>`; random prompts hold these ids), the text after the reply's first `</think>`,
    without the EOS that ends it; None when the reply never closes the block."""
    opened, closed = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    last = {t: i for i, t in enumerate(prompt)}
    if last.get(opened, -1) <= last.get(closed, -1):
        return out.text
    if closed not in out.token_ids:
        return None
    after = out.token_ids[out.token_ids.index(closed) + 1 :]
    if after and after[-1] in tok.eos_token_ids:
        after = after[:-1]
    return tok.decode(after)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(requests=st.lists(_sampled_request(), min_size=1, max_size=4),
       accept=st.sampled_from([0.0, 0.5, 0.9]), seed=st.integers(0, 99),
       head_fault_every=st.sampled_from([0, 0, 3]))  # fmt: skip
def test_any_sampled_mix_speculates_to_whole_reproducible_replies(
    demo_pair, demo_text, requests, accept, seed, head_fault_every
):
    """The property for seeded sampled requests speculating together (grammars, stops,
    logprobs, top-p / top-k, at any acceptance, with or without the draft head failing every
    3rd pass): no request fails, each reply is whole (max_tokens long, or stopped; a grammar's
    reply that stops matches it in full, after the reply's `</think>` where the prompt leaves a
    reasoning block open), each token's logprob is finite and its own, and, without faults,
    the same requests again (now resumed from the prefix cache) give the same replies (a
    seeded request's draws follow its drafts, so a head fault changes them)."""
    import re

    _, spec = demo_pair
    prompts, params = [r[0] for r in requests], [r[1] for r in requests]
    runs = []
    for _ in range(2):
        controlled(spec, {}, accept=accept, seed=seed)
        with failing_forward(spec.engine.runner.model.mtp, _every(head_fault_every)):
            runs.append(spec.generate(prompts, params))
    for prompt, out, p in zip(prompts, runs[0], params, strict=True):
        assert out.error is None and out.finish_reason in ("length", "stop"), out
        assert len(out.token_ids) <= p.max_tokens
        if out.finish_reason == "length":
            assert len(out.token_ids) == p.max_tokens
        if p.structured_outputs is not None and out.finish_reason == "stop":
            text = _constrained_text(demo_text[0], prompt, out)
            assert text is None or re.fullmatch(p.structured_outputs.regex, text), out
        if p.logprobs is not None:
            assert len(out.logprobs) == len(out.token_ids)
            for t, lp in zip(out.token_ids, out.logprobs, strict=True):
                assert t in lp and lp[t] > float("-inf"), (t, lp)
    # a head fault counted by call lands elsewhere on the resumed run: other drafts, other draws
    if not head_fault_every:
        assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
    assert_idle(spec)
