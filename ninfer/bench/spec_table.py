"""MTP speculative decode beside plain decode: ms per token per context, batch size and draft
acceptance, one model, one command. A benchmark, not a test.

Plain decode first (an engine without speculation), then the speculative engine (K draft
tokens) at each controlled acceptance a (`bench.speculative.controlled_acceptance`: each draft
position accepted with probability a until the first rejection, whatever random weights'
head proposes), on the same weights; each row: steady ms per token (the time between a
lane's streamed tokens while every lane decodes), tokens per verify step, and the speedup
over plain decode, beside plain decode's bandwidth bound (weights + KV + state bytes per step
over the measured copy rate: one token per step). Prints a table; `--json` writes every row.

    python -m ninfer.bench.spec_table                                  # demo model, CPU
    python -m ninfer.bench.spec_table --preset 27B --device cuda --contexts 1024,32768 \\
        --batch-sizes 1,4,8 --acceptance 0.5,0.7,0.9
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from ninfer import probe
from ninfer.bench.suite import BenchSpec, load, loaded_param_counts
from ninfer.bench.throughput import bench_decode
from ninfer.cli.main import add_engine_flags, engine_kwargs
from ninfer.config import DEFAULT_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS
from ninfer.models.presets import PRESETS

SPEC_KEYS = ("speculative", "num_speculative_tokens", "draft_vocab", "draft_quantization")


def _floats(text: str) -> list[float]:
    values = [float(x) for x in text.split(",") if x]
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: fractions in [0, 1], comma-separated")
    return values


def _ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: positive integers, comma-separated")
    return values


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=tuple(PRESETS), help="released shape, random weights")
    p.add_argument("--contexts", type=_ints, default=[1024], help="prompt tokens, e.g. 1024,32768")
    p.add_argument("--batch-sizes", type=_ints, default=[1, 4, 8], help="e.g. 1,4,8")
    p.add_argument("--acceptance", type=_floats, default=[0.5, 0.7, 0.9], help="e.g. 0.5,0.7,0.9")
    p.add_argument("--draft-tokens", type=int, default=DEFAULT_SPECULATIVE_TOKENS,
                   help=f"K, 1..{MAX_SPECULATIVE_TOKENS}")  # fmt: skip
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens per lane")
    p.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="every request asks for N logprobs a token (MTP: verify rows then "
                   "accepted on the host, as with a grammar)")  # fmt: skip
    p.add_argument("--json", help="write every row here")
    add_engine_flags(p)
    args = p.parse_args(argv)
    if args.logprobs is not None and args.logprobs < 0:
        p.error(f"--logprobs: 0 or more, got {args.logprobs}")
    if not 1 <= args.draft_tokens <= MAX_SPECULATIVE_TOKENS:
        p.error(f"--draft-tokens: 1..{MAX_SPECULATIVE_TOKENS}, got {args.draft_tokens}")
    return args


def measure(loaded, engine: dict, args, machine: dict) -> list[dict]:
    """Every row: plain decode per (context, batch), then speculative decode per (context,
    batch, acceptance), each engine built, run and closed in turn."""
    cfg, counts = loaded.model.config, loaded_param_counts(loaded)
    sizes = (loaded.dtype.itemsize, loaded.kv_dtype.itemsize)
    plain = {k: v for k, v in engine.items() if k not in SPEC_KEYS}
    spec = plain | {"speculative": "mtp", "num_speculative_tokens": args.draft_tokens,
                    "draft_vocab": engine.get("draft_vocab"),
                    "draft_quantization": engine.get("draft_quantization")}  # fmt: skip
    lanes = max(args.batch_sizes)
    rows = []
    for label, options, accepts in (("plain", plain, [None]), ("mtp", spec, args.acceptance)):
        with loaded.make_llm(options, max_concurrency=lanes) as llm:
            for context in args.contexts:
                for a in accepts:
                    got = bench_decode(
                        llm, cfg, counts, context, args.decode_tokens, args.batch_sizes,
                        machine, *sizes, draft_acceptance=a, logprobs=args.logprobs,
                    )  # fmt: skip
                    for r in got:
                        rows.append({"engine": label, "context": context, **r})
                        print(_row_line(rows[-1]), flush=True)  # a time box keeps these
    return rows


def _row_line(r: dict) -> str:
    """One measured row as a plain line, printed as soon as it is measured."""
    step, a = r.get("steady_step_seconds"), r.get("spec_draft_acceptance")
    per_step = r.get("spec_tokens_per_step")
    return (
        f"row: context={r['context']} batch={r['batch']} engine={r['engine']}"
        f" a={'-' if a is None else f'{a:g}'}"
        f" ms/token={'-' if not step else f'{step * 1e3:.2f}'}"
        f" tok/step={'-' if per_step is None else f'{per_step:.2f}'}"
    )


def table(rows: list[dict]) -> Table:
    """Per (context, batch): plain decode, then each acceptance's ms per token and speedup."""
    t = Table(title="MTP speculative decode against plain decode (steady state)")
    for name in ("context", "batch", "engine", "a", "ms/token", "tok/step", "speedup",
                 "of plain bound"):  # fmt: skip
        t.add_column(name, justify="right")
    base = {(r["context"], r["batch"]): r for r in rows if r["engine"] == "plain"}
    for r in rows:
        step = r.get("steady_step_seconds")
        plain = base.get((r["context"], r["batch"]), {}).get("steady_step_seconds")
        a = r.get("spec_draft_acceptance")
        per_step = r.get("spec_tokens_per_step")
        fraction = r.get("steady_fraction_of_bound")
        t.add_row(
            str(r["context"]), str(r["batch"]), r["engine"],
            "" if a is None else f"{a:g}",
            "-" if not step else f"{step * 1e3:.2f}",
            "" if per_step is None else f"{per_step:.2f}",
            f"{plain / step:.2f}x" if step and plain else "-",
            "-" if fraction is None else f"{fraction:.2f}",
        )  # fmt: skip
    return t


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    # "speculative" makes `load` build (or read) the MTP head; each engine sets its own
    engine = engine_kwargs(args) | {"speculative": "mtp"}
    loaded = load(BenchSpec(parts=[], preset=args.preset, model=engine.get("model"), engine=engine))
    machine = probe.machine_bounds(loaded.device, loaded.dtype)
    rows = measure(loaded, {k: v for k, v in engine.items() if k != "model"}, args, machine)
    Console().print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": loaded.label, "bounds": machine, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
