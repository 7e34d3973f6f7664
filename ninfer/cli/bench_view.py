"""Tables for `ninfer bench`: every figure beside its bound (results come from ninfer.bench)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from rich.console import Console
from rich.table import Table


def rate(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def table(title: str, columns: list[str], rows: list[list[str]]) -> Table:
    assert len(set(columns)) == len(columns), f"two columns with one heading: {columns}"
    t = Table(title=title, header_style="bold", title_justify="left")
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row)
    return t


def header(r: dict) -> str:
    meta, b = r["meta"], r["bounds"]
    return (
        f"[bold]{meta['model']}[/] on {meta['device']} ({meta['dtype']}, KV {meta['kv_dtype']}), "
        f"{meta['params'] / 1e6:.1f} M params · copy {rate(b['copy_bytes_per_s'], 'B/s')} · "
        f"matmul {rate(b['matmul_flops_per_s'], 'FLOP/s')}"
    )


def prefill(rows: list[dict]) -> Table:
    cols = ["prompt", "time", "tokens/s", "achieved", "bound", "of bound"]
    return table(
        "prefill (bound: FLOPs / measured matmul peak)",
        cols,
        [
            [
                str(x["prompt_tokens"]),
                ms(x["seconds"]),
                rate(x["tokens_per_s"], "tok/s"),
                rate(x["flops_per_s"], "FLOP/s"),
                ms(x["bound_seconds"]),
                pct(x["fraction_of_bound"]),
            ]
            for x in rows
        ],  # fmt: skip
    )


def decode(rows: list[dict]) -> Table:
    """Three lines per batch size: the bound, the steady state, end to end (with speculation a
    fourth: tokens per verify step and the acceptance; the steady state's time is then per
    token, a verify step's beside its tokens per step)."""
    t = table(
        "decode (bound: weights + KV + state bytes per step / measured memory bandwidth; "
        "steady: over the steps in which every lane decodes; end to end: generate(), the "
        "staggered start included)",
        ["batch", "figure", "tokens/s", "of bound", "step", "over"],
        [],
    )
    t.columns[1].justify = "left"
    for x in rows:
        step = x["steady_step_seconds"]  # per token of a lane (one step each without drafts)
        spec = x.get("spec_tokens_per_step") is not None
        t.add_row(str(x["batch"]), "bound", rate(x["bound_tokens_per_s"], "tok/s"), "",
                  ms(x["bound_step_seconds"]), f"{rate(x['step_bytes'], 'B')}/step")  # fmt: skip
        per = "/tok" if spec else ""
        t.add_row("", "steady", rate(x["steady_tokens_per_s"], "tok/s") if step else "too short",
                  pct(x["steady_fraction_of_bound"]), ms(step) + per if step else "-",
                  f"{x['steady_window_steps']} {'tokens' if spec else 'steps'}")  # fmt: skip
        t.add_row("", "end to end", rate(x["e2e_tokens_per_s"], "tok/s"),
                  pct(x["e2e_fraction_of_bound"]), "", f"{x['e2e_max_tokens']} tok/lane",
                  end_section=not spec)  # fmt: skip
        if spec:
            drafts = x.get("spec_draft_acceptance")
            source = "MTP head" if drafts is None else f"controlled draft a={drafts:g}"
            verify = ms(step * x["spec_tokens_per_step"]) if step else ""
            t.add_row("", "speculative", f"{x['spec_tokens_per_step']:.2f} tok/step",
                      pct(x["spec_acceptance"]), verify, source, end_section=True)  # fmt: skip
    return t


def decode_notes(rows: list[dict]) -> list[str]:
    """Why a row has no steady-state figure, and its request errors."""
    lines = []
    for x in rows:
        if x.get("steady_note"):
            lines.append(f"decode batch {x['batch']}: {x['steady_note']}")
        lines += [f"decode batch {x['batch']}: error: {e}" for e in x.get("errors", [])]
    return lines


def baseline(r: dict) -> Table:
    """The quantized figures beside the same shape's unquantized ones (`--quantization`: the
    suite's `baseline`), each beside its own bound: prefill time, decode steady tok/s."""
    base, quant = r["baseline"], r["meta"]["engine"].get("quantization")
    dtype = base["meta"]["dtype"]
    mine = {x["prompt_tokens"]: x for x in r.get("prefill", {}).get("rows", [])}
    rows = []
    for x in base.get("prefill", {}).get("rows", []):
        q = mine.get(x["prompt_tokens"])
        rows.append([
            f"prefill {x['prompt_tokens']}",
            f"{ms(q['seconds'])} ({pct(q['fraction_of_bound'])})" if q else "-",
            f"{ms(x['seconds'])} ({pct(x['fraction_of_bound'])})",
            _times(x.get("quantized_speedup")),
        ])  # fmt: skip
    mine = {x["batch"]: x for x in r.get("decode", {}).get("rows", [])}
    for x in base.get("decode", {}).get("rows", []):
        rows.append([f"decode batch {x['batch']}", _steady(mine.get(x["batch"])), _steady(x),
                     _times(x.get("quantized_speedup"))])  # fmt: skip
    return table(
        f"{quant} beside {dtype} (same shape and settings; each of its own bound)",
        ["", quant, dtype, f"{quant} is"],
        rows,
    )


def _steady(y: dict | None) -> str:
    """A decode row's steady tok/s and its fraction of the bound ("-": none)."""
    if not y or not y.get("steady_tokens_per_s"):
        return "-"
    return f"{rate(y['steady_tokens_per_s'], 'tok/s')} ({pct(y['steady_fraction_of_bound'])})"


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def hf(h: dict) -> Table:
    def times(x: dict) -> str:
        s = x.get("ninfer_speedup")
        return "-" if s is None else f"{s:.1f}x"

    rows = [
        [f"prefill {x['prompt_tokens']}", rate(x["tokens_per_s"], "tok/s"), times(x)]
        for x in h["prefill"]
    ]
    rows += [
        [f"decode batch {x['batch']}", rate(x["tokens_per_s"], "tok/s"), times(x)]
        for x in h["decode"]
    ]
    g = h["greedy"]
    rows.append(
        ["greedy agreement with ninfer", f"{g['agreeing_prefix']}/{g['tokens']} tokens", ""]
    )
    return table("transformers, same weights", ["", "transformers", "ninfer is"], rows)


def ttft(t: dict) -> Table:
    """Every turn, as the plot shows them: a turn that reused nothing still pays for the
    snapshots the cached run takes, and its speedup says what they cost."""
    cols = ["turn", "prompt", "cached tokens", "TTFT cold", "TTFT cached", "speedup"]
    turns = t["turns"]
    return table(
        f"TTFT per turn, cold vs cached (cache hit rate {t['summary']['cache_hit_rate']:.0%})",
        cols,
        [
            [
                f"{x['session']} #{x['turn']}",
                str(x["prompt_tokens"]),
                str(x["cached_tokens"]),
                ms(x["ttft_cold_s"]),
                ms(x["ttft_cached_s"]),
                "-" if x["speedup"] is None else f"{x['speedup']:.2f}x",
            ]
            for x in turns
        ],  # fmt: skip
    )


def resume(r: dict) -> Table:
    cols = ["history", "round", "cached tokens", "TTFT cold", "TTFT cached", "speedup",
            "restored", "restore time", "restore rate", "link", "of link", "overlap"]  # fmt: skip
    rows = []
    for x in r["rows"]:
        o = x.get("overlap") or {}
        overlap = "-"
        if o:
            overlap = f"{o['kernel_ms_during_restore']:.1f} of {o['window_ms']:.1f} ms"
        rows.append([
            str(x["history_tokens"]),
            str(x["round"]),
            str(x["cached_tokens"]),
            ms(x["ttft_cold_s"]),
            ms(x["ttft_cached_s"]),
            f"{x['speedup']:.1f}x",
            rate(x["restored_host_bytes"], "B"),
            ms(x["restore_s"]) if x["restore_s"] else "-",
            rate(x["restore_bytes_per_s"], "B/s") if x["restore_bytes_per_s"] else "-",
            rate(x["link_bytes_per_s"], "B/s"),
            pct(x["restore_of_link"]),
            overlap,
        ])  # fmt: skip
    return table(
        "resume from the Host tier: TTFT cold vs cached; restore rate (bound: measured pinned "
        "link); overlap: compute kernels inside the restore window (profiled round)",
        cols,
        rows,
    )


def restore(r: dict) -> Table:
    cols = ["copy", "bytes", "time", "rate", "bound", "of bound"]
    return table(
        "restore and tap copies (bound: measured copy bandwidth; >100%: cache-resident sizes)",
        cols,
        [
            [
                name,
                rate(x["bytes"], "B"),
                f"{x['seconds'] * 1e6:.0f} us",
                rate(x["bytes_per_s"], "B/s"),
                rate(x["bound_bytes_per_s"], "B/s"),
                pct(x["fraction_of_bound"]),
            ]
            for name, x in r.items()
            if "bytes_per_s" in x
        ],  # fmt: skip
    )


def flatten(d: dict, prefix: str = "") -> Iterator[tuple[str, object]]:
    """(dotted key, leaf value) pairs of a nested dict."""
    for k, v in d.items():
        if isinstance(v, dict):
            yield from flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def cache(c: dict) -> Table:
    rows = [[k, v if isinstance(v, str) else json.dumps(v)] for k, v in flatten(c)]
    return table("cache bookkeeping (ninfer.bench.cache_index)", ["", "value"], rows)


def reuse(r: dict) -> Table:
    rows = [
        [x["trace"], str(x["requests"]), str(x["reused"]), str(x["theoretical"]),
         f"{x['ratio']:.3f}"]
        for x in [*r["rows"], r["overall"]]
    ]  # fmt: skip
    head = ["trace", "requests", "reused tokens", "theoretical", "reused / theoretical"]
    return table("prefix reuse on seeded traces (ninfer.bench.reuse)", head, rows)


def profile(name: str, prof: dict) -> Table:
    rows = [[e["name"][:60], f"{e['self_us'] / 1e3:.2f} ms", str(e["calls"])] for e in prof["top"]]
    return table(f"{name}: top kernels ({prof['trace']})", ["kernel", "self time", "calls"], rows)


def print_results(console: Console, r: dict) -> None:
    console.print(header(r))
    for name, draw in (("prefill", prefill), ("decode", decode)):
        if name in r:
            console.print(draw(r[name]["rows"]))
    for line in decode_notes(r.get("decode", {}).get("rows", [])):
        console.print(f"[yellow]{line}[/]", highlight=False)
    if "baseline" in r:
        console.print(baseline(r))
        for line in decode_notes(r["baseline"].get("decode", {}).get("rows", [])):
            console.print(f"[yellow]baseline {line}[/]", highlight=False)
    parts = (
        ("hf", hf),
        ("ttft", ttft),
        ("resume", resume),
        ("restore", restore),
        ("cache", cache),
        ("reuse", reuse),
    )
    for name, draw in parts:
        if name in r:
            console.print(draw(r[name]))
    for name in ("prefill", "decode", "restore"):
        if "profile" in r.get(name, {}):
            console.print(profile(name, r[name]["profile"]))
