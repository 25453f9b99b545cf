"""The benchmark's arithmetic: percentiles, micro-batch timelines, sustained rates, the knee, flatness, ratios.

Pure: inputs are plain numbers, lists and dicts (health records as `attribution.progress.summarize` writes them,
times in epoch ms, latencies in ms); nothing here starts a process, reads a file or a clock.

How a step is measured (`step_figures`). Traffic is offered at a fixed rate from `send_start_ms` to
`send_end_ms`; the system reads it in micro-batches. `processed_by(t)` counts the records of the batches
that ended by `t`, plus the finished share of the batch running at `t` (records are spread over a batch's
duration). The step's **sustained** rate is the slope of that curve over the last two thirds of the send window
(the first third lets the latency of the first batches pass): a system that keeps up sustains the offered rate,
one that falls behind sustains its capacity. The **end-to-end** rate, events over the time from the first send
to the batch that read the last event, also counts the time to drain what was left at the end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

KEEP_UP_FRACTION = 0.9
"""A step keeps up when its sustained rate is at least this share of the rate actually offered ..."""
MAX_P99_MS = 30_000
"""... and its p99 latency is at most this."""
WARMUP_FRACTION = 1 / 3
"""The share of a send window left out of the sustained rate: the first batches' latency."""

TARGET_RATE = 50_000
TARGET_BASELINE_RATIO = 1.5
"""Sustained at the knee: at least this many times the textbook baseline's, in the same run."""
LATENCY_RATE = 10_000
"""The offered rate the latency targets are read at."""
TARGET_BURST_RATIO = 1.5
"""Reading the same burst sent at once: at least this many times as fast as the baseline, in the same run."""
TARGET_P99_MS = 1_500
TARGET_P99_RATIO = 0.6
"""p99 at `LATENCY_RATE`: at most this share of the baseline's p99 at that rate, in the same run."""
TARGET_CPU_US_PER_EVENT = 15.0
"""CPU of the whole job (every process of it) per event read, at the knee."""


def percentile(sorted_values: Sequence[int], q: float) -> int:
    """The nearest-rank `q` quantile of values sorted ascending (0 for none)."""
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def latency_summary(latencies_ms: Iterable[int]) -> dict[str, int]:
    """Count, p50, p99 and max of latencies in ms."""
    ordered = sorted(latencies_ms)
    return {
        "count": len(ordered),
        "p50": percentile(ordered, 0.50),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1] if ordered else 0,
    }


def batch_start_ms(record: Mapping[str, Any]) -> int:
    """When a micro-batch's trigger started (its progress `timestamp`), epoch ms."""
    return int(datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00")).timestamp() * 1000)


def batch_end_ms(record: Mapping[str, Any]) -> int:
    """When a micro-batch finished: its start plus its trigger execution time."""
    return batch_start_ms(record) + int(record["batch_duration_ms"])


def processed_by(batches: Iterable[Mapping[str, Any]], t_ms: float) -> float:
    """Records processed by time `t_ms`: whole batches that ended, the done share of one that is running."""
    total = 0.0
    for record in batches:
        start, end = batch_start_ms(record), batch_end_ms(record)
        rows = record["input_rows"]
        if t_ms >= end:
            total += rows
        elif t_ms > start:
            total += rows * (t_ms - start) / (end - start)
    return total


def sustained_rate(batches: Sequence[Mapping[str, Any]], start_ms: float, end_ms: float) -> float:
    """Records per second processed between two instants."""
    if end_ms <= start_ms:
        return 0.0
    return (processed_by(batches, end_ms) - processed_by(batches, start_ms)) * 1000 / (end_ms - start_ms)


def step_batches(history: Iterable[Mapping[str, Any]], send_start_ms: int) -> list[Mapping[str, Any]]:
    """The batches that can hold a step's records: those ending after its first send, by batch id.

    Steps run one after the other and each waits until the system has read everything sent before, so every
    record these batches read belongs to the step."""
    return sorted((r for r in history if batch_end_ms(r) > send_start_ms), key=lambda r: r["batch_id"])


def drained_at_ms(batches: Sequence[Mapping[str, Any]], sent: int) -> int | None:
    """The end of the batch that read the `sent`-th record of a step (None while some are unread)."""
    total = 0
    for record in batches:
        total += record["input_rows"]
        if total >= sent:
            return batch_end_ms(record)
    return None


def step_figures(
    batches: Sequence[Mapping[str, Any]],
    sent: int,
    send_start_ms: int,
    send_end_ms: int,
    latencies_ms: Iterable[int],
) -> dict[str, Any]:
    """Throughput and latency figures of one step at an offered rate (module doc), from its batches."""
    window = send_end_ms - send_start_ms
    steady_from = send_start_ms + WARMUP_FRACTION * window
    drained = drained_at_ms(batches, sent)
    busy = [r for r in batches if r["input_rows"] > 0]
    return {
        "events_sent": sent,
        "offered_rate_achieved": round(sent * 1000 / window) if window > 0 else 0,
        "sustained_rate": round(sustained_rate(batches, steady_from, send_end_ms)),
        "end_to_end_rate": round(sent * 1000 / (drained - send_start_ms)) if drained else None,
        "drained": drained is not None,
        "drain_s": round((drained - send_end_ms) / 1000, 1) if drained else None,
        "lag_at_send_end": max(0, round(sent - processed_by(batches, send_end_ms))),
        "latency_ms": latency_summary(latencies_ms),
        "batches": len(batches),
        "batch_duration_ms_mean": round(sum(r["batch_duration_ms"] for r in busy) / len(busy)) if busy else 0,
        "batch_rows_mean": round(sum(r["input_rows"] for r in busy) / len(busy)) if busy else 0,
        "state_rows_max": max((r.get("state_rows", 0) for r in batches), default=0),
        "state_memory_bytes_max": max((r.get("state_memory_bytes", 0) for r in batches), default=0),
        "phase_ms_mean": phase_means(busy),
    }


def phase_means(batches: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Mean time per batch of each phase Spark reports (`durationMs`: latestOffset, queryPlanning, addBatch...)."""
    sums: dict[str, float] = {}
    for record in batches:
        for phase, ms in (record.get("durations_ms") or {}).items():
            sums[phase] = sums.get(phase, 0.0) + ms
    return {phase: round(total / len(batches)) for phase, total in sorted(sums.items(), key=lambda kv: -kv[1])}


def keeps_up(step: Mapping[str, Any]) -> bool:
    """Whether a step held its offered rate: drained, sustained >= 90 % of the rate offered, p99 <= 30 s."""
    return (
        bool(step.get("drained"))
        and step["sustained_rate"] >= KEEP_UP_FRACTION * step["offered_rate_achieved"]
        and step["latency_ms"]["p99"] <= MAX_P99_MS
    )


def knee(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Where a system stops keeping up, over steps of increasing offered rate.

    `kept_up_to`: the highest offered rate it held (None if none); `first_failed`: the first it did not;
    `sustained_rate`: what it sustained at the highest rate it held, or, if it held none, the most it sustained
    (its capacity), flagged by `kept_up_to` None; `latency_ms` at that step."""
    held = [s for s in steps if keeps_up(s)]
    # The failure that ends the held rates (a first step lost to the cold start is not the knee: `should_stop`).
    above = [s for s in steps if not held or s["offered_rate"] > held[-1]["offered_rate"]]
    failed = next((s for s in above if not keeps_up(s)), None)
    best = held[-1] if held else max(steps, key=lambda s: s["sustained_rate"], default=None)
    return {
        "kept_up_to": held[-1]["offered_rate"] if held else None,
        "first_failed": failed["offered_rate"] if failed else None,
        "sustained_rate": best["sustained_rate"] if best else 0,
        "latency_ms": best["latency_ms"] if best else latency_summary([]),
        "at_offered_rate": best["offered_rate"] if best else None,
    }


def should_stop(steps: Sequence[Mapping[str, Any]]) -> bool:
    """Stop raising the offered rate after a step that did not keep up: the knee is found. Except after the first
    step alone: it follows the job's cold start (the backlog it caught up on is one batch, and the JVM is still
    compiling), and one such step may fail a rate the system holds once warm, so the next rate is tried too."""
    return bool(steps) and not keeps_up(steps[-1]) and len(steps) > 1


def linear_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of y over x (0 for fewer than two distinct x)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var


def flatness(
    times_s: Sequence[float],
    values: Sequence[float],
    tolerance: float,
    floor: float = 0.0,
    tail_fraction: float = 2 / 3,
) -> dict[str, Any]:
    """Whether a series stays flat over the last `tail_fraction` of its time span.

    The least-squares line through the tail's points predicts a change over the tail of `slope * span`; the
    series is flat when that change is at most `tolerance` of the tail's mean, or at most `floor` in absolute
    terms (so that a series near zero is not judged on noise)."""
    if len(times_s) < 3:
        return {"flat": None, "slope_per_min": 0.0, "change": 0.0, "change_fraction": 0.0, "points": len(times_s)}
    cut = times_s[0] + (1 - tail_fraction) * (times_s[-1] - times_s[0])
    tail = [(t, v) for t, v in zip(times_s, values, strict=True) if t >= cut]
    xs, ys = [t for t, _ in tail], [v for _, v in tail]
    slope = linear_slope(xs, ys)
    change = slope * (xs[-1] - xs[0]) if len(xs) > 1 else 0.0
    mean = sum(ys) / len(ys)
    fraction = change / mean if mean else 0.0
    return {
        "flat": abs(change) <= max(tolerance * abs(mean), floor),
        "slope_per_min": slope * 60,
        "change": change,
        "change_fraction": round(fraction, 4),
        "points": len(xs),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, rounded to 3 places; None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


@dataclass(frozen=True)
class TargetFigures:
    """What the targets are read from, all from one run."""

    pipeline_rate: int
    """Sustained at the pipeline's knee."""
    baseline_rate: int | None = None
    baseline_held_every_rate: bool = False
    """The baseline held every rate tried: its own knee is higher still, the ratio an upper bound."""
    baseline_held_a_rate_the_pipeline_did_not: bool = False
    p99_ms: int | None = None
    """The pipeline's p99 at `LATENCY_RATE` (None: not measured there, or it did not keep up)."""
    baseline_p99_ms: int | None = None
    burst_rate: int | None = None
    """Events/s the pipeline read the burst at (None: not sent, or not read to its end)."""
    baseline_burst_rate: int | None = None
    cpu_us_per_event: float | None = None
    """The whole job's CPU per event at the knee."""


def targets(figures: TargetFigures) -> list[dict[str, Any]]:
    """The targets for the full pipeline, each with the measured value and whether it is met: ratios against the
    textbook baseline in the same run (what one run on a shared machine can compare), and the absolute figures
    beside them."""
    f = figures
    rate_ratio = ratio(f.pipeline_rate, f.baseline_rate)
    versus = "-" if rate_ratio is None else f"{rate_ratio:.2f}x the baseline"
    if rate_ratio is not None and f.baseline_held_every_rate:
        versus = f"at most {versus} (it held every rate tried)"
    p99_ratio = ratio(f.p99_ms, f.baseline_p99_ms)
    burst_ratio = ratio(f.burst_rate, f.baseline_burst_rate)
    at = f"at {LATENCY_RATE:,}/s"
    return [
        {
            "target": f"sustained at the knee at least {TARGET_BASELINE_RATIO:g}x the textbook baseline's",
            "measured": versus,
            "met": rate_ratio is not None
            and rate_ratio >= TARGET_BASELINE_RATIO
            and not f.baseline_held_a_rate_the_pipeline_did_not,
        },
        {
            "target": f"at least {TARGET_RATE:,} events/s sustained",
            "measured": f"{f.pipeline_rate:,} events/s",
            "met": f.pipeline_rate >= TARGET_RATE,
        },
        {
            "target": f"a burst read at least {TARGET_BURST_RATIO:g}x as fast as the baseline reads it",
            "measured": "-"
            if burst_ratio is None
            else f"{burst_ratio:.2f}x ({f.burst_rate:,} against {f.baseline_burst_rate:,} events/s)",
            "met": burst_ratio is not None and burst_ratio >= TARGET_BURST_RATIO,
        },
        {
            "target": f"p99 click -> billed {at} at most {TARGET_P99_RATIO:g}x the baseline's",
            "measured": "-"
            if p99_ratio is None
            else f"{p99_ratio:.2f}x ({(f.p99_ms or 0) / 1000:.1f} s against {(f.baseline_p99_ms or 0) / 1000:.1f} s)",
            "met": p99_ratio is not None and p99_ratio <= TARGET_P99_RATIO,
        },
        {
            "target": f"p99 click -> billed {at} at most {TARGET_P99_MS / 1000:g} s",
            "measured": "-" if f.p99_ms is None else f"{f.p99_ms / 1000:.1f} s",
            "met": f.p99_ms is not None and f.p99_ms <= TARGET_P99_MS,
        },
        {
            "target": f"CPU per event at most {TARGET_CPU_US_PER_EVENT:g} us (the whole job, at the knee)",
            "measured": "-" if f.cpu_us_per_event is None else f"{f.cpu_us_per_event:.1f} us",
            "met": f.cpu_us_per_event is not None and f.cpu_us_per_event <= TARGET_CPU_US_PER_EVENT,
        },
    ]


def batch_cost(batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A micro-batch's cost as a fixed part and a part per record: the least-squares line of batch duration
    over records read, through the batches that read records.

    The fixed part is the floor of the latency (no batch is faster); the part per record bounds the throughput
    at `1 / per_record` however large the batches grow."""
    busy = [r for r in batches if r["input_rows"] > 0]
    if len(busy) < 3:
        return {"batches": len(busy), "fixed_ms": None, "per_event_us": None, "capacity": None}
    rows = [float(r["input_rows"]) for r in busy]
    durations = [float(r["batch_duration_ms"]) for r in busy]
    slope = linear_slope(rows, durations)
    fixed = sum(durations) / len(durations) - slope * sum(rows) / len(rows)
    return {
        "batches": len(busy),
        "fixed_ms": round(fixed),
        "per_event_us": round(slope * 1000, 2),
        "capacity": round(1000 / slope) if slope > 0 else None,
        "min_ms": round(min(durations)),
    }


def per_interval(
    points: Iterable[tuple[float, float]], start_s: float, interval_s: float
) -> list[tuple[float, list[float]]]:
    """Values grouped by the interval of their time: (interval start, values) in time order, empty ones left out."""
    groups: dict[int, list[float]] = {}
    for t, value in points:
        groups.setdefault(math.floor((t - start_s) / interval_s), []).append(value)
    return [(start_s + k * interval_s, groups[k]) for k in sorted(groups)]
