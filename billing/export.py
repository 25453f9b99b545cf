"""The finance export of a closed billing period: its rows, reconciled (the files are `billing.store.export_files`).

In: for one period, the final billable clicks, the stream's ledger rows, the corrections of the period (all booked
in it: it was open until it closed) and the adjustments booked in it (corrections of earlier, closed periods), as
plain rows. Out: the export's rows, as plain dicts in the order and with the columns of the export's schema
(`billing.store.export_files.EXPORT_SCHEMA`); what they bill per advertiser, campaign and ad (`export_totals`).

Rows: one `click` row per click the period billed, added or retracted, with its final status, then one
`adjustment` row per correction booked in the period for an earlier one. `net_micros` is what a row counts in this
period's bill, so `sum(net_micros)` is the period's reconciled total including adjustments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from billing.corrections import BillRow, Charge, Correction, CorrectionKind, check_reconciled


class RecordType(StrEnum):
    """What an export row is about."""

    CLICK = "click"
    """A click of the period, with its final status."""
    ADJUSTMENT = "adjustment"
    """A correction booked in this period for a click of an earlier, closed period."""


class ExportStatus(StrEnum):
    """Where a row stands once the period is reconciled."""

    BILLED = "billed"
    """Click: billed by the stream at its final charge, and confirmed."""
    ADDED = "added"
    """Click: billed only by a correction (the stream missed it, or billed it at another charge).
    Adjustment: an addition."""
    RETRACTED = "retracted"
    """Click: billed at some point (by the stream or a correction), and not billable in the end.
    Adjustment: a retraction."""


# --- Rows ---------------------------------------------------------------------------------------------------


def _get(row: BillRow, name: str) -> Any:
    return row[name] if isinstance(row, Mapping) else getattr(row, name)


def _charge(row: BillRow) -> Charge:
    return Charge(
        _get(row, "ad_id"),
        _get(row, "campaign_id"),
        _get(row, "advertiser_id"),
        _get(row, "amount_micros"),
        _get(row, "currency"),
    )


def _latest(corrections: list[Correction]) -> Correction | None:
    """The correction written last: by `created_at_ms`, and within one run additions after retractions."""
    order = {CorrectionKind.RETRACTION: 0, CorrectionKind.ADDITION: 1}
    return max(corrections, key=lambda c: (c.created_at_ms, order[c.kind], c.correction_id), default=None)


def build_export(
    period: str,
    final_clicks: Iterable[BillRow],
    ledger_rows: Iterable[BillRow],
    corrections_corrected_in_period: Iterable[Correction],
    adjustments_booked_in_period: Iterable[Correction],
) -> list[dict[str, Any]]:
    """The export rows of `period`, as dicts with the columns of `EXPORT_SCHEMA` in order: click rows by click id,
    then adjustments by (corrects_period, click_id, correction_id).

    Refuses (ValueError) a period that is not reconciled (`check_reconciled` finds a problem), a correction of the
    period booked elsewhere (it belongs to that period's export as an adjustment), and an adjustment that is not
    booked in `period` or that corrects `period` itself.
    """
    final = list(final_clicks)
    ledger = list(ledger_rows)
    corrections = list(corrections_corrected_in_period)
    adjustments = list(adjustments_booked_in_period)
    for correction in corrections:
        if correction.corrects_period != period or correction.booked_period != period:
            raise ValueError(
                f"correction {correction.correction_id} corrects {correction.corrects_period} and is booked in "
                f"{correction.booked_period}: the export of {period} takes the corrections of {period} booked in it"
            )
    for adjustment in adjustments:
        if adjustment.booked_period != period or adjustment.corrects_period == period:
            raise ValueError(
                f"correction {adjustment.correction_id} (corrects {adjustment.corrects_period}, booked in "
                f"{adjustment.booked_period}) is not an adjustment booked in {period} for an earlier period"
            )
    problems = check_reconciled(final, ledger, corrections)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ValueError(f"period {period} is not reconciled: {shown}")

    final_by_click = {_get(row, "click_id"): row for row in final}
    ledger_by_click: dict[str, list[BillRow]] = {}
    for row in ledger:
        ledger_by_click.setdefault(_get(row, "click_id"), []).append(row)
    corrections_by_click: dict[str, list[Correction]] = {}
    for correction in corrections:
        corrections_by_click.setdefault(correction.click_id, []).append(correction)

    rows: list[dict[str, Any]] = []
    for click_id in sorted(final_by_click.keys() | ledger_by_click.keys() | corrections_by_click.keys()):
        billed = ledger_by_click.get(click_id, [])
        touched = corrections_by_click.get(click_id, [])
        latest = _latest(touched)
        final_row = final_by_click.get(click_id)
        if final_row is not None:
            charge = _charge(final_row)
            status = ExportStatus.BILLED if any(_charge(b) == charge for b in billed) else ExportStatus.ADDED
            rows.append(_click_row(period, final_row, status, _get(final_row, "amount_micros"), latest))
        elif billed:
            billed_row = min(billed, key=lambda b: (_charge(b), str(_get(b, "impression_id"))))
            rows.append(_click_row(period, billed_row, ExportStatus.RETRACTED, 0, latest))
        else:
            # Added and retracted again by corrections, never billed by the stream: the last addition describes it.
            added = _latest([c for c in touched if c.kind == CorrectionKind.ADDITION]) or touched[0]
            rows.append(_correction_row(RecordType.CLICK, added, ExportStatus.RETRACTED, 0, latest, period))
    for adjustment in sorted(adjustments, key=lambda c: (c.corrects_period, c.click_id, c.correction_id)):
        status = ExportStatus.ADDED if adjustment.kind == CorrectionKind.ADDITION else ExportStatus.RETRACTED
        rows.append(
            _correction_row(RecordType.ADJUSTMENT, adjustment, status, adjustment.amount_micros, adjustment, period)
        )
    return rows


def export_totals(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], tuple[int, int, str]]:
    """What an export bills per advertiser (`adv`), campaign (`cmp`) and ad (`ad`): (level, id) -> (clicks,
    micros, advertiser), from the export's rows. A click row billed or added counts one click, a retracted one none;
    an adjustment counts plus or minus one; micros are `net_micros`, all in the advertiser's one currency: rows that
    would add two currencies into one figure (an export written from a catalog that broke the rule) are refused
    with a ValueError naming them, never added."""
    sums: dict[tuple[str, str], list[Any]] = {}
    for row in rows:
        if row["status"] == ExportStatus.RETRACTED:
            clicks = -1 if row["record_type"] == RecordType.ADJUSTMENT else 0
        else:
            clicks = 1
        counts = clicks != 0 or row["net_micros"] != 0  # a retracted click row adds nothing, in any currency
        for level, item in (("adv", row["advertiser_id"]), ("cmp", row["campaign_id"]), ("ad", row["ad_id"])):
            entry = sums.setdefault((level, item), [0, 0, row["advertiser_id"], None])
            if counts:
                if entry[3] is not None and entry[3] != row["currency"]:
                    what = {"adv": "advertiser", "cmp": "campaign", "ad": "ad"}[level]
                    first, second = sorted((entry[3], row["currency"]))
                    raise ValueError(
                        f"the export bills {what} {item} in {first} and {second}: an advertiser bills in one "
                        "currency, and no figure adds micros of two"
                    )
                entry[3] = row["currency"]
            entry[0] += clicks
            entry[1] += row["net_micros"]
    return {key: (clicks, micros, adv) for key, (clicks, micros, adv, _) in sums.items()}


def _click_row(
    period: str, row: BillRow, status: ExportStatus, net_micros: int, latest: Correction | None
) -> dict[str, Any]:
    return {
        "record_type": RecordType.CLICK.value,
        "click_id": _get(row, "click_id"),
        "impression_id": _get(row, "impression_id"),
        "ad_id": _get(row, "ad_id"),
        "campaign_id": _get(row, "campaign_id"),
        "advertiser_id": _get(row, "advertiser_id"),
        "user_id": _get(row, "user_id"),
        "click_time": _get(row, "click_time"),
        "impression_time": _get(row, "impression_time"),
        "amount_micros": _get(row, "amount_micros"),
        "net_micros": net_micros,
        "currency": _get(row, "currency"),
        "status": status.value,
        "reason": None if latest is None else latest.reason.value,
        "correction_id": None if latest is None else latest.correction_id,
        "corrects_period": period,
        "booked_period": period,
    }


def _correction_row(
    record_type: RecordType,
    described: Correction,
    status: ExportStatus,
    net_micros: int,
    latest: Correction | None,
    period: str,
) -> dict[str, Any]:
    return {
        "record_type": record_type.value,
        "click_id": described.click_id,
        "impression_id": described.impression_id,
        "ad_id": described.ad_id,
        "campaign_id": described.campaign_id,
        "advertiser_id": described.advertiser_id,
        "user_id": None,
        "click_time": None,
        "impression_time": None,
        "amount_micros": abs(described.amount_micros),
        "net_micros": net_micros,
        "currency": described.currency,
        "status": status.value,
        "reason": None if latest is None else latest.reason.value,
        "correction_id": None if latest is None else latest.correction_id,
        "corrects_period": described.corrects_period,
        "booked_period": period,
    }
