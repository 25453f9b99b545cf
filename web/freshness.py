"""How fresh the figures are, and the pipeline's overall status: pure rules over what Redis says of the job.

A page with live figures says when the data was last billed: the streaming job's last batch or idle trigger (its
heartbeat, `PREFIX:health:heartbeat:billing`), which proves the job had read everything Kafka held then. The page's
own fetch time says nothing about that. Past `amber_after_s` (the readiness limit, `ADBILL_WEB_READY_BATCH_AGE_S`,
60 s by default) the banner turns amber, past `red_after_s` (5 times that) red.

The admin's health page sums the job, Kafka (consumer lag), Redis and reconciliation up in one status each and an
overall one, the worst of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from billing.periods import format_elapsed, format_utc
from billing.store.part_status import describe_wait
from web.display import period_label

OK, AMBER, RED, UNKNOWN = "ok", "amber", "red", "unknown"
_RANK = {OK: 0, UNKNOWN: 1, AMBER: 2, RED: 3}

RED_FACTOR = 5
"""The banner turns red at this many times the amber limit."""

LAG_GROWING_RECORDS = 10_000
"""A consumer lag above this that grew over the recent batches is amber: the job falls behind."""

RECONCILE_LATE_S = 1_800
"""No reconciliation finished for this long: amber (it runs every 5 min in `adbill up`)."""


@dataclass(frozen=True, slots=True)
class Freshness:
    """How fresh the figures are: `level` is ok, amber, red, or unknown (the job never reported)."""

    level: str
    last_batch_ms: int | None
    age_ms: int | None
    text: str

    def as_json(self) -> dict[str, object]:
        return {"level": self.level, "last_batch_ms": self.last_batch_ms, "age_ms": self.age_ms, "text": self.text}


def freshness(last_batch_ms: int | None, now_ms: int, amber_after_s: int, red_after_s: int | None = None) -> Freshness:
    """The banner of a page whose figures the streaming job writes."""
    red_after_s = amber_after_s * RED_FACTOR if red_after_s is None else red_after_s
    if last_batch_ms is None:
        return Freshness(UNKNOWN, None, None, "The billing job has not reported yet: figures may be incomplete.")
    age = max(0, now_ms - last_batch_ms)
    when = f"{_utc(last_batch_ms)} ({format_elapsed(age)} ago)"
    if age > red_after_s * 1000:
        return Freshness(
            RED, last_batch_ms, age, f"Stale: the billing job last billed at {when}; figures are not being updated."
        )
    if age > amber_after_s * 1000:
        return Freshness(AMBER, last_batch_ms, age, f"Delayed: data last billed at {when}.")
    return Freshness(OK, last_batch_ms, age, f"Data last billed at {when}.")


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    name: str
    level: str
    text: str


def worst(levels: Sequence[str]) -> str:
    return max(levels, key=lambda level: _RANK[level]) if levels else UNKNOWN


SILENT_AFTER_S = 13
"""The job reports every batch, and an idle trigger every 10 s when there is nothing to read (Spark's
`noDataProgressEventInterval`): silent for longer than this (or than 1.5 times its longest recent batch, when that is
longer) it may be frozen, long before the figures' banner turns amber."""

WATERMARK_BEHIND_S = 20
"""While records flow, a watermark further behind the clock than its delay plus this is amber: the live bill lags."""


def job_status(
    fresh: Freshness,
    now_ms: int | None = None,
    recent_durations_ms: Sequence[int] = (),
    watermark_ms: int | None = None,
    watermark_delay_ms: int = 0,
    flowing: bool = False,
) -> ComponentStatus:
    """The streaming job: its freshness (`fresh`, from its heartbeat); silent past `SILENT_AFTER_S` (or 1.5 times its
    longest recent batch) it may be frozen (amber); and how far its watermark (`watermark_ms`, the last batch's) is
    behind the clock, amber past its delay plus `WATERMARK_BEHIND_S` while records flow (`flowing`: records wait in
    Kafka or the last batch read some)."""
    if now_ms is None or fresh.level == UNKNOWN:
        return ComponentStatus("Streaming job", fresh.level, fresh.text)
    level, text = fresh.level, fresh.text
    silent_limit_ms = max(SILENT_AFTER_S * 1000, 3 * max(recent_durations_ms, default=0) // 2)
    if level == OK and fresh.age_ms is not None and fresh.age_ms > silent_limit_ms:
        level = AMBER
        text = (
            f"Silent for {format_elapsed(fresh.age_ms)}: no batch and no idle report since "
            f"{_utc(fresh.last_batch_ms or 0)} (it reports at least every 10 s): the job may be frozen."
        )
    if watermark_ms is not None:
        behind = max(0, now_ms - watermark_ms)
        text += (
            f" Watermark {_utc(watermark_ms)}, {format_elapsed(behind)} behind the clock "
            f"({format_elapsed(watermark_delay_ms)} of that is its delay): clicks after it are not billed live yet."
        )
        if flowing and behind > watermark_delay_ms + WATERMARK_BEHIND_S * 1000:
            level = worst([level, AMBER])
    return ComponentStatus("Streaming job", level, text)


def waiting_status(name: str, status: Mapping[str, str], now_ms: int) -> ComponentStatus:
    """A part that says it waits (a status record: `waiting for disk space`, since when, what failed): red, with
    its own words."""
    said = describe_wait(dict(status), now_ms)
    return ComponentStatus(name, RED, f"{said[:1].upper()}{said[1:]}: {status.get('message', '')}")


def kafka_status(
    lag_now: Mapping[str, int | None] | None,
    lag_before: Mapping[str, int | None] | None,
    error: str | None = None,
    fresh: Freshness | None = None,
    committed: bool = True,
) -> ComponentStatus:
    """Kafka as the job's checkpoint and Kafka itself say it now (`billing.store.stream_offsets`): records waiting
    per topic (`lag_now`; None with `error` when Kafka could not be asked), whether that grew since `lag_before`
    (the job's report of some batches ago), and whether records wait while the job bills nothing (`fresh` amber or
    red: a job that is stuck). `committed`: the job has committed a batch."""
    if error:
        return ComponentStatus("Kafka", RED, f"{error}: the records waiting are unknown.")
    if not lag_now:
        return ComponentStatus("Kafka", UNKNOWN, "No offsets known yet.")
    unknown = [topic for topic, n in lag_now.items() if n is None]
    if unknown:
        return ComponentStatus("Kafka", UNKNOWN, f"Latest offsets not known for {', '.join(unknown)}.")
    total = sum(n or 0 for n in lag_now.values())
    if not committed:
        return ComponentStatus("Kafka", UNKNOWN, f"The job has committed no batch yet; {total:,} records in Kafka.")
    if total and fresh is not None and fresh.level in (AMBER, RED) and fresh.age_ms is not None:
        return ComponentStatus(
            "Kafka",
            AMBER,
            f"{total:,} records waiting, and the job last billed {format_elapsed(fresh.age_ms)} ago: it is not "
            "reading them.",
        )
    before = (
        None
        if lag_before is None or any(n is None for n in lag_before.values())
        else sum(n or 0 for n in lag_before.values())
    )
    if total > LAG_GROWING_RECORDS and before is not None and total > before:
        return ComponentStatus("Kafka", AMBER, f"Lag growing: {total:,} records waiting (was {before:,}).")
    return ComponentStatus("Kafka", OK, f"{total:,} records waiting to be read.")


def redis_status() -> ComponentStatus:
    """Redis answered (this page was read from it)."""
    return ComponentStatus("Redis", OK, "Answering.")


def database_status(version: int, behind: str | None) -> ComponentStatus:
    """The catalog's database as this page found it: answering (at catalog `version`), or not (`behind`)."""
    if behind is not None:
        return ComponentStatus("Catalog database", RED, f"{behind}: the pages show catalog version {version}.")
    return ComponentStatus("Catalog database", OK, f"Answering: catalog version {version}.")


def reconciliation_status(
    finished_at_ms: int | None,
    held: dict[str, str],
    differences: Sequence[str],
    now_ms: int,
    awaiting_close: Sequence[str] = (),
    running_since_ms: int | None = None,
) -> ComponentStatus:
    """Red when the last audit found a closed period that differs from the rule (`differences`, named); amber when
    periods are held, no run finished for `RECONCILE_LATE_S` or a run has been under way that long; unknown before
    the first run. A run under way (`running_since_ms`, its record `billing.store.part_status.RECONCILE_RUN_PART`)
    is said first. An open period that differs (`awaiting_close`) is said, never a failure: its late data is
    corrected when it closes."""
    if running_since_ms is not None:
        running_ms = max(0, now_ms - running_since_ms)
        said = reconciliation_status(finished_at_ms, held, differences, now_ms, awaiting_close)
        last = (
            f"the last run finished {format_elapsed(max(0, now_ms - finished_at_ms))} ago"
            if finished_at_ms is not None
            else "no run has finished yet"
        )
        level = worst(
            [OK if said.level == UNKNOWN else said.level, AMBER if running_ms > RECONCILE_LATE_S * 1000 else OK]
        )
        rest = f" {said.text}" if said.level in (RED, AMBER) else ""
        return ComponentStatus(
            "Reconciliation",
            level,
            f"Running: a run under way since {_utc(running_since_ms)} ({format_elapsed(running_ms)}); {last}.{rest}",
        )
    waits = (
        f" Open, awaiting close (they differ from the rule until they close): {_labels(awaiting_close)}."
        if awaiting_close
        else ""
    )
    if differences:
        return ComponentStatus(
            "Reconciliation",
            RED,
            f"The last audit found {_periods(len(differences))} closed and differing from the rule: "
            f"{_labels(differences)}.{waits}",
        )
    if finished_at_ms is None:
        return ComponentStatus("Reconciliation", UNKNOWN, "No reconciliation has run yet." + waits)
    age = max(0, now_ms - finished_at_ms)
    if held:
        return ComponentStatus("Reconciliation", AMBER, f"{_periods(len(held))} held; see the reasons below." + waits)
    if age > RECONCILE_LATE_S * 1000:
        return ComponentStatus("Reconciliation", AMBER, f"No run finished for {format_elapsed(age)}." + waits)
    return ComponentStatus("Reconciliation", OK, f"Last run finished {format_elapsed(age)} ago." + waits)


def _labels(periods: Sequence[str]) -> str:
    return ", ".join(period_label(p) for p in periods)


def _periods(n: int) -> str:
    return f"{n:,} period{'' if n == 1 else 's'}"


def _utc(ts_ms: int) -> str:
    return format_utc(ts_ms).replace("T", " ")[:19] + " UTC"
