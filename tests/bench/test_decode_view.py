"""The decode table of `ninfer bench`: both figures beside the bound, and a window too short
to measure printed as such (with its note), not as a number."""

from __future__ import annotations

from rich.console import Console

from ninfer.cli.bench_view import decode_notes, print_results


def row(batch: int, step: float | None, steps: int, note: str | None = None) -> dict:
    bound_tps = batch / 0.004
    return {
        "batch": batch, "prompt_tokens": 512, "step_bytes": 16e9, "bound_tokens_per_s": bound_tps,
        "bound_step_seconds": 0.004, "steady_max_tokens": 80, "steady_window_steps": steps,
        "steady_window_seconds": (step or 0.001) * steps, "steady_step_seconds": step,
        "steady_tokens_per_s": batch / step if step else None,
        "steady_fraction_of_bound": 0.004 / step if step else None, "steady_note": note,
        "e2e_max_tokens": 64, "e2e_decode_seconds": 0.5, "e2e_tokens_per_s": 123.0,
        "e2e_fraction_of_bound": 123.0 / bound_tps, "errors": [],
    }  # fmt: skip


def test_decode_table_and_notes():
    rows = [row(1, 0.005, 64), row(4, None, 3, "all-decoding window of 3 steps (< 8): too short")]
    results = {
        "meta": {"model": "m", "device": "cpu", "dtype": "float32", "kv_dtype": "float32",
                 "params": 1e6},
        "bounds": {"copy_bytes_per_s": 1e9, "matmul_flops_per_s": 1e9},
        "decode": {"rows": rows},
    }  # fmt: skip
    console = Console(width=120, record=True)
    print_results(console, results)
    text = console.export_text()
    expected = ["steady", "end to end", "bound", "5.0 ms", "80%", "64 steps", "200.00 tok/s",
                "123.00 tok/s", "too short", "3 steps", "batch 4: all-decoding window"]  # fmt: skip
    for words in expected:
        assert words in text, words
    assert decode_notes(rows) == ["decode batch 4: all-decoding window of 3 steps (< 8): too short"]
