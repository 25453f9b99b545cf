"""`adbill reconcile --every` (in `adbill up`) runs the audit after each reconciliation run that closed a period, so
that finance's page says the books are proven, under the run lock (no compaction meanwhile); a failing audit is said
and the schedule goes on."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import attribution.audit
import ops.reconcile
from attribution.audit import PeriodAudit
from billing.catalog import Catalog
from ops.reconcile import audit_after_run, audit_outcome, reconcile_config
from ops.settings import Settings


def test_the_audit_runs_after_a_reconciliation_run_and_its_outcome_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings.from_env({}, home=tmp_path)
    config = dataclasses.replace(reconcile_config(settings), database_url=None)  # the data folder's run lock only
    catalog = Catalog([])
    recorded: list[list[PeriodAudit]] = []
    balanced = PeriodAudit("20260101T0000Z", True, 3, {"EUR": 750_000}, 3, {"EUR": 750_000})
    monkeypatch.setattr(attribution.audit, "audit", lambda spark, config, catalog: [balanced])
    monkeypatch.setattr(ops.reconcile, "record_audit", lambda config, audits: recorded.append(audits))
    audit_after_run(object(), config, catalog)
    assert recorded == [[balanced]]
    assert "all 1 period(s) balance" in capsys.readouterr().out

    def broken(*args: Any) -> list[PeriodAudit]:
        raise RuntimeError("Spark went away")

    monkeypatch.setattr(attribution.audit, "audit", broken)
    audit_after_run(object(), config, catalog)  # said, not raised
    assert "the audit after the run failed: Spark went away" in capsys.readouterr().err


def test_the_outcome_keeps_closed_periods_that_differ_apart_from_open_ones_awaiting_close() -> None:
    closed_ok = PeriodAudit("20260101T0800Z", True, 3, {"EUR": 750_000}, 3, {"EUR": 750_000})
    closed_off = PeriodAudit("20260101T0900Z", True, 3, {"EUR": 750_000}, 2, {"EUR": 500_000})
    open_off = PeriodAudit("20260101T1000Z", False, 2, {"EUR": 500_000}, 1, {"EUR": 250_000})
    outcome = audit_outcome([closed_ok, closed_off, open_off], 1_767_261_960_000)
    assert outcome["differences"] == ["20260101T0900Z"], "a failure: what finance was given differs"
    assert outcome["awaiting_close"] == ["20260101T1000Z"], "no failure: the close corrects it"
    assert outcome["periods"] == 3
    assert outcome["rule_micros_by_currency"] == {"EUR": 2_000_000}
    assert audit_outcome([closed_ok, open_off], 0)["differences"] == []
