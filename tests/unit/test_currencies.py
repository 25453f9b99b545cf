"""An advertiser bills in one currency (docs/billing-rules.md): the catalog refuses an ad in another currency than its
advertiser's other ads wherever a change is made, and a catalog file that breaks the rule does not load; no figure
adds micros of two currencies: what sums over several advertisers totals per currency. The generated catalog and the
simulator give advertisers EUR, USD, JPY (no minor unit) and KWD (three decimals), so every page and test meets them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from attribution.audit import PeriodAudit
from billing.catalog import Ad, AdChange, Catalog, CatalogError, generate_catalog
from billing.export import export_totals
from billing.money import format_micros
from billing.reconcile_run import RunReport
from billing.store.catalog_file import load_catalog
from billing.store.export_files import (
    EXPORT_COLUMNS,
    MANIFEST_FILE,
    SUMS_FILE,
    export_folder,
    export_table,
    read_manifest,
    sha256sums,
    verify_export,
    write_export,
)
from ops.reconcile import audit_table, describe_run
from producers.simulator import SimulationConfig, simulate
from web import display

NOW = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp()) * 1000
PERIOD, PERIOD_START = "20251231T2200Z", NOW - 2 * 3_600_000
EUR_AD = Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR")
JPY_AD = Ad("ad-2", "cmp-2", "adv-2", 40_000_000, "JPY")


# The catalog refuses a second currency for an advertiser ---------------------------------------------------------
def test_a_catalog_with_an_advertiser_in_two_currencies_is_refused_naming_it() -> None:
    with pytest.raises(CatalogError) as refused:
        Catalog([EUR_AD, Ad("ad-9", "cmp-9", "adv-1", 40_000_000, "JPY"), JPY_AD])
    message = str(refused.value)
    assert "\n" not in message
    assert "adv-1" in message and "EUR" in message and "JPY" in message and "adv-2" not in message


def test_a_new_ad_in_another_currency_than_its_advertisers_is_refused_in_one_line() -> None:
    catalog = Catalog([EUR_AD, JPY_AD])
    with pytest.raises(CatalogError) as refused:
        catalog.with_change(AdChange("ad-9", NOW, 5_000_000, "cmp-1", "adv-1", "JPY"), NOW)
    message = str(refused.value)
    assert "\n" not in message and "advertiser adv-1 bills in EUR" in message and "ad-9" in message
    # Back-filled history (a replay's ad line) is refused alike; a new campaign does not change the advertiser's.
    with pytest.raises(CatalogError, match="bills in EUR"):
        catalog.with_change(AdChange("ad-9", 0, 5_000_000, "cmp-new", "adv-1", "USD"), NOW, backfill=True)
    made = catalog.with_change(AdChange("ad-9", NOW, 70_000, "cmp-new", "adv-1", "EUR"), NOW)
    assert made["ad-9"].currency == "EUR"
    assert catalog.with_change(AdChange("ad-10", NOW, 1_000, "cmp-3", "adv-3", "KWD"), NOW)["ad-10"].currency == "KWD"


def mixed_catalog_file(path: Path) -> None:
    ads = [
        {"ad_id": "ad-1", "campaign_id": "cmp-1", "advertiser_id": "adv-1", "currency": "EUR", "cpc_micros": 250_000},
        {"ad_id": "ad-9", "campaign_id": "cmp-1", "advertiser_id": "adv-1", "currency": "JPY", "cpc_micros": 5_000_000},
        {"ad_id": "ad-2", "campaign_id": "cmp-2", "advertiser_id": "adv-2", "currency": "USD", "cpc_micros": 250_000},
        {"ad_id": "ad-3", "campaign_id": "cmp-3", "advertiser_id": "adv-2", "currency": "KWD", "cpc_micros": 15_000},
        {"ad_id": "ad-4", "campaign_id": "cmp-4", "advertiser_id": "adv-3", "currency": "JPY", "cpc_micros": 5_000_000},
    ]
    path.write_text(json.dumps({"ads": ads}))  # a file of the earlier format, written before the rule


def test_a_catalog_file_that_breaks_the_rule_does_not_load_and_names_the_advertisers_and_the_way_out(
    tmp_path: Path,
) -> None:
    """The file as such; a command's refusal to take it into the database is
    tests/integration/test_currencies_in_database.py."""
    path = tmp_path / "catalog.json"
    mixed_catalog_file(path)
    with pytest.raises(ValueError) as refused:
        load_catalog(path)
    message = str(refused.value)
    assert str(path) in message and "\n" not in message
    assert "adv-1 (EUR: ad-1; JPY: ad-9)" in message and "adv-2 (KWD: ad-3; USD: ad-2)" in message
    assert "adv-3" not in message
    assert "an advertiser and a campaign of their own" in message  # the way out


# The generated catalog and the simulator meet every currency ----------------------------------------------------
MINOR_UNIT_MICROS = {"EUR": 10_000, "USD": 10_000, "JPY": 1_000_000, "KWD": 1_000}


def test_the_generated_catalog_bills_its_advertisers_in_eur_usd_jpy_and_kwd_at_whole_minor_units() -> None:
    catalog = generate_catalog(advertisers=8, campaigns_per_advertiser=2, ads_per_campaign=3, seed=1)
    by_advertiser: dict[str, set[str]] = {}
    for ad in catalog:
        by_advertiser.setdefault(ad.advertiser_id, set()).add(ad.currency)
        assert ad.cpc_micros is not None and ad.cpc_micros > 0
        assert ad.cpc_micros % MINOR_UNIT_MICROS[ad.currency] == 0, (ad.ad_id, ad.currency, ad.cpc_micros)
    assert all(len(currencies) == 1 for currencies in by_advertiser.values())
    assert [by_advertiser[a].pop() for a in sorted(by_advertiser)[:4]] == ["EUR", "JPY", "KWD", "USD"]
    assert generate_catalog(8, 2, 3, seed=1) == catalog  # deterministic


def test_the_simulator_meets_every_currency_and_its_ground_truth_never_adds_two(tmp_path: Path) -> None:
    config = SimulationConfig(
        advertisers=4,
        campaigns_per_advertiser=1,
        ads_per_campaign=2,
        users=2_000,  # few clicks per user and minute: floods and double clicks are not this test's subject
        impression_rate=50.0,
        click_through_rate=0.5,
        seed=3,
        events=3_000,
        start_ms=NOW,
        catalog_change_every_s=2.0,
        new_ads=4,
    )
    assert {ad.currency for ad in config.catalog()} == {"EUR", "USD", "JPY", "KWD"}
    history = config.catalog_history(NOW)
    for ad in history:
        for entry in ad.prices:
            assert entry.cpc_micros is None or entry.cpc_micros % MINOR_UNIT_MICROS[ad.currency] == 0, ad
    for _ in simulate(config, tmp_path, lambda: NOW):
        pass
    billable = json.loads((tmp_path / "summary.json").read_text())["billable"]
    assert "total_micros" not in billable  # no figure adds micros of two currencies
    assert set(billable["total_micros_by_currency"]) == {"EUR", "USD", "JPY", "KWD"}
    rows = [json.loads(line) for line in (tmp_path / "billable.jsonl").read_text().splitlines()]
    for currency, total in billable["total_micros_by_currency"].items():
        assert total == sum(r["amount_micros"] for r in rows if r["currency"] == currency)


@pytest.mark.parametrize(
    ("micros", "currency", "exact", "for_people"),
    [
        (250_000, "EUR", "0.250000 EUR", "0.25 EUR"),
        (1_234_560_000, "USD", "1234.560000 USD", "1,234.56 USD"),
        (40_000_000, "JPY", "40.000000 JPY", "40 JPY"),  # no minor unit
        (1_234_000_000_000, "JPY", "1234000.000000 JPY", "1,234,000 JPY"),
        (15_000, "KWD", "0.015000 KWD", "0.015 KWD"),  # three decimals
        (1_250_000, "KWD", "1.250000 KWD", "1.250 KWD"),
        (1_234_567, "KWD", "1.234567 KWD", "1.234567 KWD"),  # not whole fils: every digit
    ],
)
def test_money_is_formatted_in_each_currencys_own_unit(micros: int, currency: str, exact: str, for_people: str) -> None:
    assert format_micros(micros, currency) == exact
    assert display.money(micros, currency) == for_people


# Figures over several advertisers total per currency ------------------------------------------------------------
def _export_row(advertiser: str, campaign: str, ad: str, net: int, currency: str) -> dict[str, object]:
    return {
        "record_type": "click",
        "status": "billed",
        "advertiser_id": advertiser,
        "campaign_id": campaign,
        "ad_id": ad,
        "net_micros": net,
        "currency": currency,
    }


def test_export_totals_are_per_advertiser_and_never_add_two_currencies() -> None:
    rows = [
        _export_row("adv-1", "cmp-1", "ad-1", 250_000, "EUR"),
        _export_row("adv-1", "cmp-1", "ad-1", 250_000, "EUR"),
        _export_row("adv-2", "cmp-2", "ad-2", 40_000_000, "JPY"),
    ]
    totals = export_totals(rows)
    assert totals[("adv", "adv-1")] == (2, 500_000, "adv-1") and totals[("adv", "adv-2")] == (1, 40_000_000, "adv-2")
    with pytest.raises(ValueError, match=r"advertiser adv-1 .*EUR and JPY"):
        export_totals([*rows, _export_row("adv-1", "cmp-1", "ad-9", 5_000_000, "JPY")])


def test_a_reconciliation_runs_net_is_per_currency() -> None:
    report = RunReport("r1", NOW, periods=["20260101T0000Z"], additions=3, retractions=1)
    report.net_micros_by_currency.update({"EUR": 500_000, "JPY": -40_000_000})
    record = report.record()
    assert "net_micros" not in record and record["net_micros_by_currency"] == {"EUR": 500_000, "JPY": -40_000_000}
    line = describe_run(report)
    assert "net +500,000 EUR micros, -40,000,000 JPY micros" in line


def test_the_audit_totals_each_period_per_currency() -> None:
    audits = [
        PeriodAudit(
            "20260101T0000Z", True, 3, {"EUR": 500_000, "JPY": 40_000_000}, 3, {"EUR": 500_000, "JPY": 40_000_000}
        ),
        PeriodAudit("20260101T0100Z", False, 1, {"EUR": 250_000}, 1, {"JPY": 250_000}),
    ]
    assert audits[0].balanced and not audits[1].balanced
    table = audit_table(audits).splitlines()
    assert any("20260101T0000Z" in line and "EUR" in line and "500,000" in line for line in table)
    assert any("20260101T0000Z" in line and "JPY" in line and "40,000,000" in line for line in table)
    assert not any("40,500,000" in line for line in table)


def test_an_exports_manifest_totals_per_currency_and_never_adds_two(tmp_path: Path) -> None:
    rows = [
        {**_export_row("adv-1", "cmp-1", "ad-1", 250_000, "EUR"), "click_id": "c1", "amount_micros": 250_000},
        {**_export_row("adv-2", "cmp-2", "ad-2", 40_000_000, "JPY"), "click_id": "c2", "amount_micros": 40_000_000},
    ]
    full = [
        {
            **{name: None for name, *_ in EXPORT_COLUMNS},
            "reason": None,
            "corrects_period": PERIOD,
            "booked_period": PERIOD,
            **row,
        }
        for row in rows
    ]
    manifest = write_export(tmp_path, PERIOD, export_table(full), PERIOD_START, PERIOD_START + 3_600_000, NOW)
    assert manifest.total_micros_by_currency == {"EUR": 250_000, "JPY": 40_000_000}
    assert manifest.total_micros is None  # not 40,250,000 of nothing
    folder = export_folder(tmp_path, PERIOD)
    assert json.loads((folder / MANIFEST_FILE).read_text())["total_micros"] is None
    assert verify_export(folder) == []
    one = write_export(tmp_path / "one", PERIOD, export_table(full[:1]), PERIOD_START, PERIOD_START + 3_600_000, NOW)
    assert (one.total_micros, one.total_micros_by_currency) == (250_000, {"EUR": 250_000})
    # An export written before (manifest version 1, which added the currencies together) still verifies as it was.
    manifest_path = folder / MANIFEST_FILE
    earlier = {**json.loads(manifest_path.read_text()), "version": 1, "total_micros": 40_250_000}
    for name in (MANIFEST_FILE, SUMS_FILE):
        (folder / name).chmod(0o644)
    manifest_path.write_text(json.dumps(earlier))
    (folder / SUMS_FILE).write_text(sha256sums(folder))
    assert verify_export(folder) == [] and read_manifest(folder).total_micros == 40_250_000
