"""Closing follows the stream, on the real stack: a job down past the horizon holds its periods, a forced close
turns what the stream bills later into adjustments, a period of adjustments alone closes too, `audit` proves the
books, and a reconciliation stopped at any step is completed by the next run with nothing twice."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from attribution.audit import audit
from attribution.job import start
from attribution.stream_position import committed_offsets, end_offsets
from billing.catalog import Catalog
from billing.events import Click, Impression
from billing.export import export_totals
from billing.periods import Periods
from billing.reconcile_run import HeldError, ReconcileBusyError
from billing.store.export_files import export_folder, read_export, verify_export
from billing.store.schema_registry import open_registry
from ops.reconcile import ReconcileConfig, audit_table, reconcile, reconcile_config, run_lock
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from producers.publisher import EventPublisher
from producers.simulator import SimulationConfig
from producers.wire import EventSerializer
from tests import oracle
from tests.conftest import child_env
from tests.integration.test_reconcile import corrections, read_back, while_open
from tests.integration.test_stream_job import wait_for
from tests.redis_figures import RedisFigures

pytestmark = pytest.mark.integration

H = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
P0, P1 = "20260101T0000Z", "20260101T0100Z"
UNTIL = T0 + 2 * H  # closes P0 and P1
PAST_HORIZONS = UNTIL + 900_000 + 60_000  # a clock on which both periods' lateness horizons have passed


def pairs(tag: str, start_ms: int, n: int, catalog: Catalog, gap_ms: int = 2_000) -> list[Impression | Click]:
    """`n` impression-click pairs from `start_ms` on, one user each, spread over the catalog's ads; a pair in
    five has its click 11 s after the impression (not billable), the rest `gap_ms` after."""
    ads = list(catalog)
    events: list[Impression | Click] = []
    for i in range(n):
        ad = ads[i % len(ads)]
        at = start_ms + i * 1_000
        user = f"{tag}-u{i}"
        events.append(Impression(f"{tag}-i{i}", ad.ad_id, user, at))
        events.append(Click(f"{tag}-c{i}", ad.ad_id, user, at + (11_000 if i % 5 == 4 else gap_ms)))
    return events


def publish(settings: Settings, events: list[Impression | Click]) -> None:
    publisher = EventPublisher(
        settings.kafka_bootstrap, EventSerializer(open_registry(settings.registry_location)), settings.topics
    )
    for event in events:
        publisher.publish_event(event)
    assert publisher.flush(30) == 0


def drained(settings: Settings) -> bool:
    """The billing query has committed every record the topics hold."""
    committed = committed_offsets(settings.root / "checkpoints" / "billing") or {}
    end = end_offsets(settings.kafka_bootstrap, [settings.topic_impressions, settings.topic_clicks])
    return all(committed.get(t, {}).get(p, 0) >= o for t, parts in end.items() for p, o in parts.items())


def exported_by_click(settings: Settings, periods: list[str]) -> dict[str, int]:
    """Click id -> net micros over every export given: click rows and adjustment rows together."""
    net: Counter[str] = Counter()
    clicks: Counter[str] = Counter()
    for period in periods:
        folder = export_folder(settings.root, period)
        assert verify_export(folder) == []
        for row in read_export(folder).to_pylist():
            net[row["click_id"]] += row["net_micros"]
            if row["record_type"] == "click":
                clicks[row["click_id"]] += row["status"] != "retracted"
            else:
                clicks[row["click_id"]] += 1 if row["status"] == "added" else -1
    assert set(clicks.values()) <= {0, 1}, "a click is billed once or not at all over all exports"
    return {click: net[click] for click, n in clicks.items() if n == 1}


def redis_matches_exports(settings: Settings, periods: list[str]) -> None:
    """A closed period's figures in Redis (provisional + corrections booked in it) are its export's, per ad."""
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    for period in periods:
        want = {
            item: (c, m)
            for (level, item), (c, m, _) in export_totals(
                read_export(export_folder(settings.root, period)).to_pylist()
            ).items()
            if level == "ad"
        }
        have = {}
        for adv in totals.advertisers(period):
            for ad in totals.ads(period, adv):
                t, fix = totals.ad(period, ad), totals.corrections_of(period, "ad", ad)
                if (t.clicks + fix.clicks, t.micros + fix.micros) != (0, 0):
                    have[ad] = (t.clicks + fix.clicks, t.micros + fix.micros)
        assert have == {ad: v for ad, v in want.items() if v != (0, 0)}, period


def test_a_job_down_past_the_horizon_holds_closing_and_a_forced_close_books_later_bills_as_adjustments(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    catalog = SimulationConfig(events=10, seed=5).catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    env = child_env(settings, ADBILL_METRICS_PORT="0", ADBILL_TRIGGER_MS="500")
    log = (tmp_path / "job.log").open("ab")

    def start_job() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "ops.cli", "stream"], env=env, stdout=log, stderr=log)

    # Part A: traffic of both periods, billed by the job, which is then killed.
    part_a = pairs("a0", T0 + 30 * 60_000, 100, catalog) + pairs("a1", T0 + H + 30 * 60_000, 100, catalog)
    publish(settings, part_a)
    job = start_job()
    try:
        wait_for(lambda: drained(settings), "the job to read part A", 180)
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=30)
    # Part B arrives while the job is down: more of P0 (behind the watermark by then) and of P1 (on time).
    part_b = pairs("b0", T0 + 40 * 60_000, 60, catalog) + pairs("b1", T0 + H + 32 * 60_000, 60, catalog)
    publish(settings, part_b)

    # The clock passes both horizons: the job is down and behind, so both periods are held, with the reason.
    rc = dataclasses.replace(reconcile_config(settings), alive_within_ms=3_000)
    time.sleep(3.5)
    held = reconcile(spark, rc, catalog, clock=lambda: PAST_HORIZONS)
    assert held.closed == [] and set(held.held) == {P0, P1}, held.held
    assert all(reason.startswith("held: the streaming job has been down for") for reason in held.held.values())
    assert not export_folder(settings.root, P0).exists()
    # A back-fill ahead of the stream is refused unless forced.
    with pytest.raises(HeldError, match="--force"):
        reconcile(spark, rc, catalog, until_ms=UNTIL)
    assert not export_folder(settings.root, P0).exists()

    forced = reconcile(spark, rc, catalog, until_ms=UNTIL, force=True)
    assert forced.closed == [P0, P1]
    exports_at_close = {p: read_export(export_folder(settings.root, p)) for p in (P0, P1)}
    assert {r["click_id"][:2] for p in (P0, P1) for r in exports_at_close[p].to_pylist()} == {"a0", "a1"}
    redis_matches_exports(settings, [P0, P1])

    # The job comes back and reads part B: it bills P1's clicks into the closed period's ledger (and archives
    # P0's as late). Redis keeps showing the closed periods as their exports.
    job = start_job()
    try:
        wait_for(lambda: drained(settings), "the job to read part B", 180)
        ledger = read_ledger_ids(settings)
        assert any(c.startswith("b1-") for c in ledger), "the stream should bill part B of P1 after the close"
        redis_matches_exports(settings, [P0, P1])

        # The next run books what finance was not given, in the open period, pointing at the closed ones.
        rc = reconcile_config(settings)
        later, open_periods = while_open(lambda: reconcile(spark, rc, catalog))
        adjustments = [c for c in corrections(settings) if c.booked_period in open_periods]
        booked = {c.booked_period for c in adjustments}
        assert len(booked) == 1, booked
        open_period = booked.pop()
        assert {c.corrects_period for c in adjustments} == {P0, P1}
        assert {c.reason for c in adjustments if c.corrects_period == P1} == {"billed_after_close"}
        assert {c.reason for c in adjustments if c.corrects_period == P0} <= {"late_click", "late_impression"}
        assert later.additions == len(adjustments) > 0 and later.closed == []
        for period in (P0, P1):  # the exports did not change
            assert read_export(export_folder(settings.root, period)).equals(exports_at_close[period])

        # The open period holds nothing but adjustments; it closes once its end is passed, without --force: the
        # job is alive and has read everything.
        end_of_open = Periods().parse_key(open_period) + H
        closing = reconcile(spark, rc, catalog, until_ms=end_of_open)
        assert closing.closed == [open_period], closing.held
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)

    # Every export together bills exactly the rule over every event received: the same clicks, the same micros.
    expected = {
        row["click_id"]: row["amount_micros"]
        for row in oracle.billable(read_back(settings, len(part_a) + len(part_b)), catalog)
    }
    exported = exported_by_click(settings, [P0, P1, open_period])
    assert exported == expected
    total = sum(
        pc.sum(read_export(export_folder(settings.root, p))["net_micros"]).as_py() for p in (P0, P1, open_period)
    )
    assert total == sum(expected.values())
    print(
        f"\nclosing: rule {len(expected)} clicks / {sum(expected.values())} micros; exports {len(exported)} clicks / "
        f"{total} micros; difference {total - sum(expected.values())}"
    )

    # The audit says so. It holds a closed period's adjustments to what finance was given, the export of the period
    # that carries them: a correction file gone changes nothing there (a difference planted in the exports is
    # found: `test_the_audit_checks_a_closed_periods_adjustments_against_the_exports_that_carry_them`).
    audits = audit(spark, rc, catalog)
    print(audit_table(audits))
    assert [a.period for a in audits] == [P0, P1, open_period] and all(a.balanced for a in audits)
    planted = next((settings.root / "corrections" / f"period={P1}").glob("*.parquet"))
    planted.unlink()
    after = {a.period: a for a in audit(spark, rc, catalog)}
    assert after[P1].balanced and (after[P1].books_clicks, after[P1].books_micros) == (
        audits[1].books_clicks,
        audits[1].books_micros,
    )
    assert after[P0].balanced


def read_ledger_ids(settings: Settings) -> set[str]:
    from billing.store.parquet_ledger import read_ledger

    return set(read_ledger(settings.root / "ledger")["click_id"].to_pylist())


class Stop(BaseException):
    """Stands for a SIGKILL: the run ends at this step, nothing after it happens (only the lock is released,
    as the operating system releases it for a killed process)."""


def stop_at(step: str | re.Pattern[str]):  # type: ignore[no-untyped-def]
    """A progress callback that stops the run at the message `step` (or the first one the pattern matches)."""

    def progress(message: str) -> None:
        if message == step or (isinstance(step, re.Pattern) and step.fullmatch(message)):
            raise Stop(message)

    return progress


def test_a_reconciliation_stopped_at_any_step_is_completed_by_the_next_with_nothing_twice(
    spark: SparkSession, settings: Settings
) -> None:
    catalog = SimulationConfig(events=10, seed=6).catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    on_time = pairs("s0", T0 + 30 * 60_000, 40, catalog) + pairs("s1", T0 + H + 30 * 60_000, 40, catalog)
    publish(settings, on_time)
    queries = start(spark, stream_config(settings))
    try:
        queries[0].processAllAvailable()
        # Late pairs of both periods (behind the watermark): reconciliation must add them.
        late = pairs("l0", T0 + 31 * 60_000, 10, catalog) + pairs("l1", T0 + H + 10 * 60_000, 10, catalog)
        publish(settings, late)
        queries[0].processAllAvailable()
        rc: ReconcileConfig = reconcile_config(settings)

        # A second run while one holds the lock does nothing, and says so.
        with run_lock(rc), pytest.raises(ReconcileBusyError, match="another reconciliation run holds"):
            reconcile(spark, rc, catalog, until_ms=UNTIL)

        steps = [
            f"period {P0}: 8 new correction(s) written",  # the corrections file, before Redis
            f"period {P0}: corrections applied to Redis",  # Redis, before the export
            f"period {P0}: exported",  # the export folder, before Redis knows the period closed
            f"period {P1}: closed in Redis",  # everything but the state file
        ]
        for step in steps:
            with pytest.raises(Stop):
                reconcile(spark, rc, catalog, until_ms=UNTIL, progress=stop_at(step))
        reconcile(spark, rc, catalog, until_ms=UNTIL)
        again = reconcile(spark, rc, catalog, until_ms=UNTIL)
        assert again.periods == [] and (again.additions, again.retractions) == (0, 0)
    finally:
        for query in queries:
            query.stop()

    every = corrections(settings)
    assert len(every) == len({c.correction_id for c in every}) == 16, "each correction written once"
    assert Counter(c.reason for c in every) == {"late_click": 16}
    expected = {
        row["click_id"]: row["amount_micros"]
        for row in oracle.billable(read_back(settings, len(on_time) + len(late)), catalog)
    }
    assert exported_by_click(settings, [P0, P1]) == expected
    # Redis applied each correction once and shows each closed period as its export.
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    applied: dict[str, int] = defaultdict(int)
    for c in every:
        applied[c.booked_period] += c.amount_micros
    for period in (P0, P1):
        booked = sum(totals.corrections_of(period, "adv", adv).micros for adv in totals.advertisers(period))
        assert booked == applied[period]
    redis_matches_exports(settings, [P0, P1])
    assert totals.closed_periods() == [P0, P1]


def test_a_batch_committed_while_a_run_reads_is_in_neither_its_final_bills_nor_its_ledger(
    spark: SparkSession, settings: Settings
) -> None:
    # The run reads the archive (the final bills), then the ledger; a batch the stream commits in between, with a
    # bill for the period being closed, must not make the export show that click retracted.
    from billing.reconcile_run import reconcile_periods
    from billing.store.parquet_ledger import read_ledger
    from ops.reconcile import reconcile_ports

    catalog = SimulationConfig(events=10, seed=15).catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    publish(settings, pairs("b0", T0 + 30 * 60_000, 10, catalog))
    queries = start(spark, stream_config(settings))
    try:
        queries[0].processAllAvailable()
        rc = reconcile_config(settings)
        ports = reconcile_ports(spark, rc, catalog, lambda: T0 + H + rc.horizon_ms + 1)
        between = pairs("b1", T0 + 35 * 60_000, 1, catalog)

        def final_bills_then_a_batch(due: list[str]):  # type: ignore[no-untyped-def]
            bills = ports.final_bills(due)
            publish(settings, between)
            queries[0].processAllAvailable()
            assert "b1-c0" in set(read_ledger(settings.root / "ledger")["click_id"].to_pylist())
            return bills

        first = reconcile_periods(
            dataclasses.replace(ports, final_bills=final_bills_then_a_batch), Periods(), rc.horizon_ms
        )
        assert first.closed == [P0]
        rows = [r for r in read_export(export_folder(settings.root, P0)).to_pylist() if r["click_id"] == "b1-c0"]
        assert rows == [], "the export neither bills nor retracts a click its run did not read"
        # The next run books it as an adjustment of the closed period, once.
        second = reconcile(spark, rc, catalog, clock=lambda: T0 + H + rc.horizon_ms + 2)
        assert (second.additions, second.retractions) == (1, 0)
        assert [(c.click_id, c.corrects_period) for c in corrections(settings) if c.click_id == "b1-c0"] == [
            ("b1-c0", P0)
        ]
    finally:
        queries[0].stop()


def test_the_audit_checks_a_closed_periods_adjustments_against_the_exports_that_carry_them(
    spark: SparkSession, settings: Settings
) -> None:
    import os
    import shutil

    from billing.store.export_files import write_export

    catalog = SimulationConfig(events=10, seed=16).catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    publish(settings, pairs("a0", T0 + 30 * 60_000, 10, catalog))
    queries = start(spark, stream_config(settings))
    try:
        queries[0].processAllAvailable()
        rc = reconcile_config(settings)
        horizon = rc.horizon_ms
        assert reconcile(spark, rc, catalog, clock=lambda: T0 + H + horizon + 1).closed == [P0]
        # A bill of P0 after its close: an adjustment booked in the open period P2, closed in its turn.
        publish(settings, pairs("a1", T0 + 35 * 60_000, 1, catalog))
        queries[0].processAllAvailable()
        booked = reconcile(spark, rc, catalog, clock=lambda: T0 + 2 * H + horizon + 1)
        assert booked.additions == 1
        p2 = Periods().key(T0 + 2 * H)
        assert p2 in reconcile(spark, rc, catalog, clock=lambda: T0 + 3 * H + horizon + 1).closed
    finally:
        queries[0].stop()
    assert all(a.balanced for a in audit(spark, rc, catalog))

    # P2's export, as finance has it, lacks the adjustment (the correction file still holds it): P0 does not balance.
    folder = export_folder(settings.root, p2)
    table = read_export(folder)
    assert table.filter(pc.equal(table["record_type"], "adjustment")).num_rows == 1
    manifest_closed_at = json.loads((folder / "manifest.json").read_text())["closed_at_ms"]
    for path in [folder, *folder.iterdir()]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    shutil.rmtree(folder)
    start_ms = Periods().parse_key(p2)
    kept = table.filter(pc.not_equal(table["record_type"], "adjustment"))
    write_export(settings.root, p2, kept, start_ms, start_ms + H, manifest_closed_at)
    audits = {a.period: a for a in audit(spark, rc, catalog)}
    assert not audits[P0].balanced, audits[P0]


def test_the_audit_reads_the_archive_and_the_ledger_as_of_one_committed_batch(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The audit plans its read of the archive, then reads the ledger; a batch the stream commits in between has its
    # events outside the archive's read and its bill inside the ledger's: the audit must not report that as a
    # difference ("DIFFERS by +1 click" under live traffic, with nothing wrong in the books).
    # The audit's final charges (`attribution.final_bills.final_charges`) plan the read in `final_bills`.
    import attribution.final_bills as audit_module

    catalog = SimulationConfig(events=10, seed=17).catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    publish(settings, pairs("d0", T0 + 30 * 60_000, 5, catalog))
    queries = start(spark, stream_config(settings))
    try:
        queries[0].processAllAvailable()
        real_final_bills = audit_module.final_bills

        def final_bills_then_a_batch(*args, **kwargs):  # type: ignore[no-untyped-def]
            planned = real_final_bills(*args, **kwargs)  # the archive's files are listed here
            publish(settings, pairs("d1", T0 + 35 * 60_000, 1, catalog))
            queries[0].processAllAvailable()
            return planned

        monkeypatch.setattr(audit_module, "final_bills", final_bills_then_a_batch)
        audits = audit(spark, reconcile_config(settings), catalog)
        assert [(a.period, a.rule_clicks, a.books_clicks, a.balanced) for a in audits] == [(P0, 4, 4, True)]
        # Read again, the new batch is in both.
        monkeypatch.setattr(audit_module, "final_bills", real_final_bills)
        assert [
            (a.rule_clicks, a.books_clicks, a.balanced) for a in audit(spark, reconcile_config(settings), catalog)
        ] == [(5, 5, True)]
    finally:
        queries[0].stop()
