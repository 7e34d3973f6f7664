"""`ninfer bench reuse` for chosen traces only:

    python3 reuse_traces.py PRESET|demo DEVICE SCALE TRACES

(TRACES comma-separated; scale 4 is what `bench reuse --prompt-tokens 8192` uses)."""

import json
import sys

from ninfer.bench.reuse import bench_reuse
from ninfer.bench.suite import BenchSpec, load

preset, device, scale, traces = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
spec = BenchSpec(parts=[], preset=None if preset == "demo" else preset, engine={"device": device})
loaded = load(spec)
r = bench_reuse(
    lambda: loaded.make_llm(spec.engine),
    loaded.model.config.vocab_size,
    seed=0,
    scale=scale,
    traces=tuple(traces.split(",")),
)
for row in [*r["rows"], r["overall"]]:
    name, n, reused, bound = row["trace"], row["requests"], row["reused"], row["theoretical"]
    print(f"{name:10} {n:3} {reused:7} {bound:7} {row['ratio']:.4f}")
print(json.dumps(r))
