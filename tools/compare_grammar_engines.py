"""xgrammar against llguidance on our shapes: the compile time of the dozen schemas of
`ninfer.bench.schemas`, the per-token mask time along random walks (each step a random token
the mask allows), and how many finished walks are not valid against their schema. Both take
the same vocabulary (`Tokenizer.token_bytes`). Needs `pip install llguidance jsonschema`
(ninfer depends on xgrammar only). Prints one JSON object. A benchmark, not a test.

    python tools/compare_grammar_engines.py                    # the demo tokenizer
    python tools/compare_grammar_engines.py --tokenizer DIR    # a checkpoint's tokenizer
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import jsonschema
import torch

from ninfer.bench.schemas import SCHEMAS
from ninfer.schema_guard import enforceable_schema
from ninfer.tokenizer import Tokenizer


def _vocab(tok: Tokenizer) -> list[bytes]:
    return [b"" if i in tok.special_ids else b for i, b in enumerate(tok.token_bytes)]


class _Xgr:
    name = "xgrammar"

    def __init__(self, tok: Tokenizer, stop: list[int], guard: bool) -> None:
        import xgrammar as xgr

        self.xgr, self.guard = xgr, guard
        info = xgr.TokenizerInfo(_vocab(tok), xgr.VocabType.RAW, stop_token_ids=stop)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.n = len(tok.token_bytes)

    def compile(self, schema):
        s = enforceable_schema(schema) if self.guard else schema
        return self.compiler.compile_json_schema(json.dumps(s), any_whitespace=False)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, m, bits) -> None:
        m.fill_next_token_bitmask(bits, 0)

    def accept(self, m, t: int) -> bool:
        return m.accept_token(t)

    def done(self, m) -> bool:
        return m.is_terminated()


class _Llg:
    name = "llguidance"

    def __init__(self, tok: Tokenizer, stop: list[int]) -> None:
        import llguidance as llg
        import llguidance.torch as llt

        class Wrapped:
            eos_token_id, bos_token_id = stop[0], None
            tokens = _vocab(tok)
            special_token_ids = sorted(tok.special_ids)

            def __call__(self, s):
                return tok.encode(s.decode() if isinstance(s, bytes) else s)

        self.llg, self.llt = llg, llt
        self.tok = llg.LLTokenizer(llg.TokenizerWrapper(Wrapped()))
        self.n = len(tok.token_bytes)

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
        m = self.llg.LLMatcher(self.tok, grammar)
        if m.is_error():
            raise ValueError(m.get_error())
        return grammar

    def matcher(self, compiled):
        return self.llg.LLMatcher(self.tok, compiled)

    def mask(self, m, bits) -> None:
        self.llt.fill_next_token_bitmask(m, bits, 0)

    def accept(self, m, t: int) -> bool:
        return m.consume_token(t)

    def done(self, m) -> bool:
        return m.is_stopped()


def _walk(engine, compiled, tok: Tokenizer, rng: random.Random, steps: int, stop: list[int]):
    """(mask seconds per token, the text if the walk ended by a stop token, else None)."""
    m = engine.matcher(compiled)
    bits = torch.zeros((1, (engine.n + 31) // 32), dtype=torch.int32)
    shifts = torch.arange(32, dtype=torch.int32)
    times, ids = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.mask(m, bits)
        times.append(time.perf_counter() - t0)
        allowed = ((bits.unsqueeze(-1) >> shifts) & 1).view(-1)[: engine.n].nonzero().flatten()
        if len(allowed) == 0:
            return times, None
        pick = allowed.tolist()
        ends = [t for t in pick if t in stop]
        t = ends[0] if ends and rng.random() < 0.5 else rng.choice(pick)
        if not engine.accept(m, t):
            raise RuntimeError(f"{engine.name}: its own mask allowed a rejected token")
        if t in stop:
            return times, tok.decode(ids)
        ids.append(t)
    return times, None


def run(tok: Tokenizer, engine, seeds: int, steps: int, stop: list[int]) -> dict:
    compile_s, mask_s, refused, finished, invalid = [], [], [], 0, []
    for i, schema in enumerate(SCHEMAS):
        t0 = time.perf_counter()
        try:
            compiled = engine.compile(schema)
        except Exception as e:  # noqa: BLE001 - reported
            refused.append(f"schema {i}: {str(e)[:80]}")
            continue
        compile_s.append(time.perf_counter() - t0)
        for seed in range(seeds):
            times, text = _walk(engine, compiled, tok, random.Random(seed), steps, stop)
            mask_s += times
            if text is None:
                continue
            finished += 1
            try:
                jsonschema.validate(json.loads(text), schema)
            except (ValueError, jsonschema.ValidationError) as e:
                invalid.append(f"schema {i}: {text[:60]!r}: {str(e).splitlines()[0][:60]}")
    return {
        "compile_ms_total": 1e3 * sum(compile_s),
        "compile_ms_max": 1e3 * max(compile_s, default=0.0),
        "mask_us_median": 1e6 * statistics.median(mask_s),
        "mask_us_p99": 1e6 * sorted(mask_s)[int(0.99 * (len(mask_s) - 1))],
        "walks_finished": finished,
        "invalid_documents": invalid,
        "refused": refused,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", help="a tokenizer folder (default: the demo model's)")
    p.add_argument("--seeds", type=int, default=8, help="random walks per schema")
    p.add_argument("--steps", type=int, default=96, help="tokens per walk at most")
    args = p.parse_args()
    if args.tokenizer is None:
        from ninfer.demo import DEMO_DIR

        args.tokenizer = str(DEMO_DIR)
    tok = Tokenizer.from_dir(args.tokenizer)
    stop = list(tok.eos_token_ids)
    out = {"tokenizer": args.tokenizer, "vocab": len(tok.token_bytes), "schemas": len(SCHEMAS)}
    engines = [
        ("xgrammar (raw schemas)", _Xgr(tok, stop, guard=False)),
        ("xgrammar (ninfer: enforceable_schema)", _Xgr(tok, stop, guard=True)),
        ("llguidance", _Llg(tok, stop)),
    ]
    for label, engine in engines:
        out[label] = run(tok, engine, args.seeds, args.steps, stop)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
