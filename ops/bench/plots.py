"""The report's PNG plots, drawn with matplotlib (the `bench` extra) from the report's dict.

Benchmark: throughput against offered rate (both systems, with the ceilings), latency percentiles per
micro-batch over time, and resident memory with state rows over time. Soak: latency per minute, memory and
state over time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

COLORS = {"pipeline": "tab:blue", "baseline": "tab:orange"}


def draw(data: Mapping[str, Any], folder: Path) -> list[tuple[str, str]]:
    """Draw the plots of a report into `folder`; returns (title, file name) of each."""
    import matplotlib

    matplotlib.use("Agg")
    systems = data.get("systems") or {}
    images = []
    if data.get("kind") == "bench":
        images.append(("Throughput against offered rate", _throughput(data, folder)))
    if systems:
        images.append(("Latency per micro-batch over time", _latency(systems, folder)))
        images.append(("Memory and state over time", _memory(systems, folder)))
    return images


def _throughput(data: Mapping[str, Any], folder: Path) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    offered: set[int] = set()
    for name, result in (data.get("systems") or {}).items():
        steps = result.get("steps") or []
        xs = [s["offered_rate"] for s in steps]
        ax.plot(xs, [s["sustained_rate"] for s in steps], "o-", color=COLORS.get(name), label=f"{name}, sustained")
        ax.plot(
            xs,
            [s.get("end_to_end_rate") or 0 for s in steps],
            "x:",
            color=COLORS.get(name),
            label=f"{name}, end-to-end",
        )
        burst = result.get("burst") or {}
        if burst.get("drained"):
            ax.axhline(burst["rate"], color=COLORS.get(name), linestyle="--", linewidth=1, label=f"{name}, burst")
        offered.update(xs)
    if offered:
        low, high = min(offered) / 1.5, max(offered) * 1.5
        ax.plot([low, high], [low, high], color="grey", linewidth=1, label="sustained = offered")
        ax.set_xscale("log")
        ax.set_xlim(low, high)
        ax.set_xticks(sorted(offered), [f"{x / 1000:g}k" for x in sorted(offered)])
        ax.minorticks_off()
    ceiling = data.get("ceiling") or {}
    for key, label, style in (
        ("read_kafka_tool", "read ceiling (Kafka's ConsumerPerformance)", "-."),
        ("read_python", "read ceiling (a Python consumer)", "--"),
        ("write_preserialized", "write ceiling (pre-serialized, one producer)", ":"),
    ):
        if key in ceiling:
            ax.axhline(ceiling[key]["rate"], color="black", linestyle=style, linewidth=1, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("offered events/s (log)")
    ax.set_ylabel("events/s (log)")
    ax.set_title("Throughput against offered rate")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    name = "throughput.png"
    fig.tight_layout()
    fig.savefig(folder / name, dpi=110)
    plt.close(fig)
    return name


def _windows(ax: Any, result: Mapping[str, Any]) -> None:
    """Shade each step's send window, labeled with its offered rate."""
    launched = result.get("launched", 0.0)
    for step in result.get("steps") or []:
        sender = step.get("sender") or {}
        if "first_send" in sender:
            start, end = sender["first_send"] - launched, sender["last_send"] - launched
            ax.axvspan(start, end, color="grey", alpha=0.12)
            ax.text(start, 1.0, f"{step['offered_rate'] / 1000:g}k/s", transform=ax.get_xaxis_transform(),
                    fontsize=7, va="top")  # fmt: skip


def _latency(systems: Mapping[str, Any], folder: Path) -> str:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(systems), 1, figsize=(9, 3.2 * len(systems)), squeeze=False)
    for ax, (name, result) in zip(axes[:, 0], systems.items(), strict=True):
        launched_ms = result.get("launched", 0.0) * 1000
        points = [b for b in result.get("batches") or [] if b.get("latency_ms") and b["latency_ms"]["count"]]
        xs = [(b["end_ms"] - launched_ms) / 1000 for b in points]
        for key, style in (("max", ":"), ("p99", "-"), ("p50", "--")):
            ax.plot(xs, [b["latency_ms"][key] / 1000 for b in points], style, label=key, color=COLORS.get(name))
        _windows(ax, result)
        ax.set_title(f"{name}: click-to-bill latency of the clicks of each micro-batch", fontsize=9)
        ax.set_ylabel("seconds")
        ax.set_xlabel("seconds since the job started")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    name = "latency.png"
    fig.tight_layout()
    fig.savefig(folder / name, dpi=110)
    plt.close(fig)
    return name


def _memory(systems: Mapping[str, Any], folder: Path) -> str:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(systems), 1, figsize=(9, 3.2 * len(systems)), squeeze=False)
    for ax, (name, result) in zip(axes[:, 0], systems.items(), strict=True):
        memory = result.get("memory") or []
        ax.plot([t for t, _ in memory], [mb for _, mb in memory], color=COLORS.get(name), label="resident MB (job)")
        ax.set_ylabel("MB")
        ax.set_xlabel("seconds since the job started")
        state = ax.twinx()
        launched_ms = result.get("launched", 0.0) * 1000
        batches = result.get("batches") or []
        state.plot(
            [(b["end_ms"] - launched_ms) / 1000 for b in batches],
            [b["state_rows"] for b in batches],
            color="tab:green",
            linewidth=1,
            label="state rows",
        )
        state.set_ylabel("state rows")
        _windows(ax, result)
        ax.set_title(f"{name}: resident memory of the job's processes and rows in state", fontsize=9)
        ax.grid(True, alpha=0.3)
        lines = ax.get_legend_handles_labels()
        more = state.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="lower right")
    name = "memory.png"
    fig.tight_layout()
    fig.savefig(folder / name, dpi=110)
    plt.close(fig)
    return name
