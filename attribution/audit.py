"""The books, proven: the rule applied to every event received, per period, against what finance holds.

For a closed period that is its export's bills plus the adjustments booked for it in later periods, as the later
closed periods' exports carry them (what finance was given; an adjustment booked in a period still open, from its
correction file); for an open one, the stream's ledger plus its corrections (docs/billing-rules.md, "The books can be
proven at any time"). Compared click by click and charge by charge (`billing.corrections.check_reconciled`), with clicks
and micros summed beside, the micros per currency (no figure adds two).

A Spark batch job over the same archive as reconciliation (`attribution.final_bills`); it writes nothing but its
record, in Redis (`RedisTotals.record_audit`), which the finance page shows, and beside the reconciliation state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from attribution.epoch import CommittedBatch
from attribution.final_bills import final_charges
from attribution.stream_position import BILLING_QUERY
from billing.catalog import Catalog
from billing.corrections import Correction, CorrectionKind, check_reconciled, pending_adjustments
from billing.export import ExportStatus, RecordType
from billing.invalid import IvtRules
from billing.layout import DataLayout
from billing.money import Amounts
from billing.periods import Periods
from billing.store.corrections_arrow import CorrectionFiles
from billing.store.data_versions import data_versions
from billing.store.export_files import ExportFolders, read_export
from billing.store.parquet_ledger import ledger_up_to, read_ledger
from billing.store.period_states import closed_periods


class AuditConfig(Protocol):
    """What the audit reads and judges with: a data folder, the length of its periods and the invalid traffic
    rules (reconciliation's config, `ops.reconcile.ReconcileConfig`, is one)."""

    @property
    def layout(self) -> DataLayout: ...

    @property
    def period_ms(self) -> int: ...

    @property
    def ivt_rules(self) -> IvtRules: ...


@dataclass(frozen=True)
class PeriodAudit:
    """One period's books against the rule; micros per currency."""

    period: str
    closed: bool
    rule_clicks: int
    rule_micros: Amounts
    books_clicks: int
    books_micros: Amounts
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rule_micros", Amounts(self.rule_micros))
        object.__setattr__(self, "books_micros", Amounts(self.books_micros))

    @property
    def balanced(self) -> bool:
        return not self.problems and (self.rule_clicks, self.rule_micros.nonzero()) == (
            self.books_clicks,
            self.books_micros.nonzero(),
        )

    @property
    def currencies(self) -> list[str]:
        """Every currency either side names, sorted."""
        return sorted(self.rule_micros.keys() | self.books_micros.keys())


def audit(spark: SparkSession, config: AuditConfig, catalog: Catalog) -> list[PeriodAudit]:
    """Every period with events, bills, corrections or an export, oldest first."""
    periods = Periods(config.period_ms)
    layout = config.layout
    # The archive and the ledger as of one point, the batch the stream's checkpoint had committed when the audit
    # started: a batch the stream writes meanwhile is in neither, so a running stream makes no false difference.
    through = CommittedBatch(layout.checkpoint(BILLING_QUERY)).batch()
    exports = ExportFolders(layout)
    closed = closed_periods(layout)
    corrections = CorrectionFiles(layout).read()
    pending = pending_adjustments(corrections, closed)
    every = set(data_versions(layout, periods, through)) | closed | {c.corrects_period for c in corrections}
    if not every:
        return []
    ordered = sorted(every, key=periods.parse_key)
    # The whole contract: price, invalid traffic and budgets, as a reconciliation run applies it.
    final_all = final_charges(spark, layout, config.period_ms, ordered, catalog, through, config.ivt_rules).charged
    ledger = ledger_up_to(read_ledger(layout.ledger), through)
    given_adjustments = exported_adjustments(exports, sorted(closed))
    out = []
    for period in ordered:
        final = final_all.filter(pc.equal(final_all["period"], period)).drop(["period"])
        of_period = [c for c in corrections if c.corrects_period == period]
        if period in closed:
            # What finance was given: the export, and the adjustments as the later closed periods' exports carry
            # them (those booked in a period still open are in its correction files only, so far).
            books = exports.given(period)
            entries = given_adjustments.get(period, []) + [c for c in pending if c.corrects_period == period]
        else:
            books = ledger.filter(pc.equal(ledger["period"], period)).to_pylist()
            entries = of_period
        out.append(
            PeriodAudit(
                period=period,
                closed=period in closed,
                rule_clicks=final.num_rows,
                rule_micros=_micros(final),
                books_clicks=len(books) + sum(c.clicks for c in entries),
                books_micros=Amounts.of(
                    [(r["currency"], r["amount_micros"]) for r in books]
                    + [(c.currency, c.amount_micros) for c in entries]
                ),
                problems=check_reconciled(final.to_pylist(), books, entries),
            )
        )
    return out


def exported_adjustments(exports: ExportFolders, closed: list[str]) -> dict[str, list[Correction]]:
    """The adjustment rows of the closed periods' exports, as corrections, by the period they correct."""
    out: dict[str, list[Correction]] = {}
    for period in closed:
        closed_at = exports.closed_at_ms(period)
        for row in read_export(exports.layout.export(period)).to_pylist():
            if row["record_type"] != RecordType.ADJUSTMENT.value:
                continue
            added = row["status"] == ExportStatus.ADDED.value
            out.setdefault(row["corrects_period"], []).append(
                Correction.from_dict(
                    {
                        **row,
                        "kind": CorrectionKind.ADDITION if added else CorrectionKind.RETRACTION,
                        "amount_micros": row["net_micros"],
                        "created_at_ms": closed_at,
                    }
                )
            )
    return out


def _micros(table: pa.Table) -> Amounts:
    return Amounts.of_columns(table["currency"].to_pylist(), table["amount_micros"].to_pylist())
