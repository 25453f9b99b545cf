"""Reconciliation's corrections: case by case at explicit timestamps, ids, booking, the invariant checker, Arrow,
random histories, and simulated traffic through a stream that misses late events and bills some clicks twice."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from billing.catalog import Ad, Catalog
from billing.corrections import (
    CORRECTION_FIELDS,
    ArrivalFacts,
    Correction,
    CorrectionKind,
    CorrectionReason,
    booking_period,
    check_reconciled,
    correction_id,
    over_budget_room,
    reconcile_period,
)
from billing.intake import billable_from_arrivals
from billing.periods import Periods
from billing.rule import BillableClick
from billing.store.corrections_arrow import CORRECTION_SCHEMA, corrections_from_arrow, corrections_to_arrow
from producers.arrivals import ArrivalKind, Timing
from producers.simulator import SimulationConfig, Simulator

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, the start of PERIOD
S = 1_000
PERIOD = "20260101T0000Z"
NEXT = "20260101T0100Z"
LATER = "20260101T0200Z"
NOW = int(datetime(2026, 1, 1, 2, 30, tzinfo=UTC).timestamp()) * 1000  # 02:30Z, when reconciliation runs

CATALOG = Catalog(
    [
        Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"),
        Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "USD"),
        Ad("ad-free", "cmp-1", "adv-1", 0, "EUR"),
    ]
)
ADD, RETRACT = CorrectionKind.ADDITION, CorrectionKind.RETRACTION
R = CorrectionReason


def bill(click_id: str, impression_id: str = "i1", *, ad: str = "ad-1", click_at: int = T0 + 5 * S) -> BillableClick:
    """A bill of `click_id` on `ad`, its impression 2 s before the click, priced from the catalog."""
    a = CATALOG[ad]
    return BillableClick(
        click_id=click_id,
        impression_id=impression_id,
        ad_id=ad,
        campaign_id=a.campaign_id,
        advertiser_id=a.advertiser_id,
        user_id="u1",
        click_time=click_at,
        impression_time=click_at - 2 * S,
        amount_micros=a.cpc_micros,
        currency=a.currency,
    )


def ledger(click_id: str, impression_id: str = "i1", *, ad: str = "ad-1", batch: int = 1) -> dict[str, Any]:
    """A ledger row as read from Parquet: the bill plus the stream's own columns."""
    return {
        **bill(click_id, impression_id, ad=ad).to_dict(),
        "click_received_ms": T0 + 5 * S,
        "billed_at_ms": T0 + 7 * S,
        "period_start_ms": T0,
        "period": PERIOD,
        "batch_id": batch,
    }


def written(
    kind: CorrectionKind,
    reason: CorrectionReason,
    click_id: str,
    *,
    ad: str = "ad-1",
    impression_id: str = "i1",
    ordinal: int = 0,
    booked: str = PERIOD,
    at: int = NOW - 3_600_000,
) -> Correction:
    """A correction written by an earlier run, with the id that run gave it."""
    a = CATALOG[ad]
    return Correction(
        correction_id=correction_id(kind, click_id, PERIOD, ordinal),
        kind=kind,
        click_id=click_id,
        impression_id=impression_id,
        ad_id=ad,
        campaign_id=a.campaign_id,
        advertiser_id=a.advertiser_id,
        amount_micros=a.cpc_micros if kind == ADD else -a.cpc_micros,
        currency=a.currency,
        reason=reason,
        corrects_period=PERIOD,
        booked_period=booked,
        created_at_ms=at,
    )


def summary(corrections: list[Correction]) -> list[tuple]:
    return [(c.kind, c.reason, c.click_id, c.ad_id, c.amount_micros, c.impression_id) for c in corrections]


CASES = [
    # The click arrived after the watermark: the stream never billed it. Added, late_click.
    pytest.param(
        [bill("c1")], [], [], ArrivalFacts(late_click_ids={"c1"}), [(ADD, R.LATE_CLICK, "c1", "ad-1", 250_000, "i1")],
        id="late-click",
    ),
    # Its (latest) impression arrived late: added, late_impression.
    pytest.param(
        [bill("c1", "i2")], [], [], ArrivalFacts(late_impression_ids={"i2"}),
        [(ADD, R.LATE_IMPRESSION, "c1", "ad-1", 250_000, "i2")],
        id="late-impression",
    ),
    # Both halves late: the click's own lateness is named first.
    pytest.param(
        [bill("c1")], [], [], ArrivalFacts(late_click_ids={"c1"}, late_impression_ids={"i1"}),
        [(ADD, R.LATE_CLICK, "c1", "ad-1", 250_000, "i1")],
        id="late-click-and-impression",
    ),
    # Neither half late, yet not billed (halves too far apart in processing time): missed_match.
    pytest.param(
        [bill("c1")], [], [], ArrivalFacts(), [(ADD, R.MISSED_MATCH, "c1", "ad-1", 250_000, "i1")], id="missed-match"
    ),
    # The stream billed the first matching impression i1, the final bill carries the latest, i2: same charge,
    # nothing to correct.
    pytest.param([bill("c1", "i2")], [ledger("c1", "i1")], [], ArrivalFacts(), [], id="first-match-confirmed"),
    # The ledger holds c1 twice (at i1 and i2); the final bill is at i1: the copy at i2 is the one retracted,
    # so what stays matches the final impression.
    pytest.param(
        [bill("c1", "i1")], [ledger("c1", "i1"), ledger("c1", "i2", batch=2)], [], ArrivalFacts(),
        [(RETRACT, R.DUPLICATE, "c1", "ad-1", -250_000, "i2")],
        id="duplicate-in-ledger",
    ),
    # Three copies: two duplicates go.
    pytest.param(
        [bill("c1")], [ledger("c1"), ledger("c1", batch=2), ledger("c1", batch=3)], [], ArrivalFacts(),
        [(RETRACT, R.DUPLICATE, "c1", "ad-1", -250_000, "i1")] * 2,
        id="triplicate-in-ledger",
    ),
    # The stream billed a conflicting copy of c1 on ad-2 (1.00 USD); the first copy, on ad-1, stands (0.25 EUR):
    # the wrong bill is retracted and the right one added, both id_conflict.
    pytest.param(
        [bill("c1", "i1")], [ledger("c1", "i7", ad="ad-2")], [], ArrivalFacts(conflicting_click_ids={"c1"}),
        [
            (RETRACT, R.ID_CONFLICT, "c1", "ad-2", -1_000_000, "i7"),
            (ADD, R.ID_CONFLICT, "c1", "ad-1", 250_000, "i1"),
        ],
        id="conflicting-click-billed-at-wrong-amount",
    ),
    # The stream matched c1 with a conflicting copy of i1; the standing i1 does not qualify: retracted.
    pytest.param(
        [], [ledger("c1", "i1")], [], ArrivalFacts(conflicting_impression_ids={"i1"}),
        [(RETRACT, R.ID_CONFLICT, "c1", "ad-1", -250_000, "i1")],
        id="conflicting-impression",
    ),
    # The stream billed a conflicting copy of c1 that qualifies; the standing copy does not: retracted.
    pytest.param(
        [], [ledger("c1")], [], ArrivalFacts(conflicting_click_ids={"c1"}),
        [(RETRACT, R.ID_CONFLICT, "c1", "ad-1", -250_000, "i1")],
        id="conflicting-click-not-billable",
    ),
    # Billed, but the complete data does not support it, for no known reason: not_billable.
    pytest.param(
        [], [ledger("c1")], [], ArrivalFacts(), [(RETRACT, R.NOT_BILLABLE, "c1", "ad-1", -250_000, "i1")],
        id="not-billable",
    ),
    # Billed twice and not billable: one duplicate, then the last copy not_billable.
    pytest.param(
        [], [ledger("c1"), ledger("c1", batch=2)], [], ArrivalFacts(),
        [
            (RETRACT, R.DUPLICATE, "c1", "ad-1", -250_000, "i1"),
            (RETRACT, R.NOT_BILLABLE, "c1", "ad-1", -250_000, "i1"),
        ],
        id="duplicate-and-not-billable",
    ),
    # An earlier run added the late click already: nothing new.
    pytest.param([bill("c1")], [], [written(ADD, R.LATE_CLICK, "c1")], ArrivalFacts(), [], id="already-added"),
    # An earlier run added c1; a late conflicting copy arrived first by (received_ms, partition, offset) and now
    # stands, so c1 is no longer billable: the addition is retracted.
    pytest.param(
        [], [], [written(ADD, R.LATE_CLICK, "c1")], ArrivalFacts(conflicting_click_ids={"c1"}),
        [(RETRACT, R.ID_CONFLICT, "c1", "ad-1", -250_000, "i1")],
        id="added-then-retracted",
    ),
    # The stream billed c1, an earlier run retracted it, and late data makes it billable again: added back.
    pytest.param(
        [bill("c1", "i3")], [ledger("c1")], [written(RETRACT, R.NOT_BILLABLE, "c1")],
        ArrivalFacts(late_impression_ids={"i3"}),
        [(ADD, R.LATE_IMPRESSION, "c1", "ad-1", 250_000, "i3")],
        id="retracted-then-added-back",
    ),
    # A free ad (0 micros) is still a click: its duplicate is retracted, with a zero amount.
    pytest.param(
        [bill("c1", ad="ad-free")], [ledger("c1", ad="ad-free"), ledger("c1", ad="ad-free", batch=2)], [],
        ArrivalFacts(), [(RETRACT, R.DUPLICATE, "c1", "ad-free", 0, "i1")],
        id="free-ad-duplicate",
    ),
    # A retraction whose ledger row is missing from the read (a partial read of an append-only ledger): the click
    # stands below zero on ad-2, and an addition restores zero so that the sums still hold.
    pytest.param(
        [], [], [written(RETRACT, R.NOT_BILLABLE, "c1", ad="ad-2")], ArrivalFacts(),
        [(ADD, R.MISSED_MATCH, "c1", "ad-2", 1_000_000, None)],
        id="ledger-row-missing-under-a-retraction",
    ),
    # Several clicks: by click id, retractions before additions within a click.
    pytest.param(
        [bill("c2"), bill("c1")], [ledger("c1"), ledger("c1", batch=2), ledger("c3")], [],
        ArrivalFacts(late_click_ids={"c2"}),
        [
            (RETRACT, R.DUPLICATE, "c1", "ad-1", -250_000, "i1"),
            (ADD, R.LATE_CLICK, "c2", "ad-1", 250_000, "i1"),
            (RETRACT, R.NOT_BILLABLE, "c3", "ad-1", -250_000, "i1"),
        ],
        id="several-clicks-in-order",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("final", "rows", "existing", "facts", "expected"), CASES)
def test_reconciliation_cases(
    final: list[BillableClick],
    rows: list[dict[str, Any]],
    existing: list[Correction],
    facts: ArrivalFacts,
    expected: list[tuple],
) -> None:
    new = reconcile_period(PERIOD, final, rows, existing, booked_period=PERIOD, now_ms=NOW, facts=facts)
    assert summary(new) == expected
    assert all((c.corrects_period, c.booked_period, c.created_at_ms) == (PERIOD, PERIOD, NOW) for c in new)
    # Ledger + every correction is now the final bill, and a second run writes nothing.
    assert check_reconciled(final, rows, [*existing, *new]) == []
    again = reconcile_period(PERIOD, final, rows, [*existing, *new], booked_period=PERIOD, now_ms=NOW + 1, facts=facts)
    assert again == []


def test_retraction_carries_the_owner_of_the_wrong_bill() -> None:
    # Advertiser adv-2 was charged by the stream for a click that belongs to adv-1.
    new = reconcile_period(PERIOD, [bill("c1")], [ledger("c1", ad="ad-2")], [], booked_period=PERIOD, now_ms=NOW)
    retraction, addition = new
    assert (retraction.advertiser_id, retraction.campaign_id, retraction.currency) == ("adv-2", "cmp-2", "USD")
    assert (addition.advertiser_id, addition.campaign_id, addition.currency) == ("adv-1", "cmp-1", "EUR")
    assert (retraction.clicks, addition.clicks) == (-1, 1)


# --- Ids ---------------------------------------------------------------------------------------------------------


def test_id_is_the_documented_sha256_prefix() -> None:
    expected = hashlib.sha256(b'["addition","c1","20260101T0000Z",0]').hexdigest()[:24]
    assert correction_id("addition", "c1", PERIOD, 0) == expected
    new = reconcile_period(PERIOD, [bill("c1")], [], [], booked_period=PERIOD, now_ms=NOW)
    assert new[0].correction_id == expected
    assert len(expected) == 24 and int(expected, 16) >= 0


def test_ids_differ_by_kind_click_period_and_ordinal() -> None:
    ids = {
        correction_id(kind, click, period, ordinal)
        for kind in ("addition", "retraction")
        for click in ("c1", "c2")
        for period in (PERIOD, NEXT)
        for ordinal in (0, 1)
    }
    assert len(ids) == 16
    # JSON keeps the parts apart: no two (click, period) splits of the same characters collide.
    assert correction_id(ADD, "c1", "2026", 0) != correction_id(ADD, "c12", "026", 0)
    with pytest.raises(ValueError):
        correction_id(ADD, "c1", PERIOD, -1)


def test_same_inputs_same_ids_whenever_the_run() -> None:
    args = ([bill("c1"), bill("c2")], [ledger("c3"), ledger("c3")], [])
    first = reconcile_period(PERIOD, *args, booked_period=PERIOD, now_ms=NOW)
    second = reconcile_period(PERIOD, *args, booked_period=PERIOD, now_ms=NOW + 60_000)
    assert [c.correction_id for c in first] == [c.correction_id for c in second]
    assert len({c.correction_id for c in first}) == 4


def test_a_click_that_oscillates_gets_a_new_id_at_each_turn() -> None:
    # 00:30 the late click is billable; 01:30 a copy that arrived first quarantines it; 02:30 it is back.
    history: list[Correction] = []
    for final, at in (([bill("c1")], NOW - 2 * 3_600_000), ([], NOW - 3_600_000), ([bill("c1")], NOW)):
        history += reconcile_period(PERIOD, final, [], history, booked_period=PERIOD, now_ms=at)
    assert [(c.kind, c.amount_micros) for c in history] == [(ADD, 250_000), (RETRACT, -250_000), (ADD, 250_000)]
    assert [c.correction_id for c in history] == [
        correction_id(ADD, "c1", PERIOD, 0),
        correction_id(RETRACT, "c1", PERIOD, 0),
        correction_id(ADD, "c1", PERIOD, 1),
    ]
    assert check_reconciled([bill("c1")], [], history) == []


# --- Booking -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("corrects", "open_period", "closed", "expected"),
    [
        # The corrected period is still open: the correction is booked in it.
        (PERIOD, NEXT, set(), PERIOD),
        # It is closed: the correction is an adjustment booked in the current open period.
        (PERIOD, LATER, {PERIOD, NEXT}, LATER),
        # Another period being closed changes nothing for an open one.
        (NEXT, LATER, {PERIOD}, NEXT),
    ],
)
def test_booking_period(corrects: str, open_period: str, closed: set[str], expected: str) -> None:
    assert booking_period(corrects, open_period, closed) == expected


def test_booking_period_refuses_a_closed_open_period() -> None:
    with pytest.raises(ValueError, match="closed"):
        booking_period(PERIOD, NEXT, {PERIOD, NEXT})


def test_data_for_a_closed_period_is_booked_in_the_open_period() -> None:
    # PERIOD closed at 01:10 with c1 billed once; at 02:30 a late click c2 of PERIOD arrives, while LATER is open.
    booked = booking_period(PERIOD, LATER, {PERIOD, NEXT})
    earlier = [written(RETRACT, R.DUPLICATE, "c1", booked=PERIOD)]
    rows = [ledger("c1"), ledger("c1")]
    final = [bill("c1"), bill("c2")]
    facts = ArrivalFacts(late_click_ids={"c2"})
    new = reconcile_period(PERIOD, final, rows, earlier, booked_period=booked, now_ms=NOW, facts=facts)
    assert summary(new) == [(ADD, R.LATE_CLICK, "c2", "ad-1", 250_000, "i1")]
    assert (new[0].corrects_period, new[0].booked_period) == (PERIOD, LATER)
    # Corrections of the period booked anywhere count: the next run writes nothing.
    assert reconcile_period(PERIOD, final, rows, [*earlier, *new], booked_period=booked, now_ms=NOW, facts=facts) == []


# --- Refusals ----------------------------------------------------------------------------------------------------


def test_refuses_a_correction_of_another_period() -> None:
    other = replace(written(ADD, R.LATE_CLICK, "c1"), corrects_period=NEXT)
    with pytest.raises(ValueError, match=f"corrects {NEXT}, not {PERIOD}"):
        reconcile_period(PERIOD, [bill("c1")], [], [other], booked_period=PERIOD, now_ms=NOW)


def test_refuses_a_final_bill_with_a_click_twice() -> None:
    with pytest.raises(ValueError, match="holds click c1 twice"):
        reconcile_period(PERIOD, [bill("c1"), bill("c1", "i2")], [], [], booked_period=PERIOD, now_ms=NOW)


def test_refuses_two_corrections_with_one_id() -> None:
    first = written(ADD, R.LATE_CLICK, "c1")
    clash = replace(first, reason=CorrectionReason.MISSED_MATCH)
    with pytest.raises(ValueError, match="two different corrections"):
        reconcile_period(PERIOD, [bill("c1")], [], [first, clash], booked_period=PERIOD, now_ms=NOW)


def test_an_identical_copy_of_a_correction_counts_once() -> None:
    # The same correction read twice (say, from a replayed write) does not retract c1 twice.
    added = written(ADD, R.LATE_CLICK, "c1")
    assert reconcile_period(PERIOD, [bill("c1")], [], [added, added], booked_period=PERIOD, now_ms=NOW) == []
    # ... but the checker reports the stored copy, which is a storage bug.
    assert check_reconciled([bill("c1")], [], [added, added]) == [f"correction {added.correction_id} is stored 2 times"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # An addition with a negative amount.
        ({"amount_micros": -1}, "an addition has a positive amount"),
        # A retraction reason on an addition.
        ({"reason": R.DUPLICATE}, "duplicate is not a reason for an addition"),
        # An unknown reason.
        ({"reason": "typo"}, "'typo' is not a valid CorrectionReason"),
        # Micros are integers, never floats.
        ({"amount_micros": 250_000.0}, "amount_micros must be an integer"),
    ],
)
def test_correction_refuses_inconsistent_fields(changes: dict[str, Any], message: str) -> None:
    row = {**written(ADD, R.LATE_CLICK, "c1").to_dict(), **changes}
    with pytest.raises((ValueError, TypeError), match=message):
        Correction.from_dict(row)


# --- The invariant checker ---------------------------------------------------------------------------------------


def test_checker_accepts_a_reconciled_period() -> None:
    corrections = [written(RETRACT, R.DUPLICATE, "c1"), written(ADD, R.LATE_CLICK, "c2")]
    assert check_reconciled([bill("c1"), bill("c2")], [ledger("c1"), ledger("c1")], corrections) == []


@pytest.mark.parametrize(
    ("final", "rows", "corrections", "expected"),
    [
        # The ledger misses c2 and no correction adds it.
        (
            [bill("c1"), bill("c2")],
            [ledger("c1")],
            [],
            [
                "click c2: stands 0 time(s) at 250000 EUR on ad ad-1 (advertiser adv-1), final wants 1",
                "total EUR: ledger + corrections = 250000 micros, final = 500000",
            ],
        ),
        # The ledger holds c1 twice.
        (
            [bill("c1")],
            [ledger("c1"), ledger("c1")],
            [],
            [
                "click c1: stands 2 time(s) at 250000 EUR on ad ad-1 (advertiser adv-1), final wants 1",
                "total EUR: ledger + corrections = 500000 micros, final = 250000",
            ],
        ),
        # The ledger billed c1 on the wrong ad: same click ids, but the wrong advertiser and amount.
        (
            [bill("c1")],
            [ledger("c1", ad="ad-2")],
            [],
            [
                "click c1: stands 0 time(s) at 250000 EUR on ad ad-1 (advertiser adv-1), final wants 1",
                "click c1: stands 1 time(s) at 1000000 USD on ad ad-2 (advertiser adv-2), final wants 0",
                "total EUR: ledger + corrections = 0 micros, final = 250000",
                "total USD: ledger + corrections = 1000000 micros, final = 0",
            ],
        ),
        # A correction of another period mixed in.
        (
            [bill("c1")],
            [],
            [written(ADD, R.LATE_CLICK, "c1"), replace(written(ADD, R.LATE_CLICK, "c9"), corrects_period=NEXT)],
            [
                f"corrections of several periods checked together: {PERIOD}, {NEXT}",
                "click c9: stands 1 time(s) at 250000 EUR on ad ad-1 (advertiser adv-1), final wants 0",
                "total EUR: ledger + corrections = 500000 micros, final = 250000",
            ],
        ),
        # The final bill itself lists c1 twice.
        (
            [bill("c1"), bill("c1")],
            [ledger("c1")],
            [],
            ["click c1: the final bill holds it more than once"],
        ),
    ],
)
def test_checker_catches_a_wrong_ledger(
    final: list[BillableClick], rows: list[dict], corrections: list[Correction], expected: list[str]
) -> None:
    assert check_reconciled(final, rows, corrections) == expected


# --- Arrow and Parquet (billing.store.corrections_arrow) ----------------------------------------------------


def test_checker_takes_the_rows_of_arrow_tables() -> None:
    final = pa.Table.from_pylist([bill("c1").to_dict()])
    rows = pa.Table.from_pylist([ledger("c1"), ledger("c2")])
    assert check_reconciled(final.to_pylist(), rows.to_pylist(), []) == [
        "click c2: stands 1 time(s) at 250000 EUR on ad ad-1 (advertiser adv-1), final wants 0",
        "total EUR: ledger + corrections = 500000 micros, final = 250000",
    ]
    new = reconcile_period(PERIOD, final.to_pylist(), rows.to_pylist(), [], booked_period=PERIOD, now_ms=NOW)
    assert summary(new) == [(RETRACT, R.NOT_BILLABLE, "c2", "ad-1", -250_000, "i1")]


def test_corrections_round_trip_through_parquet(tmp_path: Path) -> None:
    corrections = [
        written(ADD, R.LATE_CLICK, "c1"),
        replace(written(RETRACT, R.ID_CONFLICT, "c2", ad="ad-2"), impression_id=None),
    ]
    table = corrections_to_arrow(corrections)
    assert table.schema == CORRECTION_SCHEMA
    assert tuple(table.column_names) == CORRECTION_FIELDS
    assert table.column("amount_micros").to_pylist() == [250_000, -1_000_000]
    assert table.column("kind").to_pylist() == ["addition", "retraction"]
    path = tmp_path / "corrections.parquet"
    pq.write_table(table, path)
    back = corrections_from_arrow(pq.read_table(path))
    assert back == corrections
    assert isinstance(back[0].reason, CorrectionReason) and back[0].reason == "late_click"
    # DuckDB reads it too: the signed sum and the click delta per advertiser.
    totals = duckdb.sql(
        f"SELECT advertiser_id, sum(amount_micros), sum(CASE kind WHEN 'addition' THEN 1 ELSE -1 END) "
        f"FROM read_parquet('{path}') GROUP BY advertiser_id ORDER BY advertiser_id"
    ).fetchall()
    assert totals == [("adv-1", 250_000, 1), ("adv-2", -1_000_000, -1)]


def test_from_arrow_ignores_extra_columns_and_names_missing_ones() -> None:
    table = corrections_to_arrow([written(ADD, R.LATE_CLICK, "c1")])
    with_partition = table.append_column("period", pa.array([PERIOD]))
    assert corrections_from_arrow(with_partition) == [written(ADD, R.LATE_CLICK, "c1")]
    with pytest.raises(ValueError, match="missing columns \\['reason'\\]"):
        corrections_from_arrow(table.drop_columns(["reason"]))


def test_to_dict_is_json_ready() -> None:
    row = written(ADD, R.LATE_CLICK, "c1").to_dict()
    assert list(row) == list(CORRECTION_FIELDS)
    assert type(row["reason"]) is str and type(row["kind"]) is str
    assert Correction.from_dict(row) == written(ADD, R.LATE_CLICK, "c1")


# --- Random histories --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(25))
def test_random_histories_always_reconcile_exactly(seed: int) -> None:
    """An append-only ledger with copies and wrong charges, and a final bill that changes its mind run after run."""
    rng = random.Random(seed)
    clicks = [f"c{n}" for n in range(10)]
    ads = CATALOG.ad_ids
    rows: list[dict[str, Any]] = []
    history: list[Correction] = []
    for run in range(8):
        for _ in range(rng.randrange(5)):
            rows.append(ledger(rng.choice(clicks), rng.choice(["i1", "i2"]), ad=rng.choice(ads), batch=run))
        final = [bill(c, rng.choice(["i1", "i2"]), ad=rng.choice(ads)) for c in clicks if rng.random() < 0.5]
        facts = ArrivalFacts(
            late_click_ids={c for c in clicks if rng.random() < 0.2},
            conflicting_click_ids={c for c in clicks if rng.random() < 0.2},
            late_impression_ids={"i2"} if rng.random() < 0.5 else set(),
        )
        booked = PERIOD if run < 4 else LATER
        new = reconcile_period(PERIOD, final, rows, history, booked_period=booked, now_ms=NOW + run, facts=facts)
        # Never an addition and a retraction of the same charge of a click in one run: no churn.
        moves = Counter((c.click_id, c.ad_id, c.kind) for c in new)
        assert not any((click, ad, RETRACT) in moves for click, ad, kind in moves if kind == ADD)
        history += new
        assert check_reconciled(final, rows, history) == []
        assert reconcile_period(PERIOD, final, rows, history, booked_period=booked, now_ms=NOW, facts=facts) == []
    assert len({c.correction_id for c in history}) == len(history)


# --- Simulated traffic -------------------------------------------------------------------------------------------

LATE_AND_DOUBLED = SimulationConfig(
    advertisers=2,
    campaigns_per_advertiser=2,
    ads_per_campaign=2,
    users=5_000,  # few clicks per user and minute: invalid traffic (floods, double clicks) is not this test's subject
    impression_rate=100.0,
    click_through_rate=0.3,
    out_of_order_fraction=0.1,
    late_fraction=0.05,
    late_min_ms=30_000,
    late_max_ms=120_000,
    duplicate_fraction=0.02,
    bad_fraction=0.0,
    events=12_000,
    start_ms=T0 + 3_600_000 - 30 * S,  # 30 s before a period boundary, so the run spans two periods
    seed=5,
)


def test_simulated_stream_that_misses_late_events_and_bills_some_clicks_twice() -> None:
    arrivals = list(Simulator(LATE_AND_DOUBLED, lambda: NOW).arrivals())
    final, _ = billable_from_arrivals(
        ((a.event, a.arrival_ms) for a in arrivals if a.event), LATE_AND_DOUBLED.catalog()
    )
    late = {a.event.event_id for a in arrivals if a.event and a.kind == ArrivalKind.EVENT and a.timing == Timing.LATE}
    facts = ArrivalFacts(late_click_ids=late, late_impression_ids=late)
    # The stream: misses every click whose click or impression was late, bills every 25th click twice.
    missed = {row.click_id for row in final if row.click_id in late or row.impression_id in late}
    doubled = {row.click_id for n, row in enumerate(final) if n % 25 == 0} - missed
    stream = [row for row in final if row.click_id not in missed]
    stream += [row for row in final if row.click_id in doubled]
    assert len(missed) > 20 and len(doubled) > 20

    periods = Periods()
    by_period: dict[str, tuple[list, list]] = {}
    for row in final:
        by_period.setdefault(periods.key_of(row.click_time), ([], []))[0].append(row)
    for row in stream:
        by_period.setdefault(periods.key_of(row.click_time), ([], []))[1].append(row)
    assert len(by_period) == 2

    written_all: list[Correction] = []
    for period, (period_final, period_ledger) in sorted(by_period.items()):
        new = reconcile_period(period, period_final, period_ledger, [], booked_period=period, now_ms=NOW, facts=facts)
        assert check_reconciled(period_final, period_ledger, new) == []
        assert reconcile_period(period, period_final, period_ledger, new, booked_period=period, now_ms=NOW) == []
        written_all += new
    additions = {c.click_id: c.reason for c in written_all if c.kind == ADD}
    retractions = {c.click_id: c.reason for c in written_all if c.kind == RETRACT}
    assert additions == {c: R.LATE_CLICK if c in late else R.LATE_IMPRESSION for c in missed}
    assert retractions == dict.fromkeys(doubled, R.DUPLICATE)
    total_final = sum(row.amount_micros for row in final)
    assert sum(row.amount_micros for row in stream) + sum(c.amount_micros for c in written_all) == total_final


def test_one_shot_iterables_are_read_once_and_fully() -> None:
    # The Spark side may pass generators (rows streamed off a collect): both functions must still see everything.
    def rows():
        yield ledger("c1")
        yield ledger("c2")

    def final():
        yield bill("c1")

    assert check_reconciled(final(), rows(), []) == [
        "click c2: stands 1 time(s) at 250000 EUR on ad ad-1 (advertiser adv-1), final wants 0",
        "total EUR: ledger + corrections = 500000 micros, final = 250000",
    ]
    new = reconcile_period(PERIOD, final(), rows(), iter([]), booked_period=PERIOD, now_ms=NOW)
    assert summary(new) == [(RETRACT, R.NOT_BILLABLE, "c2", "ad-1", -250_000, "i1")]


def test_a_price_change_the_stream_had_not_seen_is_a_catalog_change_retraction_and_addition() -> None:
    # The stream priced the click before it saw the new price in force at the click's time.
    stale = {**ledger("c1"), "amount_micros": 100_000}
    new = reconcile_period(PERIOD, [bill("c1")], [stale], [], booked_period=PERIOD, now_ms=NOW)
    assert [(c.kind, c.reason, c.amount_micros) for c in new] == [
        (CorrectionKind.RETRACTION, CorrectionReason.CATALOG_CHANGE, -100_000),
        (CorrectionKind.ADDITION, CorrectionReason.CATALOG_CHANGE, 250_000),
    ]
    assert check_reconciled([bill("c1")], [stale], new) == []


def test_clicks_the_catalog_priced_otherwise_are_added_or_retracted_as_catalog_changes() -> None:
    facts = ArrivalFacts(unpriced_click_ids={"held", "paused"})
    new = reconcile_period(
        PERIOD,
        [bill("held")],  # the stream could not price it (a new ad it had not seen yet); the history prices it
        [ledger("paused")],  # the stream billed it; the history has the ad paused at its time
        [],
        booked_period=PERIOD,
        now_ms=NOW,
        facts=facts,
    )
    assert sorted((c.click_id, c.kind, c.reason) for c in new) == [
        ("held", CorrectionKind.ADDITION, CorrectionReason.CATALOG_CHANGE),
        ("paused", CorrectionKind.RETRACTION, CorrectionReason.CATALOG_CHANGE),
    ]


# --- Room for a raise: over-budget retractions in an open period -----------------------------------------------------


def test_the_room_a_raise_needs_is_retracted_in_the_open_period_with_the_ids_its_reconciliation_would_give() -> None:
    # The open period's ledger: c1, c2 and c3 twice (a replayed bill); the complete data so far finds c2 and c3 over
    # the budget (and c9 too, which the stream never charged: nothing to take back).
    rows = [ledger("c1"), ledger("c2"), ledger("c3"), ledger("c3")]
    room = over_budget_room(PERIOD, {"c2", "c3", "c9"}, rows, [], now_ms=NOW)
    assert sorted((c.click_id, c.kind, c.reason, c.corrects_period, c.booked_period) for c in room) == [
        ("c2", RETRACT, R.OVER_BUDGET, PERIOD, PERIOD),
        ("c3", RETRACT, R.DUPLICATE, PERIOD, PERIOD),
        ("c3", RETRACT, R.OVER_BUDGET, PERIOD, PERIOD),
    ]
    # Asked again, or when the period is reconciled with the same complete data, nothing more is written.
    assert over_budget_room(PERIOD, {"c2", "c3"}, rows, room, now_ms=NOW + 60_000) == []
    final = [bill("c1")]
    facts = ArrivalFacts(not_charged_reasons={"c2": "over_budget", "c3": "over_budget"})
    assert reconcile_period(PERIOD, final, rows, room, booked_period=PERIOD, now_ms=NOW, facts=facts) == []
    assert check_reconciled(final, rows, room) == []


def test_a_click_retracted_early_for_the_budget_and_charged_by_the_complete_data_is_added_back_as_over_budget() -> None:
    room = over_budget_room(PERIOD, {"c1"}, [ledger("c1")], [], now_ms=NOW)
    # By the period's close, the complete data charges c1 after all (the click that took its room was retracted).
    back = reconcile_period(PERIOD, [bill("c1")], [ledger("c1")], room, booked_period=PERIOD, now_ms=NOW + 3_600_000)
    assert [(c.kind, c.reason, c.amount_micros) for c in back] == [(ADD, R.OVER_BUDGET, 250_000)]
    assert back[0].correction_id == correction_id(ADD, "c1", PERIOD, 0)
    assert check_reconciled([bill("c1")], [ledger("c1")], room + back) == []
