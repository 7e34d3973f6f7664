"""`bench reuse` traces with one line per request (prompt tokens, the bound, cached tokens), to
find where reuse falls short of theoretical:

    python3 reuse_detail.py PRESET|demo DEVICE SCALE TRACES"""

import sys

from ninfer.bench import reuse
from ninfer.bench.suite import BenchSpec, load

preset, device, scale, traces = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
score = reuse._Replay._score


def noisy(self, out):
    prompt = list(out.prompt_token_ids)
    bound = max((reuse._lcp(prompt, s) for s in self.seen), default=0)
    u = out.usage
    print(
        f"req {self.requests:3} prompt {len(prompt):6} bound {min(bound, len(prompt) - 1):6} "
        f"cached {u.cached_tokens:6} prefix {u.cached_prefix_tokens:6}",
        flush=True,
    )
    return score(self, out)


reuse._Replay._score = noisy
spec = BenchSpec(parts=[], preset=None if preset == "demo" else preset, engine={"device": device})
loaded = load(spec)
r = reuse.bench_reuse(
    lambda: loaded.make_llm(spec.engine),
    loaded.model.config.vocab_size,
    seed=0,
    scale=scale,
    traces=tuple(traces.split(",")),
)
for row in [*r["rows"], r["overall"]]:
    print(
        f"{row['trace']:10} {row['requests']:3} {row['reused']:7} {row['theoretical']:7} "
        f"{row['ratio']:.4f}"
    )
