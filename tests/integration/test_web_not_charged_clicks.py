"""An advertiser sees which clicks were not charged: one row each (id, time, ad, reason, what it would have cost), per
period and date range, as a page, a CSV and an API document; its own only, admin and finance any advertiser's.

The readers of the real data folder: a closed period's clicks from its export (`not_charged.parquet`, written by the
export's writer), an open one's from the stream's `not_charged/period=P/batch_id=N/` files; Redis, the sample's."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flask.testing import FlaskClient

from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.export_files import export_table, not_charged_table, write_export
from ops.settings import Settings
from tests.web_support import FIRST_PERIOD_MS, OTHER, OWN, Seeded, login, seed
from web.app import create_app
from web.display import money

pytestmark = pytest.mark.integration

H = 3_600_000
NOW_MS = FIRST_PERIOD_MS + 5 * H + 1_800_000  # in the sample's last, open period
CLOSED_START = FIRST_PERIOD_MS - 2 * H
CLOSED = Periods().key(CLOSED_START)
OPEN = Periods().key(FIRST_PERIOD_MS + 5 * H)
DAYS = "from=2025-12-31&to=2026-01-01"


def _click(seeded: Seeded, advertiser: str, n: int, time_ms: int, reason: str) -> dict[str, object]:
    ad = [a for a in seeded.catalog if a.advertiser_id == advertiser][n % 2]
    return {
        "click_id": f"nc-{advertiser}-{n}", "impression_id": f"i-{n}", "ad_id": ad.ad_id, "campaign_id": ad.campaign_id,
        "advertiser_id": advertiser, "user_id": f"u-{n}", "click_time": time_ms, "impression_time": time_ms - 5_000,
        "amount_micros": ad.cpc_micros, "currency": ad.currency, "reason": reason,
    }  # fmt: skip


def plant(seeded: Seeded) -> list[dict[str, object]]:
    """Two closed clicks and three open ones of adv-0000, one of each of adv-0001; returns adv-0000's."""
    root = seeded.settings.root
    closed = [_click(seeded, OWN, n, CLOSED_START + n * 60_000, r) for n, r in ((1, "known_bot"), (2, "over_budget"))]
    closed.append(_click(seeded, OTHER, 9, CLOSED_START + 1_000, "known_bot"))
    billed = {**_click(seeded, OWN, 0, CLOSED_START, "known_bot"), "click_id": "charged-0", "record_type": "click",
              "status": "billed", "reason": None, "corrects_period": CLOSED, "booked_period": CLOSED}  # fmt: skip
    billed["net_micros"] = billed["amount_micros"]
    write_export(root, CLOSED, export_table([billed]), CLOSED_START, CLOSED_START + H, CLOSED_START + 2 * H,
                 not_charged=not_charged_table(closed))  # fmt: skip
    start = FIRST_PERIOD_MS + 5 * H
    opened = [
        _click(seeded, OWN, n, start + n * 60_000, r)
        for n, r in ((3, "click_flood"), (4, "duplicate_click"), (5, "excluded_ip"))
    ]
    theirs = [_click(seeded, OTHER, 8, start + 1_000, "click_flood")]
    folder = DataLayout(root).not_charged / f"period={OPEN}" / "batch_id=7"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(opened + theirs), folder / "part-0.parquet")
    # A replayed batch wrote one click again: listed once.
    again = DataLayout(root).not_charged / f"period={OPEN}" / "batch_id=8"
    again.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(opened[:1]), again / "part-0.parquet")
    return closed[:2] + opened


@pytest.fixture
def world(redis_settings: Settings) -> tuple[Seeded, list[dict[str, object]], dict[str, FlaskClient]]:
    seeded = seed(redis_settings)
    mine = plant(seeded)
    app = create_app(redis_settings, clock=lambda: NOW_MS, cache_s=0)
    clients = {}
    for name in ("alice", "bob", "fiona", "ada"):
        clients[name] = app.test_client()
        assert login(clients[name], name).status_code == 302
    return seeded, mine, clients


def test_the_advertiser_lists_its_clicks_not_charged_with_their_reason_and_cost(world: tuple) -> None:  # type: ignore[type-arg]
    seeded, mine, clients = world
    alice = clients["alice"]
    doc = alice.get(f"/api/v1/advertisers/{OWN}/not-charged?{DAYS}").json
    newest_first = sorted(mine, key=lambda c: -int(c["click_time"]))  # type: ignore[call-overload]
    assert [c["click_id"] for c in doc["clicks"]] == [c["click_id"] for c in newest_first]
    assert doc["total"] == 5 and doc["provisional"] is True
    first = doc["clicks"][0]
    assert first == {
        "click_id": "nc-adv-0000-5", "click_time": newest_first[0]["click_time"], "period": OPEN,
        "ad_id": newest_first[0]["ad_id"], "campaign_id": newest_first[0]["campaign_id"], "reason": "excluded_ip",
        "amount_micros": str(newest_first[0]["amount_micros"]), "currency": doc["currency"], "final": False,
    }  # fmt: skip
    assert {c["click_id"]: c["final"] for c in doc["clicks"]}["nc-adv-0000-1"] is True  # from the closed export
    currency = doc["currency"]
    assert doc["would_cost_micros_by_currency"] == {currency: str(sum(int(c["amount_micros"]) for c in mine))}  # type: ignore[call-overload]
    assert doc["by_reason"] == {
        r: 1 for r in ("click_flood", "duplicate_click", "excluded_ip", "known_bot", "over_budget")
    }

    # Per period: the closed one alone.
    closed = alice.get(f"/api/v1/advertisers/{OWN}/not-charged?period={CLOSED}").json
    assert [c["click_id"] for c in closed["clicks"]] == ["nc-adv-0000-2", "nc-adv-0000-1"]
    assert closed["provisional"] is False

    # Pages, as the corrections list pages.
    page = alice.get(f"/api/v1/advertisers/{OWN}/not-charged?{DAYS}&offset=2&limit=2").json
    assert [c["click_id"] for c in page["clicks"]] == [c["click_id"] for c in newest_first[2:4]]
    html = alice.get(f"/advertisers/{OWN}/not-charged?{DAYS}&limit=2").text
    assert "nc-adv-0000-5" in html and "nc-adv-0000-3" not in html and ">Older</a>" in html
    assert money(int(newest_first[0]["amount_micros"]), currency) in html  # type: ignore[call-overload]
    assert "adv-0001" not in html.split("<main")[-1].split("</main>")[0].replace(OWN, "")

    # The CSV: every click, spreadsheet-safe, micros exact.
    response = alice.get(f"/advertisers/{OWN}/not-charged.csv?{DAYS}")
    assert response.status_code == 200 and response.mimetype == "text/csv"
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [r["click_id"] for r in rows] == [c["click_id"] for c in newest_first]
    assert rows[0]["amount_micros"] == str(newest_first[0]["amount_micros"]) and rows[0]["status"] == "provisional"
    assert rows[-1]["status"] == "final" and rows[-1]["reason"] == "known_bot"

    # The dashboard links to the period's list.
    assert f"/advertisers/{OWN}/not-charged?period=" in alice.get(f"/advertisers/{OWN}").text


def test_an_advertiser_sees_only_its_own_and_admin_and_finance_see_any(world: tuple) -> None:  # type: ignore[type-arg]
    _, _, clients = world
    for url in (
        f"/advertisers/{OWN}/not-charged?{DAYS}",
        f"/advertisers/{OWN}/not-charged.csv?{DAYS}",
        f"/api/v1/advertisers/{OWN}/not-charged?{DAYS}",
    ):
        assert clients["bob"].get(url).status_code == 404, url
        for name in ("alice", "fiona", "ada"):
            response = clients[name].get(url)
            assert response.status_code == 200 and "nc-adv-0000-1" in response.text, (name, url)
            assert "nc-adv-0001" not in response.text, (name, url)
    theirs = clients["fiona"].get(f"/api/v1/advertisers/{OTHER}/not-charged?{DAYS}").json
    assert sorted(c["click_id"] for c in theirs["clicks"]) == ["nc-adv-0001-8", "nc-adv-0001-9"]
    assert clients["alice"].get(f"/api/v1/advertisers/{OWN}/not-charged?period=nope").status_code == 400
    assert clients["alice"].get(f"/api/v1/advertisers/{OWN}/not-charged?limit=0").status_code == 400


def test_nothing_planted_is_an_empty_list_not_an_error(redis_settings: Settings, tmp_path: Path) -> None:
    seed(redis_settings)
    alice = create_app(redis_settings, clock=lambda: NOW_MS, cache_s=0).test_client()
    assert login(alice, "alice").status_code == 302
    doc = alice.get(f"/api/v1/advertisers/{OWN}/not-charged").json
    assert doc["total"] == 0 and doc["clicks"] == []
    assert "No click was left uncharged" in alice.get(f"/advertisers/{OWN}/not-charged").text
