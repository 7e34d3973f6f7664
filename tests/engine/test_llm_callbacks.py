"""`LLM.submit`'s `on_event` runs on the engine thread: a callback that raises (a bounded queue's
`put_nowait`, a bug) fails its own request, never the engine. The other requests' outputs are
those of a run without it, later requests are served, and `running` tells the truth."""

from __future__ import annotations

import logging
import queue
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer import LLM, SamplingParams
from ninfer.request import RequestOutput, StreamDelta

PROMPTS = ("The river runs", "Name three mountains.", "a b c d e f g", "Once upon a time there")
RAISES = (queue.Full, RuntimeError, KeyboardInterrupt)  # SystemExit-like too: never fatal


def _engine(tiny_model, demo_text, **kwargs) -> LLM:
    tok, template = demo_text
    opts = dict(device="cpu", max_concurrency=3, kv_capacity=8192, host_cache_mib=0)
    return LLM.from_model(tiny_model, tok, template, **{**opts, **kwargs})


@pytest.fixture(scope="module")
def llm(tiny_model, demo_text):
    with _engine(tiny_model, demo_text, check_invariants=True) as engine:
        yield engine


@pytest.fixture(scope="module")
def solo(llm):
    """The output of each (prompt, max_tokens) run alone: the oracle (greedy, so exact)."""
    memo: dict[tuple[int, int], RequestOutput] = {}

    def get(prompt: int, max_tokens: int) -> RequestOutput:
        if (prompt, max_tokens) not in memo:
            memo[prompt, max_tokens] = llm.generate(PROMPTS[prompt], _params(max_tokens))[0]
        return memo[prompt, max_tokens]

    return get


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


class Caller:
    """An `on_event` that records every event it is handed and raises `exc` at call number
    `raise_at` (and, when `always`, at every later call: a queue that stays full)."""

    def __init__(self, raise_at: int | None, always: bool, exc: type[BaseException]) -> None:
        self.raise_at, self.always, self.exc = raise_at, always, exc
        self.seen: list[StreamDelta | RequestOutput] = []  # every call's event
        self.accepted: list[StreamDelta | RequestOutput] = []  # calls that did not raise
        self.first_raise: int | None = None  # index into `seen`
        self.done = threading.Event()

    def __call__(self, event: StreamDelta | RequestOutput) -> None:
        n = len(self.seen)
        self.seen.append(event)
        if isinstance(event, RequestOutput):
            self.done.set()
        at = self.raise_at
        if at is not None and (n == at or (self.always and n > at)):
            if self.first_raise is None:
                self.first_raise = n
            raise self.exc()
        self.accepted.append(event)


requests = st.lists(
    st.tuples(
        st.integers(0, len(PROMPTS) - 1),  # prompt
        st.integers(1, 6),  # max_tokens
        st.booleans(),  # stream
        st.none() | st.integers(0, 9),  # the call that raises first
        st.booleans(),  # raises at every later call too
        st.sampled_from(RAISES),
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(requests)
def test_raising_callbacks_never_change_the_other_requests(llm, solo, caplog, reqs):
    caplog.set_level(logging.WARNING, logger="ninfer.llm")
    callers, ids = [], []
    for prompt, max_tokens, stream, raise_at, always, exc in reqs:
        caller = Caller(raise_at, always, exc)
        rendered = llm.render_prompt(PROMPTS[prompt])
        ids.append(llm.submit(rendered, _params(max_tokens), on_event=caller, stream=stream))
        callers.append(caller)
    for caller in callers:
        assert caller.done.wait(60), "a request was never answered"
    llm.cache_stats()  # runs on the engine thread: what it logged with the finals is in
    for (prompt, max_tokens, stream, *_), caller, request_id in zip(
        reqs, callers, ids, strict=True
    ):
        want = solo(prompt, max_tokens)
        finals = [e for e in caller.seen if isinstance(e, RequestOutput)]
        assert len(finals) == 1 and caller.seen[-1] is finals[0]  # one final, last
        assert all(e.request_id == request_id for e in caller.seen)
        got = [t for e in caller.seen[:-1] for t in e.token_ids]
        assert stream or not got
        if caller.first_raise is None:  # well-behaved: exactly the run alone
            final = finals[0]
            assert (final.token_ids, final.text) == (want.token_ids, want.text)
            assert final.finish_reason == "length" and final.error is None
            if stream:
                assert got == want.token_ids
            continue
        # what it computed is a prefix of the run alone; nothing after its raise but the final
        assert want.token_ids[: len(got)] == got
        assert all(isinstance(e, StreamDelta) for e in caller.seen[: caller.first_raise])
        assert len(caller.seen) <= caller.first_raise + 2
        if caller.first_raise < len(caller.seen) - 1:  # raised on a delta: the final says so
            final = finals[0]
            assert final.finish_reason == "error"
            assert final.error.startswith(f"on_event raised {caller.exc.__name__}")
            assert want.token_ids[: len(final.token_ids)] == final.token_ids
        logged = [r for r in caplog.records if f"{request_id}'s " in r.getMessage()]
        assert len(logged) == 1 and "on_event raised" in logged[0].getMessage()
    assert llm.running
    assert not any(llm.cancel(request_id) for request_id in ids)  # none is live any more
    assert llm.generate(PROMPTS[0], _params(3))[0].token_ids == solo(0, 3).token_ids


def test_a_full_bounded_queue_fails_its_request_alone(llm, solo):
    """The issue's case: `on_event=bounded.put_nowait` on a queue nobody reads; another request
    in flight at the same time runs to its end."""
    bounded: queue.Queue = queue.Queue(maxsize=1)
    llm.submit(llm.render_prompt(PROMPTS[1]), _params(30), on_event=bounded.put_nowait)
    got: queue.Queue = queue.Queue()
    llm.submit(llm.render_prompt(PROMPTS[2]), _params(8), on_event=got.put, stream=False)
    out = got.get(timeout=60)
    assert out.token_ids == solo(2, 8).token_ids and out.finish_reason == "length"
    assert isinstance(bounded.get(timeout=1), StreamDelta) and bounded.empty()
    assert llm.running
    assert llm.generate(PROMPTS[3], _params(4))[0].token_ids == solo(3, 4).token_ids
    assert llm.cache_stats() is not None  # engine calls still answer


def test_running_is_false_before_a_failed_engine_answers_anyone(tiny_model, demo_text):
    """An engine that ends on a fatal fault says so before any caller hears of it: a callback
    handed the final error sees `running` already False, and later calls raise."""
    from ninfer.request import EngineError

    with _engine(tiny_model, demo_text) as llm:
        seen: queue.Queue = queue.Queue()

        def on_event(event) -> None:
            if isinstance(event, RequestOutput):
                seen.put((event, llm.running))

        def fatal(_engine) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        llm.engine.on_step = fatal
        llm.submit(llm.render_prompt(PROMPTS[0]), _params(4), on_event=on_event)
        out, running_then = seen.get(timeout=60)
        assert out.finish_reason == "error" and "illegal memory access" in out.error
        assert running_then is False
        assert llm.engine.join(10)
        assert not llm.running
        with pytest.raises(EngineError):
            llm.generate(PROMPTS[0], _params(2))
