"""The DuckDB oracle against the plain-Python rule: case by case at explicit timestamps, and on simulated traffic
with every kind of trouble (late, out of order, duplicates, conflicts, bad input, invalid traffic, budgets) against
the simulator's truth."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from billing.catalog import Ad, Catalog
from billing.events import Click, Impression
from billing.intake import Intake, billable_from_arrivals
from billing.rule import bill
from billing.store.crawler_list import crawler_list
from producers.arrivals import ArrivalKind, Timing
from producers.ground_truth import GroundTruth
from producers.simulator import Simulator, simulate, write_run
from tests import oracle, simulated_traffic

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
S = 1_000
H = 3_600_000
NOW_MS = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp()) * 1000

CATALOG = Catalog(
    [
        Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"),
        Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "USD"),
    ]
)


def imp(
    impression_id: str,
    at: int,
    *,
    ad: str = "ad-1",
    user: str = "u1",
    received: int | None = None,
    p: int = 0,
    o: int = 0,
) -> dict[str, Any]:
    """An impression received at `received` (default: at its event time) from partition `p`, offset `o`."""
    return _row("impression", impression_id, ad, user, at, received, p, o)


def click(
    click_id: str, at: int, *, ad: str = "ad-1", user: str = "u1", received: int | None = None, p: int = 0, o: int = 0
) -> dict[str, Any]:
    return _row("click", click_id, ad, user, at, received, p, o)


def _row(kind: str, event_id: str, ad: str, user: str, at: int, received: int | None, p: int, o: int) -> dict:
    return {
        "type": kind,
        "id": event_id,
        "ad_id": ad,
        "user_id": user,
        "event_time": at,
        "received_ms": at if received is None else received,
        "partition": p,
        "offset": o,
    }


def by_rule(rows: list[dict[str, Any]], catalog: Catalog = CATALOG) -> list[dict[str, Any]]:
    """The production path for the same records: intake in arrival order, then `billing.rule.bill` with the crawler
    list; the charged clicks."""
    return [row.to_dict() for row in billed_by_rule(rows, catalog).charged]


def billed_by_rule(rows: list[dict[str, Any]], catalog: Catalog):
    ordered = sorted(rows, key=lambda r: (r["received_ms"], r["partition"], r["offset"]))
    intake = Intake()
    for r in ordered:
        kind = Impression if r["type"] == "impression" else Click
        event = kind(r["id"], r["ad_id"], r["user_id"], r["event_time"], r.get("user_agent"), r.get("ip"))
        intake.admit(event, r["received_ms"])
    return bill(intake.impressions, intake.clicks, catalog, is_bot=crawler_list().matches)


EDGE_CASES = [
    # The window's upper edge is inclusive: 10 s exactly is billed.
    pytest.param([imp("i1", T0), click("c1", T0 + 10 * S)], {"c1": "i1"}, id="exactly-10s"),
    # One millisecond past 10 s is not.
    pytest.param([imp("i1", T0), click("c1", T0 + 10 * S + 1)], {}, id="10s-plus-1ms"),
    # The lower edge is inclusive: same millisecond is billed.
    pytest.param([imp("i1", T0), click("c1", T0)], {"c1": "i1"}, id="same-millisecond"),
    # A click 1 ms before the impression is not billed.
    pytest.param([imp("i1", T0), click("c1", T0 - 1)], {}, id="click-before-impression"),
    # Two qualifying impressions: the latest one is chosen.
    pytest.param([imp("i1", T0), imp("i2", T0 + 4 * S), click("c1", T0 + 5 * S)], {"c1": "i2"}, id="latest"),
    # Two qualifying impressions in the same millisecond: the smallest id wins, whatever the arrival order.
    pytest.param(
        [imp("i9", T0, o=0), imp("i3", T0, o=1), click("c1", T0 + S)],
        {"c1": "i3"},
        id="tie-smallest-id",
    ),
    # Another user or another ad does not qualify.
    pytest.param(
        [imp("i1", T0, user="u2"), imp("i2", T0, ad="ad-2"), click("c1", T0 + S)],
        {},
        id="other-user-other-ad",
    ),
    # An identical re-send of the click, received later: billed once.
    pytest.param(
        [imp("i1", T0), click("c1", T0 + S), click("c1", T0 + S, received=T0 + 9 * S)],
        {"c1": "i1"},
        id="duplicate-click",
    ),
    # A conflicting click copy received later is quarantined: the first copy (no impression in range) stands.
    pytest.param(
        [imp("i1", T0), click("c1", T0 + 20 * S), click("c1", T0 + S, received=T0 + 30 * S)],
        {},
        id="conflict-later-copy-quarantined",
    ),
    # The same conflict, but the qualifying copy arrives first: it stands and is billed.
    pytest.param(
        [imp("i1", T0), click("c1", T0 + S), click("c1", T0 + 20 * S)],
        {"c1": "i1"},
        id="conflict-first-copy-stands",
    ),
    # A conflicting impression copy (other user) arriving later does not take the click away.
    pytest.param(
        [imp("i1", T0), click("c1", T0 + S), imp("i1", T0, user="u9", received=T0 + 2 * S)],
        {"c1": "i1"},
        id="conflicting-impression-later",
    ),
    # Same receive time: the lower partition arrived first, so its copy stands.
    pytest.param(
        [
            imp("i1", T0),
            click("c1", T0 + 30 * S, received=T0 + 40 * S, p=0),
            click("c1", T0 + S, received=T0 + 40 * S, p=1),
        ],
        {},
        id="arrival-tie-broken-by-partition",
    ),
    # Same receive time and partition: the lower offset arrived first.
    pytest.param(
        [
            imp("i1", T0),
            click("c1", T0 + S, received=T0 + 40 * S, o=7),
            click("c1", T0 + 30 * S, received=T0 + 40 * S, o=8),
        ],
        {"c1": "i1"},
        id="arrival-tie-broken-by-offset",
    ),
    # A click late by minutes is still billed: the rule is about event time only.
    pytest.param([imp("i1", T0), click("c1", T0 + 3 * S, received=T0 + 300 * S)], {"c1": "i1"}, id="late-click"),
    # An ad the catalog does not know is not billed (it is no bad input: the events are kept).
    pytest.param([imp("i1", T0, ad="ad-x"), click("c1", T0 + S, ad="ad-x")], {}, id="unknown-ad"),
    # The first copy stands even when its ad is unknown: a later copy on a known ad is a conflict, not billed.
    pytest.param(
        [imp("i1", T0), click("c1", T0 + S, ad="ad-x"), click("c1", T0 + S, received=T0 + 2 * S)],
        {},
        id="first-copy-on-an-unknown-ad-stands",
    ),
    # A quarantined first copy (out of range) does not claim the id: the later valid copy is billed.
    pytest.param(
        [imp("i1", T0), click("c1", T0 + 2 * H, received=T0), click("c1", T0 + S, received=T0 + 2 * S)],
        {"c1": "i1"},
        id="valid-copy-after-quarantined-one",
    ),
    # event_time before 2000-01-01 is quarantined (impression and click at 1999-12-31T23:59:59.999Z).
    pytest.param(
        [
            imp("i1", 946_684_799_999, received=T0),
            click("c1", 946_684_799_999 + S, received=T0),
        ],
        {},
        id="before-2000",
    ),
    # Exactly 2000-01-01T00:00:00Z is valid.
    pytest.param(
        [imp("i1", 946_684_800_000, received=T0), click("c1", 946_684_800_000 + S, received=T0)],
        {"c1": "i1"},
        id="at-2000",
    ),
    # Exactly one hour ahead of its receipt is valid.
    pytest.param([imp("i1", T0, received=T0 - H), click("c1", T0 + S)], {"c1": "i1"}, id="1h-ahead-valid"),
    # One hour and 1 ms ahead of its receipt: the impression is quarantined, the click has nothing to match.
    pytest.param([imp("i1", T0, received=T0 - H - 1), click("c1", T0 + S)], {}, id="1h-1ms-ahead-quarantined"),
]


@pytest.mark.parametrize(("rows", "expected"), EDGE_CASES)
def test_edge_cases(rows: list[dict[str, Any]], expected: dict[str, str]) -> None:
    billed = oracle.billable(rows, CATALOG)
    assert {row["click_id"]: row["impression_id"] for row in billed} == expected
    assert billed == by_rule(rows)


def test_oracle_row_carries_price_owner_and_times() -> None:
    rows = [imp("i1", T0, ad="ad-2"), click("c1", T0 + 2 * S, ad="ad-2")]
    assert oracle.billable(rows, CATALOG) == [
        {
            "click_id": "c1",
            "impression_id": "i1",
            "ad_id": "ad-2",
            "campaign_id": "cmp-2",
            "advertiser_id": "adv-2",
            "user_id": "u1",
            "click_time": T0 + 2 * S,
            "impression_time": T0,
            "amount_micros": 1_000_000,
            "currency": "USD",
        }
    ]


def test_verdicts_and_conflicts() -> None:
    rows = [
        imp("i1", T0),
        imp("i1", T0, received=T0 + S),  # duplicate
        imp("i1", T0 + 1, received=T0 + 2 * S),  # conflict: other time
        click("c1", T0 + S),
        click("c1", T0 + S, user="u2", received=T0 + 3 * S),  # conflict: other user
        click("c2", T0 + S, ad="ad-x"),  # unknown ad: accepted, not billable
        click("c3", 946_684_799_999, received=T0),  # before 2000
    ]
    assert oracle.verdicts(rows, CATALOG) == {
        "accepted": 3,
        "duplicate": 1,
        "id_conflict": 2,
        "time_out_of_range": 1,
    }
    assert oracle.conflicting_ids(rows, CATALOG) == {"impression": {"i1"}, "click": {"c1"}}


# --- Simulated traffic ----------------------------------------------------------------------------------------

# Every kind of trouble of the join and of timing. Enough users that none makes a click flood (about 3 clicks a
# minute each): the invalid traffic is another test's subject (users this few still click one ad twice within 30 s
# often, and the truth and the oracle agree on those duplicate clicks too).
TROUBLED = replace(simulated_traffic.TROUBLED, start_ms=T0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_oracle_matches_the_simulators_ground_truth(seed: int, tmp_path: Path) -> None:
    config = replace(TROUBLED, seed=seed)
    arrivals = list(simulate(config, tmp_path, clock=lambda: NOW_MS))
    # Every kind of trouble is in the run, or the comparison would prove less than it claims.
    timings = Counter(a.timing for a in arrivals if a.kind == ArrivalKind.EVENT)
    kinds = Counter(a.kind for a in arrivals)
    reasons = Counter(a.expected_reason for a in arrivals if a.kind == ArrivalKind.BAD)
    assert timings[Timing.LATE] > 0 and timings[Timing.OUT_OF_ORDER] > 0
    assert kinds[ArrivalKind.DUPLICATE] > 0
    assert all(reasons[reason] > 0 for reason in ("id_conflict", "time_out_of_range", "undecodable"))

    rows = oracle.received_rows(arrivals)
    catalog = config.catalog()
    billed = oracle.billable(rows, catalog)
    truth = [json.loads(line) for line in (tmp_path / "billable.jsonl").read_text().splitlines()]
    assert len(billed) > 500
    assert billed == truth

    # The intake's counts agree with the oracle's verdicts, record for record.
    _, intake = billable_from_arrivals(((a.event, a.arrival_ms) for a in arrivals if a.event is not None), catalog)
    expected = {name: count for name, count in intake.counts.items() if count}
    assert oracle.verdicts(rows, catalog) == expected


def test_oracle_ignores_the_order_of_its_input_rows() -> None:
    """Arrival is decided by (received_ms, partition, offset) alone, not by where a row sits in the input."""
    config = replace(TROUBLED, seed=11, events=4_000)
    rows = oracle.received_rows(Simulator(config, lambda: NOW_MS).arrivals(), partitions=3)
    shuffled = rows[:]
    random.Random(11).shuffle(shuffled)
    billed = oracle.billable(shuffled, config.catalog())
    assert billed == by_rule(rows, config.catalog())
    assert len(billed) > 200


def test_a_run_that_changes_the_catalog_is_billed_by_the_history_at_each_clicks_time(tmp_path: Path) -> None:
    """Prices changed every 2 s of event time, ads paused and resumed, two ads created mid-run: the simulator's
    ground truth, the production rule and the oracle price every click by the history at its time."""
    config = replace(TROUBLED, seed=4, catalog_change_every_s=2.0, new_ads=2)
    arrivals = list(simulate(config, tmp_path, clock=lambda: NOW_MS))
    simulator = Simulator(config, lambda: NOW_MS)
    history = simulator.catalog
    assert [c.ad_id for c in simulator.changes[:2]] == config.new_ad_ids()
    assert any(c.cpc_micros is None for c in simulator.changes), "a pause, or the run proves less than it claims"
    assert history.version == len(simulator.changes) > 10

    rows = oracle.received_rows(arrivals)
    billed = oracle.billable(rows, history)
    truth = [json.loads(line) for line in (tmp_path / "billable.jsonl").read_text().splitlines()]
    assert billed == truth == by_rule(rows, history)
    # The history matters: priced by the catalog the run started with, the bill differs.
    assert oracle.billable(rows, config.catalog()) != billed
    new_ads = set(config.new_ad_ids())
    assert any(row["ad_id"] in new_ads for row in billed), "the created ads are billed once they exist"
    clicks_before = [
        r
        for r in rows
        if r["type"] == "click" and r["ad_id"] in new_ads and r["event_time"] < history[r["ad_id"]].created_at
    ]
    assert clicks_before and not {r["id"] for r in clicks_before} & {row["click_id"] for row in billed}
    assert json.loads((tmp_path / "catalog.json").read_text())["version"] == history.version


# Every outcome of the contract in one run: crawlers, excluded ranges (one added halfway), floods, double clicks,
# late clicks that make an earlier bill a duplicate, three campaigns' budgets exhausted and changed halfway, prices
# changed, ads paused and created mid-run (ad_paused, unknown_ad). Enough users that ordinary traffic has no floods.
EVERY_OUTCOME = replace(
    TROUBLED,
    users=2_000,
    events=16_000,
    seed=21,
    crawler_fraction=0.03,
    excluded_ip_fraction=0.03,
    flood_fraction=0.05,
    double_click_fraction=0.03,
    late_duplicate_fraction=0.03,
    budget_campaigns=3,
    catalog_change_every_s=5.0,
    new_ads=2,
)


@pytest.mark.parametrize("partitions", [1, 4])
def test_the_ground_truth_gives_every_billable_click_the_oracles_outcome(partitions: int, tmp_path: Path) -> None:
    """The truth's charged set and every reason a billable click is not charged equal the oracle's reading of the
    contract, in memory and partitioned (by user for the rules, by campaign and day for budgets)."""
    simulator = Simulator(EVERY_OUTCOME, lambda: NOW_MS)
    arrivals = list(simulator.arrivals())
    truth = GroundTruth(simulator.catalog, partitions, tmp_path / "work")
    for arrival in arrivals:
        truth.observe(arrival)
    result = write_run(tmp_path / "run", EVERY_OUTCOME, simulator.start_ms, truth, simulator.catalog)

    expected = {
        row["click_id"]: row["outcome"] for row in oracle.outcomes(oracle.received_rows(arrivals), simulator.catalog)
    }
    assert result.outcomes() == expected
    outcomes = Counter(expected.values())
    reasons = ("unknown_ad", "ad_paused", "known_bot", "excluded_ip", "click_flood", "duplicate_click", "over_budget")
    assert all(outcomes[reason] > 0 for reason in ("charged", *reasons)), outcomes
    # The rows themselves: the charged ones as the oracle bills them, the others with their reasons.
    rows = oracle.received_rows(arrivals)
    assert list(result.billable()) == oracle.billable(rows, simulator.catalog) == by_rule(rows, simulator.catalog)
    refused = billed_by_rule(rows, simulator.catalog).not_charged
    assert list(result.not_charged()) == [row.to_dict() for row in refused]
    # The counts agree with the files.
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["billable"]["clicks"] == outcomes["charged"]
    assert {r: e["clicks"] for r, e in summary["not_charged"]["by_reason"].items()} == {r: outcomes[r] for r in reasons}
    over = sum(day["over_budget_clicks"] for days in summary["budgets"].values() for day in days.values())
    assert over == outcomes["over_budget"]
    assert summary["crawler_list"] == crawler_list().version
    assert not any((tmp_path / "work").iterdir()), "the spill files are gone"
