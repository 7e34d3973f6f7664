"""`ninfer info`: the resolved engine configuration (design §14.2) and the memory ledger.

Builds the engine from the same flags as every other sub-command, then prints
`LLM.engine_config.describe()` (each value marked "flag" when given on the command line,
"derived" otherwise, with the name design.md uses where it differs), the weights (their
quantisation, the modules an FP8 model keeps dense, the bytes a decode token reads beside the
same in bf16) and `LLM.memory_ledger()`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from ninfer.cli.bench_view import flatten
from ninfer.cli.chat_view import human_bytes
from ninfer.cli.main import engine_kwargs, open_llm
from ninfer.cli.terminal import output_console
from ninfer.config import EngineConfig
from ninfer.page import PAGE_SIZE

# describe() key -> (LLM keyword it comes from, design §14.2 name)
SPEC_NAMES = {
    "host_cache_bytes": ("host_cache_mib", "host_cache_budget_bytes"),
    "device_snapshot_slots": ("device_snapshot_slots", "device_snapshot_slots"),
    "cache_taps_per_request": ("cache_taps_per_request", "max_new_taps"),
    "cache_tap_ladder": ("cache_tap_ladder", "tap_ladder_tokens"),
    "cache_tap_min_gap": ("cache_tap_min_gap", "tap_min_gap_tokens"),
    "kv_capacity_tokens": ("kv_capacity", "KV capacity (tokens)"),
    "kv_pages": ("kv_capacity", "KV capacity (pages of 64)"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def run(args: argparse.Namespace) -> int:
    with open_llm(args) as llm:
        config = dict(llm.engine_config.describe())
        ledger = llm.memory_ledger()
        weights = llm.weights_summary()
        costs = cost_estimates(llm.engine_config, llm.model_config)
    if args.json:
        out = {"config": config, "weights": weights, "memory_ledger": ledger, "cost_model": costs}
        print(json.dumps(out, indent=2, default=str))
        return 0
    console = output_console()
    console.print(config_table(config, set(engine_kwargs(args))))
    console.print(weights_table(weights))
    console.print(ledger_table(ledger))
    console.print(cost_table(costs, config["device_rates"]))
    return 0


COST_TOKENS = (1024, 8192, 32768)


def cost_estimates(cfg: EngineConfig, model_config) -> dict[str, dict[str, float]]:
    """The cache's cost model on this device (design §6.2, `ninfer.costs`): seconds to prefill
    a cold prompt of n tokens and to restore its blocks and one state image from Host."""
    from ninfer.engine.kv.state import engine_cost_model

    cost = engine_cost_model(cfg.cache, cfg.scheduling.prefill_chunk, model_config)
    out = {}
    for n in COST_TOKENS:
        nbytes = -(-n // PAGE_SIZE) * cfg.memory.kv_page_bytes + cfg.memory.state_image_bytes
        out[str(n)] = {
            "prefill_s": cost.prefill_seconds(0, n),
            "restore_s": cost.restore_seconds(nbytes),
        }
    return out


def cost_table(costs: dict, source: str) -> Table:
    table = Table(title=f"cost model (rates: {source})", header_style="bold")
    table.add_column("prompt tokens", justify="right")
    table.add_column("prefill", justify="right")
    table.add_column("Host restore", justify="right")
    for n, row in costs.items():
        table.add_row(n, f"{row['prefill_s'] * 1e3:.1f} ms", f"{row['restore_s'] * 1e3:.2f} ms")
    return table


def _value(name: str, value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and "bytes" in name:
        return human_bytes(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if name == "model" and value is None:
        return "demo (random weights)"
    return str(value)


def config_table(config: dict, given: set[str]) -> Table:
    """One row per resolved value; "flag" marks values given on the command line (the others
    are defaults or derived, design §14.2); byte counts are rounded here, exact in --json."""
    table = Table(title="engine configuration (resolved)", header_style="bold")
    table.add_column("setting", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("from")
    table.add_column("design name", style="dim", no_wrap=True)
    for name, value in config.items():
        keyword, spec = SPEC_NAMES.get(name, (name, ""))
        table.add_row(name, _value(name, value), "flag" if keyword in given else "",
                      spec if spec != name else "")  # fmt: skip
    return table


def weights_table(weights: dict) -> Table:
    """The weights' scheme, what stays dense (one kind per line), and their bytes."""
    table = Table(title="weights", header_style="bold")
    table.add_column("item", no_wrap=True)
    table.add_column("value", justify="right")
    table.add_row("quantization", weights["quantization"])
    if weights["dense_modules"]:
        table.add_row("kept dense", "\n".join(weights["dense_modules"]))
    table.add_row("weight bytes", human_bytes(weights["weight_bytes"]))
    table.add_row("read per decode token", human_bytes(weights["decode_weight_bytes_per_token"]))
    bf16 = weights["decode_weight_bytes_per_token_bf16"]
    table.add_row("read per decode token in bf16", human_bytes(bf16))
    return table


def ledger_table(ledger: dict) -> Table:
    table = Table(title="memory ledger", header_style="bold")
    table.add_column("item", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for name, value in flatten(ledger):
        table.add_row(name, _value(name, value))
    return table
