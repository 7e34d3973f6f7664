"""Structured outputs: a request's grammar (JSON schema, regex, choice, EBNF grammar, structural
tag) compiled for the tokenizer, and per request the matcher that says which tokens may come
next, as a bitmask over the vocabulary (xgrammar, the engine vLLM and SGLang use by default).

    Grammars (one per LLM)  --compile(spec)-->  Grammar (shared, thread-safe)
    Grammar.start(prompt)   -->  Matcher (one per request: accept(token), the next mask)
    token_mask(matchers)    -->  TokenMask (the sampling rows it constrains + their bitmask)

Reasoning: when the prompt opens a `<think>` block it does not close (Qwen3.5's generation
prompt with thinking on), the grammar applies from the token after the generated `</think>`;
the reasoning stays free (as vLLM's reasoning parser does). EOS is allowed only where the
grammar accepts; once the grammar has accepted EOS it constrains nothing more. A thinking
budget (`SamplingParams.thinking_token_budget`, with or without a grammar) bounds that free
part: once the reply has spent the budget inside the open block, the next token's mask is
`</think>` alone. A request with a budget and no grammar never loads xgrammar.

xgrammar is imported at the first compile: an engine that serves no structured request never
loads it. This module knows nothing about the engine; `ninfer.sampling.apply_token_mask`
applies a `TokenMask` to the logits.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass

import torch

from ninfer.request import StructuredOutputsParams
from ninfer.schema_guard import Unenforceable, enforceable_schema, length_pattern

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# xgrammar's C++ errors start with "[time] file.cc:line: " and sometimes a failed check's text
_ERROR_HEAD = re.compile(r"^\[[\d:. ]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


@dataclass(slots=True)
class TokenMask:
    """Allowed tokens of some sampling rows: `rows[i]` (an index among the step's sampling
    rows) may sample token t iff bit t % 32 of `bits[i, t // 32]` is set (int32, CPU)."""

    rows: list[int]
    bits: torch.Tensor


def _error_text(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return _ERROR_HEAD.sub("", text)


class Grammars:
    """Compiles `StructuredOutputsParams` for one tokenizer and one logits width."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: tuple[int, ...]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_ids = tuple(stop_ids)
        self._compiler = None
        self._lock = threading.Lock()
        think = tokenizer.token_to_id(THINK_OPEN), tokenizer.token_to_id(THINK_CLOSE)
        self._think = think if None not in think else None

    def _get_compiler(self):
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                special = self._tokenizer.special_ids
                vocab = [
                    b"" if i in special else b for i, b in enumerate(self._tokenizer.token_bytes)
                ]
                info = xgr.TokenizerInfo(
                    vocab,
                    xgr.VocabType.RAW,
                    vocab_size=self._vocab_size,
                    stop_token_ids=list(self._stop_ids),
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=2)
            return self._compiler

    def compile(
        self,
        spec: StructuredOutputsParams | None,
        field: str = "structured_outputs",
        thinking_budget: int | None = None,
    ) -> Grammar:
        """The compiled grammar of `spec` (validated; None: no grammar) with the reasoning
        budget `thinking_budget` (None: none); ValueError naming `field.<kind>` when the engine
        cannot compile it, or `thinking_token_budget` when the tokenizer has no `<think>` /
        `</think>` tokens. Compiled grammars are cached by their text."""
        if thinking_budget is not None and self._think is None:
            raise ValueError(
                f"thinking_token_budget: the tokenizer has no {THINK_OPEN} / {THINK_CLOSE} tokens"
            )
        compiled = None if spec is None else self._compile(spec, field)
        return Grammar(compiled, self._think, thinking_budget)

    def _compile(self, spec: StructuredOutputsParams, field: str):
        kind, value = spec.kind()
        compiler = self._get_compiler()
        try:
            if kind == "json":
                schema = enforceable_schema(json.loads(value) if isinstance(value, str) else value)
                compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            elif kind == "json_object":  # any JSON object
                compiled = compiler.compile_json_schema(
                    '{"type": "object"}', any_whitespace=False, strict_mode=False
                )
            elif kind == "regex":
                compiled = compiler.compile_regex(value)
            elif kind == "choice":
                alts = " | ".join(json.dumps(c) for c in value)
                compiled = compiler.compile_grammar(f"root ::= {alts}")
            elif kind == "grammar":
                compiled = compiler.compile_grammar(value)
            else:  # structural_tag
                text = value if isinstance(value, str) else json.dumps(value)
                compiled = compiler.compile_structural_tag(text)
        except Unenforceable as e:
            raise ValueError(f"{field}.{kind}: not supported: {e}") from None
        except Exception as e:  # xgrammar raises RuntimeError / ValueError / its own errors
            raise ValueError(f"{field}.{kind}: cannot compile: {_error_text(e)}") from None
        return compiled


def _trimmed_values(original: dict, checked: dict) -> dict:
    """`checked` (a tool's parameters, through `enforceable_schema`) with each length-bounded
    string parameter neither beginning nor ending with a space. In the XML format a value is
    raw text that the grammar lets whitespace pad (the format's, not the value's), so the
    parser reads such a value without it (`tool_calls.convert_value`): an edge space would be
    lost, and a value of `minLength` with it would come out short."""
    props = checked.get("properties")
    if not isinstance(props, dict):
        return checked
    given = original.get("properties") or {}
    out = dict(props)
    for key, prop in props.items():
        raw = given.get(key)
        if isinstance(raw, dict) and ("minLength" in raw or "maxLength" in raw):
            bounds = raw.get("minLength", 0), raw.get("maxLength")
            out[key] = {**prop, "pattern": length_pattern(*bounds, trim=True)}
    return {**checked, "properties": out}


def tool_call_tag(tools: list[dict], choice: str, parallel: bool = True) -> dict:
    """The structural tag (JSON data) that makes a reply a tool call in Qwen3.5's XML format
    (`<tool_call>`, `<function=NAME>`, `<parameter=KEY>` VALUE `</parameter>` ...) whose
    arguments follow the tool's parameters schema. `tools`: OpenAI-form function tools;
    `choice`: "required" (calls of any of them, nothing else; one when not `parallel`) or a
    tool's name (one call of that tool). The reasoning before it is left to
    `Grammar.start` (free until `</think>`).
    ValueError naming `tools[j]` for a parameters schema the grammar would not enforce."""
    import xgrammar as xgr

    checked = []
    for j, tool in enumerate(tools):
        fn = dict(tool["function"])
        try:
            params = fn.get("parameters") or {"type": "object"}
            fn["parameters"] = _trimmed_values(params, enforceable_schema(params))
        except Unenforceable as e:
            raise ValueError(f"tools[{j}]: parameters not supported: {e}") from None
        checked.append({"type": "function", "function": fn})

    def forced(name: str) -> dict:
        tag = xgr.get_builtin_structural_tag(
            "qwen_3_5",
            tools=checked,
            tool_choice={"type": "function", "function": {"name": name}},
            reasoning=False,
            max_whitespace_cnt=2,
        )
        return json.loads(tag.model_dump_json())["format"]

    if choice != "required":
        return {"type": "structural_tag", "format": forced(choice)}
    # "required": the reply is tool calls only (one, or several separated by a newline as the
    # template renders them), not text that may or may not lead to one
    names = [t["function"]["name"] for t in checked]
    calls = {"type": "tags_with_separator", "tags": [forced(n) for n in names], "separator": "\n"}
    calls.update(at_least_one=True, stop_after_first=not parallel)
    return {"type": "structural_tag", "format": calls}


class Grammar:
    """A compiled grammar (or none) and a reasoning budget (or none); `start` makes a
    request's matcher (any thread)."""

    __slots__ = ("_compiled", "_think", "_budget")

    def __init__(self, compiled, think: tuple[int, int] | None, budget: int | None = None) -> None:
        self._compiled = compiled  # xgrammar's CompiledGrammar, or None (a budget alone)
        self._think = think
        self._budget = budget

    def start(self, prompt: list[int]) -> Matcher:
        """A fresh matcher for a request with this prompt: while the prompt's `<think>` block
        is open, it waits for `</think>` (forcing it once the budget is spent)."""
        matcher = None
        if self._compiled is not None:
            import xgrammar as xgr

            matcher = xgr.GrammarMatcher(self._compiled)
        close = self._think[1] if think_open(prompt, self._think) else None
        return Matcher(matcher, close, self._budget)


def think_open(prompt: list[int], think: tuple[int, int] | None) -> bool:
    """Whether `prompt` leaves a reasoning block open: its last `<think>` (`think[0]`) comes
    after its last `</think>` (`think[1]`). False without think tokens."""
    if think is None:
        return False
    return _last_index(prompt, think[0]) > _last_index(prompt, think[1])


def _last_index(tokens: list[int], token: int) -> int:
    for i in range(len(tokens) - 1, -1, -1):
        if tokens[i] == token:
            return i
    return -1


class Matcher:
    """One request's constraint state, advanced by each committed token (engine thread): the
    reasoning block the prompt left open (free, or `</think>` forced once `budget` tokens were
    spent in it), then the grammar (if any) from the token after `</think>`."""

    __slots__ = ("_m", "_close", "_budget", "_spent")

    def __init__(self, matcher, close: int | None, budget: int | None = None) -> None:
        self._m = matcher  # xgrammar's GrammarMatcher, or None (a budget alone)
        self._close = close  # the `</think>` id while the reasoning block is open, else None
        self._budget = budget
        self._spent = 0  # tokens generated inside the open block

    def _forcing(self, pending: int = 0) -> bool:
        """Whether the open block's budget forces `</think>`, `pending` tokens from now."""
        return self._budget is not None and self._spent + pending >= self._budget

    @property
    def active(self) -> bool:
        """Whether the matcher constrains the next token."""
        if self._close is not None:
            return self._forcing()
        return self._m is not None and not self._m.is_terminated()

    def may_constrain(self, pending: int) -> bool:
        """Whether the token after `pending` tokens sampled but not accepted yet may be
        constrained (False: it is surely free, whatever those tokens are)."""
        if self._close is not None:
            return self._m is not None or self._forcing(pending)
        return self.active

    def accept(self, token: int) -> None:
        """Advance by a committed token; ValueError when the grammar rejects it, or when the
        spent budget forced `</think>` and the token is another."""
        forced = self._close is not None and self._forcing()
        if self._advance(token) is None:
            if forced:
                raise ValueError(f"thinking budget: token {token} where </think> was forced")
            raise ValueError(f"structured output: the grammar rejects token {token}")

    def _advance(self, token: int) -> int | None:
        """Advance by `token`: None where the constraint rejects it (nothing changed), else
        the steps the grammar's matcher took (0 or 1)."""
        if self._close is not None:
            if token == self._close:
                self._close = None
            elif self._forcing():
                return None
            else:
                self._spent += 1
            return 0
        if self._m is None or self._m.is_terminated():
            return 0
        return 1 if self._m.accept_token(token) else None

    def fill_drafts(
        self, drafts: list[int], bits: torch.Tensor, forced: list[int] | None = None
    ) -> bool:
        """Speculative decoding: into bits[j] (j = 0 .. len(drafts); int32 [len(drafts) + 1,
        W]) the allowed set of the token after drafts[:j], as if those had been accepted; all
        ones where nothing constrains it, and past the first draft the constraint rejects (a
        verification stops there: that draft is not allowed at its position). With `forced`
        (a list), a position where the constraint allows one token only gets that token as
        its draft where the draft was another (written into `drafts`, its index appended to
        `forced`): the target can yield nothing else there. The matcher is left as it was
        (its grammar rolled back). Returns whether any row constrains."""
        close, spent = self._close, self._spent
        advanced = 0  # steps the grammar's matcher took here: rolled back at the end
        bits.fill_(-1)
        constrained = False
        try:
            for j, token in enumerate([*drafts, None]):
                active = self.active
                if active:
                    self.fill(bits, j)
                    constrained = True
                    only = None if token is None or forced is None else _only(bits[j])
                    if only is not None and only != token:
                        drafts[j] = token = only
                        forced.append(j)
                if token is None or (active and not _allows(bits[j], token)):
                    break  # (the grammar's matcher is not asked: it logs each rejection)
                step = self._advance(token)
                if step is None:
                    break
                advanced += step
        finally:
            if advanced:
                self._m.rollback(advanced)
            self._close, self._spent = close, spent
        return constrained

    def fill(self, bits: torch.Tensor, row: int) -> None:
        """Write the next token's allowed set into `bits[row]` (only when `active`)."""
        if self._close is None:
            self._m.fill_next_token_bitmask(bits, row)
            return
        bits[row].zero_()
        word, bit = divmod(self._close, 32)
        bits[row, word] = (1 << bit) - (1 << 32 if bit == 31 else 0)  # int32: bit 31 is the sign


def _allows(bits: torch.Tensor, token: int) -> bool:
    """Whether the bitmask row `bits` (int32 [W]) allows `token`."""
    word, bit = divmod(token, 32)
    return 0 <= word < bits.shape[0] and (int(bits[word]) >> bit) & 1 == 1


def _only(bits: torch.Tensor) -> int | None:
    """The one token the bitmask row `bits` (int32 [W]) allows, or None (none or several)."""
    words = bits.nonzero()
    if words.numel() != 1:
        return None
    word = int(words[0])
    value = int(bits[word]) & 0xFFFFFFFF
    if value & (value - 1):
        return None
    return word * 32 + value.bit_length() - 1


def token_mask(matchers: list[Matcher | None], vocab_size: int, pin: bool) -> TokenMask | None:
    """The bitmask of the sampling rows whose matcher constrains their next token (None: no
    row is constrained). `pin`: page-locked, for a non-blocking copy to the GPU."""
    rows = [i for i, m in enumerate(matchers) if m is not None and m.active]
    if not rows:
        return None
    bits = torch.empty((len(rows), (vocab_size + 31) // 32), dtype=torch.int32, pin_memory=pin)
    for k, i in enumerate(rows):
        matchers[i].fill(bits, k)
    return TokenMask(rows, bits)


def may_constrain(matchers: list[Matcher | None], pending: int) -> bool:
    """Whether any row's token after `pending` tokens not accepted yet may be constrained: the
    step launched before those tokens are read must then wait for them to compute its mask."""
    return any(m is not None and m.may_constrain(pending) for m in matchers)
