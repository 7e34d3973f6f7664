"""The wire's sampling parameters are `SamplingParams.validated`'s rules (one place): a set of
fields is accepted exactly when the engine's check accepts it, with the wire's own additions
only (a field left out takes the engine's default, top_k 0 is off, an integer seed is folded
into 63 bits, OpenAI's temperature is at most 2), and a refusal names its field."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ninfer.request import SamplingParams
from ninfer.server.errors import ApiError
from ninfer.server.wire import sampling_params

ODD = st.sampled_from([None, True, "x", float("nan"), float("inf"), [], 1e300])
NUMBER = st.one_of(st.floats(-1, 3), st.integers(-2, 3), ODD)
INT = st.one_of(st.integers(-3, 5), st.integers(-(2**70), 2**70), st.floats(0, 2), ODD)
STOP = st.one_of(st.none(), st.text(max_size=3), st.lists(st.text(max_size=2), max_size=3), ODD)
FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop")


def _engine_params(fields: dict) -> SamplingParams:
    """The engine's reading of the same fields (its rules, the wire's additions applied)."""
    given_ = {k: v for k, v in fields.items() if v is not None and k != "max_tokens"}
    if given_.get("top_k") == 0 and type(given_["top_k"]) is int:
        given_["top_k"] = -1
    if type(given_.get("seed")) is int:
        given_["seed"] &= 2**63 - 1
    if given_.get("stop") in ("", []):
        del given_["stop"]
    max_tokens = fields["max_tokens"] if fields["max_tokens"] is not None else 50
    params = SamplingParams(max_tokens=max_tokens, **given_).validated()
    if params.temperature > 2.0:
        raise ValueError("temperature must be in [0.0, 2.0]")
    return params


@settings(max_examples=300, deadline=None)
@example(max_tokens=None, temperature=None, top_p=None, top_k=None, min_p=None, seed=None, stop="")
@given(
    max_tokens=st.one_of(st.none(), INT),
    temperature=NUMBER,
    top_p=NUMBER,
    top_k=INT,
    min_p=NUMBER,
    seed=INT,
    stop=STOP,
)
def test_the_wire_accepts_what_the_engine_accepts(**fields):
    try:
        expected = _engine_params(fields)
    except ValueError as e:
        expected = e
    try:
        got = sampling_params(max_tokens_field="max_completion_tokens", remaining=50, **fields)
    except ApiError as e:
        assert isinstance(expected, ValueError), (fields, e)
        name = str(expected).split(" ", 1)[0]
        assert e.param == ("max_completion_tokens" if name == "max_tokens" else name)
        assert e.param in ("max_completion_tokens", *FIELDS)
        return
    assert got == expected
