"""The chaos suite's verdict (`make chaos`, `ops.chaos`): once the faults are done and the traffic stopped, the run
is reconciled and its books held to the simulator's ground truth, each fault's recovery, what the web read during
it, the budgets and the invalid traffic; the report is written as `report.json` and `report.md`."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from billing.export import RecordType
from ops.chaos_books import (
    budget_and_range_changes,
    charged_after_raises,
    exported_books,
    final_ledger,
)
from ops.chaos_plan import CATALOG_EVERY_S, FAULTS, NEW_ADS, PERIOD_MS, ChaosOptions, FaultRecord, WebReads

if TYPE_CHECKING:
    import subprocess

    from billing.store.catalog_db import CatalogDatabase
    from ops.settings import Settings


class ChaosRun(Protocol):
    """What the verdict reads of a run and asks of it (`ops.chaos.Chaos`)."""

    options: ChaosOptions
    out: Path
    home: Path
    settings: Settings
    catalog: CatalogDatabase
    disk: str
    t0_ms: int
    traffic_s: float
    stopped: str
    faults: list[FaultRecord]
    web: WebReads
    poison: list[tuple[str, int, int, str]]
    poison_failed: int
    budget_breaches: set[str]
    budget_reads: int
    ran_on_empty_redis: int
    database_changes: dict[str, int]

    def say(self, line: str) -> None: ...
    def adbill(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]: ...
    def totals(self) -> Any: ...
    def records_behind(self) -> int | None: ...
    def refused_in_truth(self) -> dict[str, str]: ...
    def check_budgets(self) -> None: ...


def verdict(chaos: ChaosRun, truth: dict[str, int]) -> dict[str, Any]:
    """What the run shows: the books against the ground truth, each fault's recovery, the web's reads, budgets and
    invalid traffic; kept as the run's report (`write_report`)."""
    import pyarrow.compute as pc

    from billing.corrections import pending_adjustments
    from billing.store.compaction import read_batch_only
    from billing.store.corrections_arrow import CorrectionFiles
    from billing.store.export_files import read_export
    from billing.store.not_charged_clicks import not_charged_by_stream
    from billing.store.parquet_ledger import read_ledger
    from billing.store.period_states import closed_periods

    layout = chaos.settings.layout
    asked = chaos.options
    # The job catches up with everything sent: a committed batch read every record the event topics hold.
    caught = None
    start = time.monotonic()
    while time.monotonic() - start < 600:
        if chaos.records_behind() == 0:
            caught = time.monotonic() - start
            break
        time.sleep(2)
    time.sleep(5)
    rows = read_ledger(chaos.settings.layout.ledger).to_pylist()
    chaos.say(f"ledger: {len(rows)} rows, truth {len(truth)} clicks; caught up in {caught and round(caught)} s")
    last_event_ms = max((r["click_time"] for r in rows), default=int(time.time() * 1000))
    until = (last_event_ms // PERIOD_MS + 1) * PERIOD_MS
    time.sleep(5)
    for _ in range(30):  # exit 4: the scheduled run holds the lock; try again once it is done
        reconcile = chaos.adbill("reconcile", "--until", str(until), check=False)
        if reconcile.returncode != 4:
            break
        time.sleep(10)
    chaos.say(f"reconcile --until {until}: exit {reconcile.returncode}: {reconcile.stdout.strip()[-600:]}")
    audit = chaos.adbill("audit", check=False)
    chaos.say(f"audit: exit {audit.returncode}: {audit.stdout.strip().splitlines()[-1] if audit.stdout else ''}")

    corrections = CorrectionFiles(layout).read()
    final = final_ledger(rows, corrections)
    periods = [folder.name.removeprefix("period=") for folder in layout.not_charged.glob("period=*")]
    final_missing = sorted(set(truth) - set(final))
    final_extra = sorted(set(final) - set(truth))
    final_wrong = sorted(c for c in set(truth) & set(final) if truth[c] != final[c])
    refused = chaos.refused_in_truth()
    bots = {c for c, reason in refused.items() if reason in ("known_bot", "excluded_ip")}
    bots_charged = sorted(bots & {r["click_id"] for r in rows})
    chaos.check_budgets()

    billed = Counter(r["click_id"] for r in rows)
    twice = sorted(c for c, n in billed.items() if n > 1)
    ledger = {r["click_id"]: r["amount_micros"] for r in rows}
    missing = sorted(set(truth) - set(ledger))
    extra = sorted(set(ledger) - set(truth))
    wrong = sorted(c for c in set(truth) & set(ledger) if truth[c] != ledger[c])

    per_period: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        per_period[(r["period"], r["ad_id"])][0] += 1
        per_period[(r["period"], r["ad_id"])][1] += r["amount_micros"]
    redis_totals = {k: [t.clicks, t.micros] for k, t in chaos.totals().all_ad_totals().items()}
    redis_diff = sorted(
        str(k) for k in set(per_period) | set(redis_totals) if per_period.get(k, [0, 0]) != redis_totals.get(k, [0, 0])
    )

    # What finance was given: each closed period's export (the periods closing marked closed, as the audit
    # reads them), and the adjustments booked for it later: in later periods' exports (a late twin found after
    # its period closed retracts the click billed there and adds the twin), or in the period still open (the
    # last reconciliation found one), which finance gets when that period closes.
    closed = closed_periods(layout)
    tables = [read_export(layout.export(period)) for period in sorted(closed)]
    periods_closed = len(tables)
    pending = pending_adjustments(corrections, closed)
    exported = exported_books((row for table in tables for row in table.to_pylist()), pending)
    adjustments = sum(
        pc.sum(pc.equal(table["record_type"], RecordType.ADJUSTMENT.value)).as_py() or 0 for table in tables
    )
    exports_equal = exported == truth

    quarantined = set()
    table = read_batch_only(chaos.settings.layout.quarantine, ["topic", "partition", "offset"])
    if table is not None:  # listed as the product lists it: a compacted file stands for the batch files it holds
        quarantined = {(r["topic"], r["partition"], r["offset"]) for r in table.to_pylist()}
    poison_missing = [p for p in chaos.poison if (p[0], p[1], p[2]) not in quarantined]

    reads_failed_outside_redis = chaos.web.failed - sum(
        n for kind, n in chaos.web.failed_during.items() if kind.startswith("redis")
    )
    if asked.invalid_traffic:
        # The stream judges invalid traffic and budgets with what it has read so far (a flood's first clicks,
        # the order it reads a day's clicks in): reconciliation's corrections make the books exact.
        books = {
            "the ledger and its corrections equal the ground truth": not (final_missing or final_extra or final_wrong),
            "no click of a crawler or an excluded range charged by the stream": not bots_charged,
            "no campaign's day charged past its budget (Redis, read every second)": not chaos.budget_breaches,
        }
    else:
        books = {"ledger equals the ground truth": not (missing or extra or wrong)}
    checks = {
        **books,
        "no click billed in two batches": not twice,
        "Redis equals the ledger to the micro": not redis_diff,
        "exports and their later adjustments equal the ground truth": exports_equal and reconcile.returncode == 0,
        "audit balances": audit.returncode == 0,
        "every poison record is in quarantine": not poison_missing and chaos.poison_failed == 0,
        "web API reads all answered (outside the Redis fault)": reads_failed_outside_redis == 0,
        "every fault recovered": all(f.recovered_s is not None for f in chaos.faults if f.target != "skipped"),
        "the schedule ran to its end": not chaos.stopped,
    }
    if any(f.kind == "database" for f in chaos.faults):
        checks["every catalog change a door confirmed while the database died is there, once"] = (
            chaos.database_changes["confirmed"] > 0
            and chaos.database_changes["lost"] == 0
            and chaos.database_changes["twice"] == 0
        )
    if any(f.kind == "redis-restarted" and f.target != "skipped" for f in chaos.faults):
        checks["the job stopped by itself on a Redis restarted empty"] = chaos.ran_on_empty_redis == 0
    publish_file = chaos.out / "traffic" / "publish.json"
    deployed = json.loads(publish_file.read_text()).get("schema_deployed") if publish_file.exists() else None
    if chaos.traffic_s > asked.schema_deploy_at_s:
        # The ledger holds the clicks of both versions (it equals the ground truth): the version came in use.
        checks["the producers deployed a schema version mid-run"] = bool(deployed)
    # The catalog's change log: the budget and range changes made after the traffic's first minute (those of
    # its start come at once), and the clicks the stream charged after each raise.
    log = chaos.catalog.changes()
    changed = budget_and_range_changes(log, after_ms=chaos.t0_ms + 60_000) if asked.invalid_traffic else Counter()
    raised = charged_after_raises(log, chaos.catalog.current(), rows)
    if asked.invalid_traffic and chaos.traffic_s > asked.changes_at_s + 60:
        # Three budgets changed and one range excluded while the job ran; the books above were judged with them.
        checks["budgets and the IP exclusion list changed mid-run"] = (
            changed["set-budget"] >= 3 and changed["exclude-ip"] >= 1
        )
        checks["the stream charged again where a budget was raised or lifted"] = bool(raised) and all(raised.values())
    report = {
        "seed": asked.seed,
        "rate": asked.rate,
        "home": str(chaos.home),
        "plan": asked.plan,
        "outage_s": asked.outage_s,
        "traffic_s": round(chaos.traffic_s, 1),
        "schema_deployed": {"at_s": asked.schema_deploy_at_s, "ids": deployed},
        "changed_mid_run": {
            "at_s": asked.changes_at_s if asked.invalid_traffic else None,
            "kinds": dict(changed),
            "charged_after_raises": raised,
        },
        "data_disk": chaos.disk,
        "stopped": chaos.stopped,
        "passed": all(checks.values()),
        "checks": checks,
        "figures": {
            "billable_clicks": len(truth),
            "ledger_rows": len(rows),
            "missing": len(missing),
            "extra": len(extra),
            "wrong_amount": len(wrong),
            "billed_twice": len(twice),
            "final_missing": len(final_missing),
            "final_extra": len(final_extra),
            "final_wrong_amount": len(final_wrong),
            "not_charged_in_truth": dict(Counter(refused.values())),
            "not_charged_by_the_stream": dict(Counter(not_charged_by_stream(layout, periods).values())),
            "bots_charged_by_the_stream": len(bots_charged),
            "budget_reads": chaos.budget_reads,
            "days_past_budget": sorted(chaos.budget_breaches),
            "redis_differences": len(redis_diff),
            "periods_exported": periods_closed,
            "exported_clicks": len(exported),
            "export_adjustment_rows": adjustments,
            "adjustments_booked_in_open_periods": len(pending),
            "poison_sent": len(chaos.poison),
            "poison_by_kind": dict(Counter(p[3] for p in chaos.poison)),
            "poison_missing_from_quarantine": len(poison_missing),
            "web_reads_ok": chaos.web.ok,
            "web_reads_failed": chaos.web.failed,
            "web_reads_failed_by_fault": dict(chaos.web.failed_during),
            "caught_up_s": caught and round(caught, 1),
        },
        "faults": [asdict(f) for f in chaos.faults],
        "web_failures": chaos.web.failures,
        "examples": {
            "missing": missing[:5],
            "extra": extra[:5],
            "twice": twice[:5],
            "redis": redis_diff[:5],
            "final_missing": final_missing[:5],
            "final_extra": final_extra[:5],
            "final_wrong": final_wrong[:5],
            "bots_charged": bots_charged[:5],
        },
    }
    write_report(chaos.out, report)
    return report


def _deployed(deploy: dict[str, Any] | None) -> str:
    if not deploy:
        return "no schema version deployed"
    ids = deploy.get("ids")
    when = f"{deploy['at_s']:.0f} s in"
    return f"a schema version deployed {when} (ids {ids})" if ids else f"no schema version deployed (due {when})"


def _changed(changed: dict[str, Any] | None) -> str:
    if not changed or changed.get("at_s") is None:
        return "no budget nor IP exclusion change mid-run"
    kinds = changed.get("kinds") or {}
    made = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())) or "none made"
    raised = changed.get("charged_after_raises") or {}
    again = "; charged by the stream after a raise: " + ", ".join(f"{n} ({key})" for key, n in raised.items())
    return f"budgets and the IP exclusion list changed {changed['at_s']:.0f} s in ({made}{again if raised else ''})"


def write_report(out: Path, report: dict[str, Any]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    f = report["figures"]
    lines = [
        f"# Chaos run, seed {report['seed']}: {'PASSED' if report['passed'] else 'FAILED'}",
        "",
        f"`python -m ops.chaos --seed {report['seed']} --rate {report['rate']}"
        f"{' --faults ' + ','.join(report['plan']) if report.get('plan') and report['plan'] != FAULTS else ''}`, "
        f"{report['rate']} events/s live for {report.get('traffic_s', 0):.0f} s, "
        f"1 % poison, the catalog changed every {CATALOG_EVERY_S} s ({NEW_ADS} new ads), "
        f"{_deployed(report.get('schema_deployed'))}, {_changed(report.get('changed_mid_run'))}, "
        f"an outage of {report.get('outage_s', 0):.0f} s; "
        f"home `{report['home']}`, {report.get('data_disk', '')}.",
        "",
        *([f"**The schedule stopped early**: {report['stopped']}.", ""] if report.get("stopped") else []),
        "| check | result |",
        "| --- | --- |",
        *(f"| {name} | {'ok' if ok else 'FAILED'} |" for name, ok in report["checks"].items()),
        "",
        f"Billable clicks {f['billable_clicks']:,}; ledger rows {f['ledger_rows']:,} (missing {f['missing']}, "
        f"extra {f['extra']}, wrong amount {f['wrong_amount']}, billed twice {f['billed_twice']}); Redis "
        f"differences {f['redis_differences']}; {f['periods_exported']} periods exported with "
        f"{f['exported_clicks']:,} clicks and {f['export_adjustment_rows']} adjustment rows "
        f"({f.get('adjustments_booked_in_open_periods', 0)} more booked in the open period); poison "
        f"{f['poison_sent']} sent {f['poison_by_kind']}, {f['poison_missing_from_quarantine']} missing from "
        f"quarantine; web reads {f['web_reads_ok']:,} ok, {f['web_reads_failed']} failed "
        f"{f['web_reads_failed_by_fault']}; the job caught up {f['caught_up_s']} s after the traffic stopped.",
        "",
        "| # | fault | at (s) | target | recovered in (s) | events delayed | failed step | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *(
            f"| {i} | {x['kind']} | {x['at_s']} | {x['target']} | {x['recovered_s']} | {x['delayed_events']:,} | "
            f"{x.get('failed_step') or ''} | {' '.join(str(x['note']).split())} |"
            for i, x in enumerate(report["faults"], 1)
        ),
        "",
        *(
            ["Failed web reads:", "", *(f"- {failure}" for failure in report["web_failures"]), ""]
            if report["web_failures"]
            else []
        ),
    ]
    (out / "report.md").write_text("\n".join(lines))
