"""Adapter: the version of each period's data, the largest micro-batch id of the files that can change its bill.

A reconciliation run reconciles a period again when its version is newer than the one its state records
(`billing.reconcile_plan.PeriodState.version`, `billing.reconcile_plan.plan_run`); the audit and the invoices read the
same.
"""

from __future__ import annotations

from collections import defaultdict

import pyarrow.dataset as ds

from billing.layout import DataLayout
from billing.periods import DAY_MS, Periods
from billing.store.released import released_table


def data_versions(
    layout: DataLayout, periods: Periods, through_batch: int | None = None, whole_days: bool = False
) -> dict[str, int]:
    """Per period with data, the largest micro-batch id of the files that can change its bill: its clicks and
    impressions, the impressions of the period before it, the clicks of the periods beside it (the invalid traffic
    rules look a minute around a click), and its ledger; with `whole_days` (budgets: a click's charge depends on the
    day's clicks before it), the files of the earlier periods of its UTC day too. Batches after `through_batch` (not
    committed yet) are left out, so that a period is reconciled again once they are.

    A record released from quarantine (`attribution.release`, listed in `billing.store.released`) keeps the time
    Kafka received it, so it may be the first copy of its id to arrive, and change the bills of every period holding
    another copy: its batch counts for those periods too, as if the copy were its own."""
    newest: dict[tuple[str, str], int] = defaultdict(lambda: -1)
    released = released_table(layout, ds.field("reason").is_null())
    for row in released.select(["event_type", "copy_periods", "batch_id"]).to_pylist():
        if through_batch is not None and row["batch_id"] > through_batch:
            continue
        for period in row["copy_periods"] or []:
            newest[(row["event_type"], period)] = max(newest[(row["event_type"], period)], row["batch_id"])
    bases = {
        "click": layout.archive_of("click"),
        "impression": layout.archive_of("impression"),
        "ledger": layout.ledger,
    }
    for kind, base in bases.items():
        for period_dir in base.glob("period=*") if base.exists() else []:
            period = period_dir.name.removeprefix("period=")
            for batch_dir in period_dir.glob("batch_id=*"):
                batch = int(batch_dir.name.removeprefix("batch_id="))
                if through_batch is not None and batch > through_batch:
                    continue
                newest[(kind, period)] = max(newest[(kind, period)], batch)
    versions: dict[str, int] = {}
    for (kind, period), batch in newest.items():
        touched = [period]
        start = periods.parse_key(period)
        if kind in ("impression", "click"):
            touched.append(periods.key(start + periods.length_ms))
        if kind == "click":
            touched.append(periods.key(start - periods.length_ms))
        for p in touched:
            if p != period and (("click", p) not in newest and ("ledger", p) not in newest):
                continue  # the events of one period alone do not make another exist
            versions[p] = max(versions.get(p, -1), batch)
    if whole_days:
        newest_of_day: dict[int, int] = {}
        for period in sorted(versions, key=periods.parse_key):
            day = periods.parse_key(period) // DAY_MS
            newest_of_day[day] = max(newest_of_day.get(day, -1), versions[period])
            versions[period] = newest_of_day[day]
    return versions
