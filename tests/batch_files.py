"""Small data folders of batch files, as the stream writes them, and a compaction stopped at one of its steps: what
the tests of compaction and of the click files build their folders with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from attribution.batch_output import write_batch_files
from attribution.release import ARCHIVE_SCHEMA
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store import compaction
from billing.store.compaction import compact_closed
from billing.store.parquet_ledger import LEDGER_SCHEMA

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
P0 = "20260101T0000Z"


def write_batch(root: Path, batch: int, period_start: int = T0) -> None:
    """Batch `batch`'s archive (two tasks' files, a click and an impression each) and ledger (the clicks), as the
    stream writes them: one file per task and folder, the partition columns in the paths."""
    periods = Periods()
    events, bills = [], []
    for task in (0, 1):
        at = period_start + batch * 1_000 + task
        click_id = f"c-{batch}-{task}"
        common = {"ad_id": "ad-1", "user_id": f"u-{task}", "received_ms": at, "topic": "clicks", "partition": task}
        common |= {"value": b"x", "user_agent": "ua", "ip": "10.0.0.1", "late": batch >= 10}
        common |= {"period_start_ms": periods.start_of(at), "period": periods.key_of(at), "batch_id": batch}
        events.append({**common, "event_type": "click", "event_id": click_id, "event_time": at, "offset": batch})
        events.append({**common, "event_type": "impression", "event_id": f"i-{batch}-{task}", "event_time": at - 5})
        bills.append(
            {
                "click_id": click_id, "impression_id": f"i-{batch}-{task}", "ad_id": "ad-1", "campaign_id": "cmp-1",
                "advertiser_id": "adv-1", "user_id": f"u-{task}", "click_time": at, "impression_time": at - 5,
                "amount_micros": 1_000_000, "currency": "EUR", "click_received_ms": at, "billed_at_ms": at + 100,
                "period_start_ms": periods.start_of(at), "period": periods.key_of(at), "batch_id": batch,
            }
        )  # fmt: skip
        layout = DataLayout(root)
        name = f"part-{task:05d}.parquet"
        table = pa.Table.from_pylist(events[-2:], schema=ARCHIVE_SCHEMA)
        write_batch_files(table, layout.archive, ("event_type", "period", "batch_id"), name, prune=False)
    ledger = pa.Table.from_pylist(bills, schema=LEDGER_SCHEMA)
    write_batch_files(ledger, DataLayout(root).ledger, ("period", "batch_id"))


class StoppedAt(Exception):
    """A compaction stopped right after one of its steps."""


def compact_ledger_stopped_at(layout: DataLayout, step: str) -> None:
    """Compacts P0's ledger files up to batch 4 and stops it right after `step` (one of `compaction.STEPS`), as a
    process that dies there: what it did until then is left in the data folder."""
    stopped_at(step, lambda: compact_closed(layout, [P0], 4, [k for k in compaction.KINDS if k.name == "ledger"]))


def stopped_at(step: str, compact: Callable[[], object]) -> None:
    """Runs `compact` and stops it right after `step` (one of `compaction.STEPS`), as a process that dies there."""

    def stop(name: str, target: Path) -> None:
        if name == step:
            raise StoppedAt(name)

    compaction.step_hook = stop
    try:
        with pytest.raises(StoppedAt):
            compact()
    finally:
        compaction.step_hook = None
