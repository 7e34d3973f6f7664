"""Output-boundary snapshots (design §7.7): a chat whose reply the next turn re-renders keeps the
reply's own tokens up to where the re-rendering differs. The engine snapshots the decoded state
right after `</think>` (thinking on) and right before `<tool_call>` (tools offered), so the next
turn resumes there instead of at the generation opener. Replies are scripted (a sampler that
forces the reasoning, `</think>`, the answer and the tool call's opening, then greedy), since
the tiny model's own text never closes a think block. Cached runs give the tokens of cold ones.
Engine on the CPU (tiny model, demo tokenizer and chat template)."""

from __future__ import annotations

import pytest
from engine_helpers import assert_idle
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ninfer.cache.common import SnapshotKind
from ninfer.request import SamplingParams

OUTPUT = int(SnapshotKind.OUTPUT)
WORDS = ("river", "bridge", "city", "north", "stone", "light", "market", "tower", "garden")
SYSTEM = {"role": "system", "content": "You are a careful assistant. " + " ".join(WORDS * 4)}
USER = {"role": "user", "content": "Which way is the " + " ".join(WORDS[:5]) + "?"}
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
GREEDY_TAIL = 12  # tokens the model picks itself after the scripted part
_SETTINGS = settings(
    max_examples=4,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),  # engine runs per example
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def reasoning(n: int) -> str:
    return "Let me think. " + " ".join(WORDS[i % len(WORDS)] for i in range(n))


class Script:
    """A sampler forcing every request's first generated tokens to `tokens` (greedy after).
    Installed once per engine; requests are told apart by their frozen params object, which
    the script keeps alive so that its id is never reused."""

    def __init__(self, llm, tokens: list[int]) -> None:
        self.tokens = tokens
        self.seen: dict[int, list] = {}
        real = llm.engine.runner.sampler

        def sampler(logits, params, generators):
            res = real(logits, params, generators)
            ids = res.token_ids.clone()
            for i, p in enumerate(params):
                entry = self.seen.setdefault(id(p), [p, 0])
                if entry[1] < len(self.tokens):
                    ids[i] = self.tokens[entry[1]]
                entry[1] += 1
            res.token_ids = ids
            return res

        llm.engine.runner.sampler = sampler


def reply_script(tok, think: str, answer: str, call: bool) -> list[int]:
    """The reply a thinking model writes: reasoning, `</think>`, the answer and, with `call`,
    a tool call's opening after a single line break (the template re-renders it after two)."""
    ids = tok.encode(think + "\n") + [tok.token_to_id("</think>")] + tok.encode("\n\n" + answer)
    if call:
        ids += tok.encode("\n") + [tok.token_to_id("<tool_call>")] + tok.encode("\n<function=")
    return ids


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def snapshots(llm) -> list[tuple[int, int]]:
    def read():
        snaps = llm.engine.kv_state.index.snapshots.by_id.values()
        return sorted((s.frontier, int(s.kind)) for s in snaps)

    return llm.engine.call(read)


def two_turns(llm, tok, script, second, tools=None):
    """Turn 1 (scripted reply), then the re-rendered `second` conversation."""
    Script(llm, script)
    params = SamplingParams(max_tokens=len(script) + GREEDY_TAIL, temperature=0, ignore_eos=True)
    first = llm.chat([[SYSTEM, USER]], params, tools=tools)[0]
    out = llm.chat(
        [second], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), tools=tools
    )
    return first, out[0]


@pytest.fixture
def tok(demo_text):
    return demo_text[0]


@_SETTINGS
@given(
    think_words=st.integers(20, 70),
    chunk=st.sampled_from([64, 128]),
    overlap=st.booleans(),
)
def test_reasoning_kept_answer_rewritten_resumes_after_think_end(
    make_llm, tok, think_words, chunk, overlap
):
    """An agent turn after the last user query keeps its reasoning in the history; the client
    rewrote the answer. The history diverges after `</think>\\n\\n`: the next turn resumes right
    after `</think>` whenever that lies a block past the generation opener, and the tokens equal
    a cold run's."""
    think = reasoning(think_words)
    script = reply_script(tok, think, "The answer is the river.", call=False)
    second = [
        SYSTEM,
        USER,
        {"role": "assistant", "reasoning_content": think, "content": "Rewritten: north."},
        {"role": "tool", "content": "search results: " + " ".join(WORDS)},
    ]
    llm = make_llm(prefill_chunk=chunk, overlap_decode=overlap)
    first, out = two_turns(llm, tok, script, second)
    seq = list(first.prompt_token_ids) + list(first.token_ids)
    opener = len(first.prompt_token_ids) - len(tok.encode("<|im_start|>assistant\n<think>\n"))
    boundary = len(first.prompt_token_ids) + script.index(tok.token_to_id("</think>")) + 1
    d = lcp(list(out.prompt_token_ids), seq)
    assert boundary <= d < boundary + 4, (boundary, d)  # the re-rendered reasoning matches
    if boundary - opener >= 64:
        assert (boundary, OUTPUT) in snapshots(llm) or out.usage.cached_tokens == boundary
        assert out.usage.cached_tokens == boundary, (out.usage.cached_tokens, boundary, opener)
    else:  # too near the opener's tap to pay: not taken
        assert OUTPUT not in {k for _, k in snapshots(llm)}
        assert out.usage.cached_tokens >= opener
    cold = make_llm(prefix_reuse=False, prefill_chunk=chunk, overlap_decode=overlap)
    cold_first, cold_out = two_turns(cold, tok, script, second)
    assert first.token_ids == cold_first.token_ids
    assert out.token_ids == cold_out.token_ids
    assert_idle(llm)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_tool_call_re_rendered_resumes_at_the_call(make_llm, tok, overlap):
    """With tools offered, the reply's tool call is re-rendered from its parsed form: here the
    template writes two line breaks before `<tool_call>` where the model wrote one. Without a
    step run ahead the state right before `<tool_call>` is kept and the next turn resumes at
    the divergence; a step run ahead has computed `<tool_call>` already, so the snapshot lies
    right after it and the next turn resumes at the deepest snapshot below: after `</think>`."""
    think, answer = reasoning(70), "I will search for it. " + " ".join(WORDS * 6)
    script = reply_script(tok, think, answer, call=True)
    second = [
        SYSTEM,
        USER,
        {
            "role": "assistant",
            "reasoning_content": think,
            "content": answer,
            "tool_calls": [{"function": {"name": "search", "arguments": {"q": "river"}}}],
        },
        {"role": "tool", "content": "search results: " + " ".join(WORDS)},
    ]
    llm = make_llm(overlap_decode=overlap)
    first, out = two_turns(llm, tok, script, second, tools=TOOLS)
    n = len(first.prompt_token_ids)
    call = n + script.index(tok.token_to_id("<tool_call>"))
    think_end = n + script.index(tok.token_to_id("</think>")) + 1
    seq = list(first.prompt_token_ids) + list(first.token_ids)
    assert lcp(list(out.prompt_token_ids), seq) == call
    outputs = [f for f, k in snapshots(llm) if k == OUTPUT]
    if overlap:
        assert outputs == [think_end, call + 1]
        assert out.usage.cached_tokens == think_end
    else:
        assert outputs == [think_end, call]
        assert out.usage.cached_tokens == call
    cold = make_llm(prefix_reuse=False, overlap_decode=overlap)
    cold_first, cold_out = two_turns(cold, tok, script, second, tools=TOOLS)
    assert (first.token_ids, out.token_ids) == (cold_first.token_ids, cold_out.token_ids)
    assert_idle(llm)


def test_no_output_boundaries_without_thinking_or_tools_and_on_raw_prompts(make_llm, tok):
    """A chat with thinking off and no tools, and a raw prompt holding the same tokens, take no
    output-boundary snapshot; a regenerated reply finds its boundary taken already."""
    script = reply_script(tok, reasoning(80), "The answer.", call=False)
    llm = make_llm()
    Script(llm, script)
    params = SamplingParams(max_tokens=len(script) + 4, temperature=0, ignore_eos=True)
    llm.chat([SYSTEM, USER], params, enable_thinking=False)
    prompt = llm.render_chat([SYSTEM, USER]).prompt.token_ids
    llm.generate({"prompt_token_ids": prompt}, params)
    assert OUTPUT not in {k for _, k in snapshots(llm)}
    llm.chat([SYSTEM, USER], params)
    taken = [f for f, k in snapshots(llm) if k == OUTPUT]
    assert len(taken) == 1
    duplicates = llm.cache_stats().snapshots_duplicate
    llm.chat([SYSTEM, USER], params)  # the same reply again: a duplicate is not staged
    assert [f for f, k in snapshots(llm) if k == OUTPUT] == taken
    # the reply's endpoint is the one duplicate published: the boundary was not staged again
    assert llm.cache_stats().snapshots_duplicate == duplicates + 1
    assert_idle(llm)


def test_output_boundary_image_equals_the_cold_state(make_llm, tok):
    """The snapshot's image is the state after exactly its frontier's tokens: a prompt that
    extends the reply up to the boundary and goes on resumes there and decodes like a cold
    run (the reply's tokens, re-sent raw)."""
    script = reply_script(tok, reasoning(80), "The answer.", call=False)
    llm = make_llm()
    forced = Script(llm, script)
    params = SamplingParams(max_tokens=len(script) + 4, temperature=0, ignore_eos=True)
    first = llm.chat([[SYSTEM, USER]], params)[0]
    n = len(first.prompt_token_ids)
    boundary = n + script.index(tok.token_to_id("</think>")) + 1
    seq = list(first.prompt_token_ids) + list(first.token_ids)
    prompt = seq[:boundary] + tok.encode("Something else entirely, " + " ".join(WORDS))
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    forced.tokens = []
    out = llm.generate({"prompt_token_ids": prompt}, greedy)[0]
    assert out.usage.cached_tokens == boundary
    cold = make_llm(prefix_reuse=False)
    assert out.token_ids == cold.generate({"prompt_token_ids": prompt}, greedy)[0].token_ids
    assert_idle(llm)
