"""What `ninfer chat` draws: reasoning split from the answer, the per-turn line, the cache table.

Knows nothing about the engine beyond the plain data it returns (RequestOutput, CacheStats).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ninfer.page import PAGE_SIZE

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


def turn_line(out: Any, reuse: str = "", speculation: Any = None) -> str:
    """The compact line after a finished turn, from the final RequestOutput; `reuse` (from
    `reuse_note`) says what the cached tokens were, or why there were none; `speculation`: the
    turn's `SpeculationStats` (MTP on), its tokens per step and draft acceptance."""
    u, m = out.usage, out.metrics
    note = f" ({reuse})" if reuse else ""
    mtp = ""
    if speculation is not None and speculation.verify_rows:
        mtp = (f"MTP {speculation.tokens_per_row:.2f} tok/step, "
               f"{speculation.acceptance:.0%} accepted · ")  # fmt: skip
    return (
        f"prompt {u.prompt_tokens} tok · cached {u.cached_tokens}{note} · "
        f"TTFT {m.ttft_s * 1e3:.0f} ms · decode {m.decode_tokens_per_s:.1f} tok/s · {mtp}"
        f"{u.completion_tokens} tok ({out.finish_reason})"
    )


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def reuse_note(out: Any, previous: list[int] | None, cache_on: bool = True) -> str:
    """Why a turn's `cached` is what it is, in a few words.

    `previous` is the token sequence of the conversation's previous turn (its prompt, then its
    reply), None on a conversation's first turn. The cache serves whole `PAGE_SIZE`-token blocks of
    a prompt that earlier requests computed; a follow-up shares with its previous turn only what
    the chat template renders the same way again (templates rewrite earlier replies: Qwen3.5
    drops their reasoning block), so the previous reply is usually prefilled again.
    """
    cached = out.usage.cached_tokens
    if not cache_on:
        return "prefix cache off"
    if previous is None:
        return "from an earlier conversation" if cached else "new conversation"
    if not previous:  # the previous reply was stopped: its tokens are not known here
        return "earlier turns" if cached else "nothing reusable"
    shared = common_prefix(previous, list(out.prompt_token_ids))
    if cached:
        if shared < len(previous):
            return "earlier turns; the last reply re-rendered by the template"
        return "earlier turns"
    if shared < PAGE_SIZE:
        return f"history re-rendered: {shared} tok shared, under one {PAGE_SIZE}-token block"
    return "the shared prefix was evicted or has no snapshot to resume from"


def stopped_line(n_tokens: int, ttft_s: float | None, out: Any = None) -> str:
    """The line after a reply stopped with Ctrl+C: the tokens seen and their TTFT (measured
    here), and the prompt's figures when the engine's final "abort" output came back."""
    ttft = "-" if ttft_s is None else f"{ttft_s * 1e3:.0f} ms"
    prompt = ""
    if out is not None:
        prompt = f"prompt {out.usage.prompt_tokens} tok · cached {out.usage.cached_tokens} · "
    return f"stopped after {n_tokens} tok · {prompt}TTFT {ttft} · partial reply kept"


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


def stats_summary(stats: Any, config: Any = None) -> str:
    """One line: hit rate, reused tokens, bytes used of each tier's total, Host restores."""
    get = lambda name: getattr(stats, name, 0)  # noqa: E731 (fields added later read as 0)
    lookups, hits = get("lookups"), get("hits_device") + get("hits_host")
    rate = f"{hits / lookups:.0%} ({hits} of {lookups} requests)" if lookups else "- (no requests)"
    parts = [f"hit rate {rate}", f"reused {get('reuse_tokens')} tok"]
    prefilled = get("prefill_tokens")
    if prefilled:
        parts[-1] += f", prefilled {prefilled} tok"
    device = get("device_block_bytes") + get("device_snapshot_bytes")
    host = get("host_block_bytes") + get("host_snapshot_bytes")
    device_total = host_total = None
    if config is not None:
        device_total = (getattr(config, "kv_pages", 0) * getattr(config, "kv_page_bytes", 0)
                        + getattr(config, "device_snapshot_slots", 0)
                        * getattr(config, "state_image_bytes", 0))  # fmt: skip
        host_total = (
            getattr(config, "host_cache_bytes", 0) if getattr(config, "host_tier", 1) else 0
        )
    of = lambda used, total: human_bytes(used) + (f" of {human_bytes(total)}" if total else "")  # noqa: E731
    parts.append(f"Device {of(device, device_total)}")
    parts.append(f"Host {of(host, host_total)}" if host_total != 0 else "Host off")
    parts.append(f"{get('restores')} restores ({human_bytes(get('restored_host_bytes'))})")
    return " · ".join(parts)


def stats_table(stats: Any, config: Any = None) -> Group:
    """CacheStats as a summary line, then two tables: `device_X` / `X_host` fields side by side
    (with the total when a plain `X` field exists), then every other counter in a compact
    grid."""
    fields = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(vars(stats))
    tiered: dict[str, dict[str, Any]] = {}
    for name, value in fields.items():
        tier, base = _tier_of(name)
        if tier is not None:
            tiered.setdefault(base, {})[tier] = value
    other = {k: v for k, v in fields.items() if _tier_of(k)[0] is None and k not in tiered}
    tiers = Table(title="by tier", header_style="bold", title_justify="left")
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
    summary = Text("prefix cache: " + stats_summary(stats, config), style="bold")
    return Group(summary, tiers, grid)
