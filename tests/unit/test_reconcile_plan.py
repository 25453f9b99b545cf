"""Which periods reconciliation takes up, where adjustments are booked, and `adbill export`'s refusals."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attribution.batch_output import write_batch_files
from attribution.release import ARCHIVE_SCHEMA, release_quarantined
from billing.catalog import Ad, AdChange, Catalog
from billing.layout import DataLayout
from billing.periods import Periods
from billing.reconcile_plan import PeriodState, StreamPosition, mark_changed, open_period, plan_run
from billing.schemas import schema_text
from billing.store.data_versions import data_versions
from ops.reconcile import export_periods
from ops.settings import Settings
from ops.times import parse_time

H = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
P0, P1, P2 = "20260101T0000Z", "20260101T0100Z", "20260101T0200Z"
HORIZON = 900_000


CAUGHT_UP = StreamPosition(committed={"clicks": {0: 10, 1: 5}}, end={"clicks": {0: 10, 1: 5}}, silent_for_ms=1_000)


@pytest.mark.parametrize(
    ("now", "until", "states", "versions", "due"),
    [
        # P0 ends at 01:00; its horizon passes at 01:15 exactly: due then, not a millisecond before.
        (T0 + H + HORIZON - 1, None, {}, {P0: 3}, []),
        (T0 + H + HORIZON, None, {}, {P0: 3}, [P0]),
        # --until closes every period that ends by then, whatever the horizon.
        (T0, T0 + 2 * H, {}, {P0: 3, P1: 4, P2: 5}, [P0, P1]),
        # A closed period is taken up again only when its data version grew (late data for it).
        (T0 + 5 * H, None, {P0: PeriodState(3, T0 + H)}, {P0: 3}, []),
        (T0 + 5 * H, None, {P0: PeriodState(3, T0 + H)}, {P0: 4}, [P0]),
        # An open period that was reconciled but not closed is still due once its horizon passed.
        (T0 + 5 * H, None, {P1: PeriodState(2)}, {P1: 2}, [P1]),
    ],
)
def test_due_periods_with_the_stream_caught_up(
    now: int, until: int | None, states: dict, versions: dict, due: list[str]
) -> None:
    plan = plan_run(versions, states, Periods(), now, HORIZON, CAUGHT_UP, until)
    assert plan.due == due
    assert plan.held == {}


AT_HORIZON = {"clicks": {0: 100, 1: 50}}
"""Kafka's end offsets when P0's horizon was first found passed."""


@pytest.mark.parametrize(
    ("committed", "silent_for_ms", "held"),
    [
        # Alive and read everything Kafka held at the horizon: closes.
        ({"clicks": {0: 100, 1: 50}}, 5_000, None),
        # Read beyond it (more traffic came since): closes; records after the horizon become adjustments.
        ({"clicks": {0: 180, 1: 75}}, 5_000, None),
        # One partition short by 3 records: held, and says how far behind.
        ({"clicks": {0: 97, 1: 50}}, 5_000, "held: the streaming job is 3 record(s) behind"),
        # Far behind: a readable count.
        ({"clicks": {0: 0, 1: 0}}, 5_000, "held: the streaming job is 150 record(s) behind"),
        # Never committed a batch.
        (None, 5_000, "held: the streaming job has not committed a batch yet"),
        # Caught up but silent for 22 minutes: down, held (the limit is 2 minutes).
        ({"clicks": {0: 100, 1: 50}}, 22 * 60_000, "held: the streaming job has been down for 22 min"),
        # Exactly at the liveness limit: still alive.
        ({"clicks": {0: 100, 1: 50}}, 120_000, None),
        # Never reported at all.
        ({"clicks": {0: 100, 1: 50}}, None, "held: the streaming job has never reported"),
    ],
)
def test_a_period_past_its_horizon_closes_only_once_the_stream_has_passed_it(
    committed: dict | None, silent_for_ms: int | None, held: str | None
) -> None:
    position = StreamPosition(committed=committed, end={"clicks": {0: 500, 1: 500}}, silent_for_ms=silent_for_ms)
    states = {P0: PeriodState(3, target_offsets=AT_HORIZON)}
    plan = plan_run({P0: 3}, states, Periods(), T0 + 5 * H, HORIZON, position)
    if held is None:
        assert (plan.due, plan.closing, plan.held) == ([P0], [P0], {})
    else:
        assert (plan.due, plan.closing, plan.held) == ([], [], {P0: held})
    assert plan.targets == {}, "the target recorded at the horizon is kept, not moved to today's end offsets"


def test_a_job_waiting_for_disk_space_holds_the_period_and_says_so_not_that_it_is_down() -> None:
    # Silent for 5 minutes, as a job whose query stopped on a full disk is: its status record says why.
    waiting = StreamPosition(
        committed={"clicks": {0: 100, 1: 50}},
        end={"clicks": {0: 500, 1: 500}},
        silent_for_ms=5 * 60_000,
        waiting="waiting for disk space for 5 min",
    )
    plan = plan_run({P0: 3}, {P0: PeriodState(3, target_offsets=AT_HORIZON)}, Periods(), T0 + 5 * H, HORIZON, waiting)
    assert plan.held == {P0: "held: the streaming job is waiting for disk space for 5 min"}
    # Caught up and reporting, but waiting (a batch's write failed on a full disk and is tried again): still held.
    caught_up = StreamPosition(
        committed={"clicks": {0: 100, 1: 50}}, end={"clicks": {0: 500, 1: 500}}, silent_for_ms=0, waiting="waiting"
    )
    plan = plan_run({P0: 3}, {P0: PeriodState(3, target_offsets=AT_HORIZON)}, Periods(), T0 + 5 * H, HORIZON, caught_up)
    assert plan.held == {P0: "held: the streaming job is waiting"}


def test_the_first_run_past_the_horizon_records_kafkas_end_offsets_as_the_target() -> None:
    position = StreamPosition(committed={"clicks": {0: 40}}, end={"clicks": {0: 90}}, silent_for_ms=0)
    plan = plan_run({P0: 3, P1: 4}, {}, Periods(), T0 + H + HORIZON, HORIZON, position)
    # P0's horizon passed: its target is what Kafka holds now, and the job has not read it all.
    assert plan.targets == {P0: {"clicks": {0: 90}}}
    assert plan.held == {P0: "held: the streaming job is 50 record(s) behind"}
    # P1's horizon has not passed: neither due nor held, no target.
    assert plan.due == [] and P1 not in plan.targets


def test_force_closes_ahead_of_the_stream_and_closed_periods_never_wait_for_it() -> None:
    down = StreamPosition(committed=None, end={"clicks": {0: 90}}, silent_for_ms=None)
    forced = plan_run({P0: 3}, {}, Periods(), T0, HORIZON, down, until_ms=T0 + H, force=True)
    assert (forced.due, forced.closing, forced.held) == ([P0], [P0], {})
    # A closed period with new data takes adjustments whatever the stream does: they never change its export.
    later = plan_run({P0: 4}, {P0: PeriodState(3, T0 + H)}, Periods(), T0 + 5 * H, HORIZON, down)
    assert (later.due, later.closing, later.held) == ([P0], [], {})


CATALOG = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR")])


def backfilled(catalog: Catalog, at_ms: int, cpc_micros: int) -> Catalog:
    return catalog.with_change(AdChange("ad-1", at_ms, cpc_micros), T0 + 5 * H, backfill=True)


@pytest.mark.parametrize(
    ("catalog", "recorded", "due", "alike"),
    [
        # Reconciled with the catalog as it stands: nothing to do.
        (CATALOG, 0, [], []),
        # A back-fill from inside P0 re-prices P0 and every later hour; P0's clicks before it are not re-priced,
        # but which of its clicks fall after is for the final bills to say.
        (backfilled(CATALOG, T0 + 30 * 60_000, 400_000), 0, [P0, P1], []),
        # From P1's first millisecond on: P0 is priced as before (its recorded version moves on), P1 is due.
        (backfilled(CATALOG, T0 + H, 400_000), 0, [P1], [P0]),
        # From P0's last millisecond: P0 is due.
        (backfilled(CATALOG, T0 + H - 1, 400_000), 0, [P0, P1], []),
        # The same price again, back-filled: nothing moves.
        (backfilled(CATALOG, T0, 250_000), 0, [], [P0, P1]),
        # Reconciled with the back-fill already (version 1): not again.
        (backfilled(CATALOG, T0, 400_000), 1, [], []),
        # A state from before the catalog version was kept: reconciled once more, with the run's catalog.
        (CATALOG, None, [P0, P1], []),
        # A catalog older than the version recorded was replaced, not changed: every closed period again.
        (CATALOG, 4, [P0, P1], []),
    ],
)
def test_a_closed_period_is_due_again_when_a_catalog_change_since_its_reconciliation_reprices_it(
    catalog: Catalog, recorded: int | None, due: list[str], alike: list[str]
) -> None:
    states = {p: PeriodState(3, T0 + 2 * H, catalog_version=recorded) for p in (P0, P1)}
    plan = plan_run({P0: 3, P1: 3}, states, Periods(), T0 + 5 * H, HORIZON, CAUGHT_UP, catalog=catalog)
    assert (plan.due, plan.repriced, plan.closing, plan.priced_alike) == (due, due, [], alike)
    # Without the catalog (as before it was looked at), only new data makes a closed period due.
    assert plan_run({P0: 3, P1: 3}, states, Periods(), T0 + 5 * H, HORIZON, CAUGHT_UP).due == []


def test_unknown_end_offsets_hold_every_period_that_would_close() -> None:
    unknown = StreamPosition(committed={"clicks": {0: 1}}, end=None, silent_for_ms=0, error="broker down")
    plan = plan_run({P0: 3}, {}, Periods(), T0 + 5 * H, HORIZON, unknown)
    assert plan.held == {P0: "held: Kafka's end offsets are unknown (broker down)"}
    assert plan.targets == {}


def test_adjustments_are_booked_in_the_period_of_now_or_until_whichever_is_later() -> None:
    assert open_period(Periods(), T0 + 90 * 60_000) == P1
    assert open_period(Periods(), T0, until_ms=T0 + 2 * H) == P2


@pytest.mark.parametrize(
    ("text", "ms"),
    [("1767225600000", T0), ("2026-01-01T00:00Z", T0), ("2026-01-01T01:00:00+01:00", T0), ("2026-01-01T00:00", T0)],
)
def test_parse_time(text: str, ms: int) -> None:
    assert parse_time(text) == ms


def test_parse_time_refuses_nonsense() -> None:
    with pytest.raises(SystemExit, match="neither epoch ms nor an ISO-8601"):
        parse_time("yesterday")


def test_export_refuses_a_period_that_is_not_closed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings.from_env({}, home=tmp_path)
    assert export_periods(settings, P0, P1, tmp_path / "out") == 1
    assert "not closed yet (no export): 20260101T0000Z, 20260101T0100Z" in capsys.readouterr().err
    assert export_periods(settings, P1, P0, tmp_path / "out") == 2
    assert export_periods(settings, "last week", None, tmp_path / "out") == 2


def archived(layout: DataLayout, batch_id: int, rows: list[tuple[str, str, int, int]]) -> None:
    """Archive rows (event type, id, event time, received ms) of ad-1 and user u1, written as batch `batch_id`."""
    table = pa.Table.from_pylist(
        [
            {
                "event_type": event_type,
                "event_id": event_id,
                "ad_id": "ad-1",
                "user_id": "u1",
                "event_time": at,
                "received_ms": received,
                "topic": f"{event_type}s",
                "partition": 0,
                "offset": n,
                "value": b"",
                "late": False,
                "period_start_ms": Periods().start_of(at),
                "period": Periods().key_of(at),
                "batch_id": batch_id,
            }
            for n, (event_type, event_id, at, received) in enumerate(rows)
        ],
        schema=ARCHIVE_SCHEMA,
    )
    write_batch_files(table, layout.archive, ("event_type", "period", "batch_id"))


def test_a_released_copy_takes_up_again_every_period_holding_another_copy_of_its_id(tmp_path: Path) -> None:
    """Copy R of click c (an unknown schema id, quarantined, received at 00:59:59.900) and copy B (received at
    01:00:00.100), both 5 s or less after impression i: the stream bills B in P1, and P0 and P1 close. Once the
    id is known, R is released into P0; it arrived first, so it stands and B is a conflict: P1, which holds B,
    must be reconciled again with P0 (an adjustment retracts B there)."""
    layout = DataLayout(tmp_path)
    impression_at, r_at, b_at = T0 + H - 5_000, T0 + H - 100, T0 + H + 100
    archived(layout, 4, [("impression", "i", impression_at, impression_at), ("click", "c", b_at, b_at)])
    body = io.BytesIO()
    record = {"click_id": "c", "ad_id": "ad-1", "user_id": "u1", "event_time": r_at}
    fastavro.schemaless_writer(body, fastavro.parse_schema(json.loads(schema_text("click"))), record)
    pq.write_table(
        pa.table(
            {
                "reason": ["unknown_schema"],
                "topic": ["clicks"],
                "partition": pa.array([0], pa.int32()),
                "offset": pa.array([7], pa.int64()),
                "received_ms": pa.array([r_at], pa.int64()),
                "value": [b"\x00" + (9).to_bytes(4, "big") + body.getvalue()],
            }
        ),
        make_dirs(layout.quarantine / "batch_id=3") / "part-00000.parquet",
    )
    closed = {P0: PeriodState(4, T0 + 2 * H), P1: PeriodState(4, T0 + 2 * H)}
    assert plan_run(data_versions(layout, Periods()), closed, Periods(), T0 + 5 * H, HORIZON, CAUGHT_UP).due == []

    released = release_quarantined(
        layout, 6, {"click": {9: schema_text("click")}}, {"clicks": "click"}, Periods(), {"ad-1": "adv-1"}
    )
    assert released.events.column("event_id").to_pylist() == ["c"]
    assert released.settled.column("copy_periods").to_pylist() == [[P1]]
    assert released.periods == {P0, P1}
    versions = data_versions(layout, Periods())
    assert versions == {P0: 6, P1: 6}
    assert plan_run(versions, closed, Periods(), T0 + 5 * H, HORIZON, CAUGHT_UP).due == [P0, P1]
    # Released by reconciliation into a batch both periods had already seen: their states are marked changed.
    assert mark_changed(closed, released.periods, 4)
    assert closed == {P0: PeriodState(3, T0 + 2 * H), P1: PeriodState(3, T0 + 2 * H)}


def make_dirs(folder: Path) -> Path:
    folder.mkdir(parents=True)
    return folder
