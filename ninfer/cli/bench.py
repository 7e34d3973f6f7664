"""`ninfer bench [all | part,part,...]`: run `ninfer.bench` and print it. Parts: prefill, decode,
ttft, resume, restore, cache, reuse (reused vs theoretical prefix tokens on seeded traces:
agent echo, sub-agents, chat, edit, retry, noreply; sized by the largest --prompt-tokens, 2048
giving the sub-agents a 2000-token preamble).

Each figure is printed beside its physical bound (decode, both the steady state over the steps
in which every lane decodes and end to end: bytes per step over the measured memory bandwidth;
prefill: FLOPs over the measured matmul peak; restore: bytes over the measured copy bandwidth).
`--json` writes every number; `--profile DIR` writes Chrome traces;
`--compare-hf` adds transformers on the same weights; `--plot` draws TTFT per turn. With
`--quantization` the prefill and decode parts run again on the same shape unquantized (the
model's dtype), printed beside (`--no-baseline`: not). With
`--speculative mtp` the decode part also prints the draft acceptance and the tokens per verify
step; `--draft-acceptance A` accepts each draft position with probability A until the first
rejection, whatever the head proposes (random weights accept almost nothing).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from ninfer.bench import PARTS
from ninfer.bench.workloads import TRACES
from ninfer.cli.bench_view import print_results
from ninfer.cli.main import engine_kwargs
from ninfer.cli.terminal import err_console, output_console

PRESET_NAMES = ("0.8B", "2B", "4B", "9B", "27B", "35B-A3B")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in 0..1, got {text}")
    return value


def _parts(text: str) -> list[str]:
    if text == "all":
        return list(PARTS)
    parts = [x for x in text.split(",") if x]
    unknown = [x for x in parts if x not in PARTS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(
            f"unknown part {', '.join(unknown) or repr(text)} (choose from all, {', '.join(PARTS)})"
        )
    return [x for x in PARTS if x in parts]  # the suite's order


def _plot_path(text: str) -> Path:
    """--plot is checked before the run, not after it: matplotlib must be importable."""
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError(
            "needs matplotlib, which is not installed: pip install 'ninfer[plot]'"
        )
    return Path(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("part", nargs="?", default="all", type=_parts,
                   help=f"all, or one or more of {','.join(PARTS)} (comma-separated)")  # fmt: skip
    p.add_argument("--preset", choices=PRESET_NAMES, help="released shape, random weights")
    p.add_argument("--prompt-tokens", type=_ints, default=[512, 2048], help="e.g. 512,2048")
    p.add_argument("--decode-tokens", type=int, default=64,
                   help="decode: tokens per request end to end, and about the all-decoding "
                   "steps the steady-state figure is measured over")  # fmt: skip
    p.add_argument("--batch-sizes", type=_ints, default=[1, 4, 8], help="e.g. 1,4,8")
    p.add_argument("--draft-acceptance", type=_fraction, metavar="A",
                   help="decode with --speculative: accept each draft position with "
                   "probability A until the first rejection, whatever the head proposes "
                   "(random weights accept almost nothing)")  # fmt: skip
    p.add_argument("--turns", type=int, default=4, help="turns per session in the TTFT trace "
                   "(its shared prefix is about the largest --prompt-tokens)")  # fmt: skip
    p.add_argument("--trace", default="chat", help=" | ".join(TRACES))
    p.add_argument("--resume-new-tokens", type=int, default=64,
                   help="resume: new tokens per turn after each history")  # fmt: skip
    p.add_argument("--resume-history", type=_ints, default=None,
                   help="resume: history lengths (default: --prompt-tokens)")  # fmt: skip
    p.add_argument("--cache-prompt-tokens", type=int, help="cache bookkeeping: prompt length")
    p.add_argument("--cache-tree-blocks", type=int, help="cache bookkeeping: tree size")
    p.add_argument("--json", type=Path, help="write the results as JSON")
    p.add_argument("--profile", type=Path, metavar="DIR",
                   help="torch.profiler traces of extra untimed requests")  # fmt: skip
    p.add_argument("--compare-hf", action="store_true", help="also run transformers")
    p.add_argument("--no-baseline", action="store_true",
                   help="with --quantization: skip the prefill and decode of the same shape "
                   "unquantized that is otherwise printed beside")  # fmt: skip
    p.add_argument("--hf-max-prompt", type=int, default=8192,
                   help="transformers runs the prompt lengths up to this many tokens")  # fmt: skip
    p.add_argument(
        "--plot",
        type=_plot_path,
        metavar="PNG",
        help="draw TTFT per turn, cold vs cached (needs matplotlib: the plot extra)",
    )


def run(args: argparse.Namespace) -> int:
    from ninfer.bench.suite import BenchSpec, run_suite  # imports torch: not at --help time

    engine = engine_kwargs(args)
    if args.preset and "model" in engine:
        raise ValueError("give --preset or --model, not both")
    spec = BenchSpec(
        parts=args.part,
        preset=args.preset,
        model=engine.get("model"),
        prompt_tokens=args.prompt_tokens,
        decode_tokens=args.decode_tokens,
        batch_sizes=args.batch_sizes,
        turns=args.turns,
        trace=args.trace,
        seed=engine.get("seed", 0),
        engine=engine,
        profile_dir=args.profile,
        compare_hf=args.compare_hf,
        hf_max_prompt=args.hf_max_prompt,
        cache_prompt_tokens=args.cache_prompt_tokens,
        cache_tree_blocks=args.cache_tree_blocks,
        resume_new_tokens=args.resume_new_tokens,
        resume_histories=args.resume_history,
        draft_acceptance=args.draft_acceptance,
        baseline=not args.no_baseline,
    )
    console = output_console()
    # progress on stderr: stdout holds the tables alone, for a file or a pipe
    results = run_suite(spec, log=lambda m: err_console().print(f"[dim]{m}[/]"))
    print_results(console, results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
        console.print(f"results written to {args.json}")
    if args.plot and "ttft" in results:
        from ninfer.bench.plot import plot_ttft

        plot_ttft(results["ttft"], args.plot, title=results["meta"]["model"])
        console.print(f"plot written to {args.plot}")
    return 0
