"""What `ninfer chat` draws: reasoning split from the answer, the per-turn line, the cache table.

Knows nothing about the engine beyond the plain data it returns (RequestOutput, CacheStats).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Group
from rich.table import Table

OPEN, CLOSE = "<think>", "</think>"


class ReasoningSplitter:
    """Splits streamed text into reasoning (`<think>...</think>`) and answer segments.

    A tag may arrive split across deltas: the longest tail that could start the awaited tag is
    held back until the next delta (or `flush`). With thinking enabled the chat template already
    opened `<think>`, so the reply starts inside reasoning.
    """

    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking
        self.reasoning = ""
        self.answer = ""
        self._pending = ""

    def feed(self, text: str) -> list[tuple[str, bool]]:
        """Returns (segment, is_reasoning) pairs ready to draw."""
        buf, out = self._pending + text, []
        while (i := buf.find(tag := CLOSE if self.thinking else OPEN)) >= 0:
            self._emit(buf[:i], out)
            buf, self.thinking = buf[i + len(tag) :], not self.thinking
        keep = next((k for k in range(len(tag) - 1, 0, -1) if buf.endswith(tag[:k])), 0)
        self._emit(buf[: len(buf) - keep], out)
        self._pending = buf[len(buf) - keep :]
        return out

    def flush(self) -> list[tuple[str, bool]]:
        out: list[tuple[str, bool]] = []
        self._emit(self._pending, out)
        self._pending = ""
        return out

    def _emit(self, text: str, out: list[tuple[str, bool]]) -> None:
        if self.thinking:
            self.reasoning += text
        else:
            if not self.answer:  # the template puts blank lines between reasoning and answer
                text = text.lstrip("\n")
            self.answer += text
        if text:
            out.append((text, self.thinking))

    def message(self) -> dict[str, str]:
        """The assistant message to keep in the history."""
        msg = {"role": "assistant", "content": self.answer.strip()}
        if self.reasoning.strip():
            msg["reasoning_content"] = self.reasoning.strip()
        return msg


def turn_line(out: Any) -> str:
    """The compact line after a finished turn, from the final RequestOutput."""
    u, m = out.usage, out.metrics
    return (
        f"prompt {u.prompt_tokens} tok · cached {u.cached_tokens} · "
        f"TTFT {m.ttft_s * 1e3:.0f} ms · decode {m.decode_tokens_per_s:.1f} tok/s · "
        f"{u.completion_tokens} tok ({out.finish_reason})"
    )


def stopped_line(n_tokens: int, ttft_s: float | None) -> str:
    """The line after a reply stopped with Ctrl+C (no final output: measured here)."""
    ttft = "-" if ttft_s is None else f"{ttft_s * 1e3:.0f} ms"
    return f"stopped after {n_tokens} tok · TTFT {ttft} · partial reply kept"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _fmt(name: str, value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool) and "bytes" in name:
        return human_bytes(value)
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


TIERS = ("device", "host")


def _tier_of(name: str) -> tuple[str | None, str]:
    for tier in TIERS:
        if name.startswith(tier + "_"):
            return tier, name[len(tier) + 1 :]
        if name.endswith("_" + tier):
            return tier, name[: -len(tier) - 1]
    return None, name


def stats_table(stats: Any) -> Group:
    """CacheStats as two tables: `device_X` / `X_host` fields side by side (with the total when
    a plain `X` field exists), then every other counter in a compact grid."""
    fields = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(vars(stats))
    tiered: dict[str, dict[str, Any]] = {}
    for name, value in fields.items():
        tier, base = _tier_of(name)
        if tier is not None:
            tiered.setdefault(base, {})[tier] = value
    other = {k: v for k, v in fields.items() if _tier_of(k)[0] is None and k not in tiered}
    tiers = Table(title="prefix cache", header_style="bold", title_justify="left")
    for col in ("", "Device", "Host", "total"):
        tiers.add_column(col, justify="right" if col else "left")
    for base, by_tier in tiered.items():
        cells = [_fmt(base, by_tier[t]) if t in by_tier else "" for t in TIERS]
        total = _fmt(base, fields[base]) if base in fields else ""
        tiers.add_row(base, *cells, total)
    grid = Table(title="counters", header_style="bold", title_justify="left", show_header=False)
    per_row = 3
    for _ in range(per_row):
        grid.add_column(style="dim")
        grid.add_column(justify="right")
    items = [(k, _fmt(k, v)) for k, v in other.items()]
    for i in range(0, len(items), per_row):
        row = [cell for pair in items[i : i + per_row] for cell in pair]
        grid.add_row(*row, *[""] * (2 * per_row - len(row)))
    return Group(tiers, grid)
