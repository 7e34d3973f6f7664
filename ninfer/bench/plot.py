"""TTFT per turn, cold versus cached (matplotlib, the optional `plot` extra)."""

from __future__ import annotations

from pathlib import Path


def plot_ttft(ttft: dict, path: Path, title: str = "") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError("--plot needs matplotlib (pip install 'ninfer[plot]')") from exc
    turns = ttft["turns"]
    labels = [f"{t['session']}#{t['turn']}" for t in turns]
    x = range(len(turns))
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(turns)), 4))
    ax.plot(x, [t["ttft_cold_s"] * 1e3 for t in turns], "o-", label="cold (no prefix reuse)")
    ax.plot(x, [t["ttft_cached_s"] * 1e3 for t in turns], "o-", label="cached")
    ax.set_xticks(list(x), labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("TTFT (ms)")
    ax.set_title(f"TTFT per turn{': ' + title if title else ''}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
