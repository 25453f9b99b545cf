"""Monthly invoices from a closed month on files (December 2025's exports and corrections, the billing profiles),
issued by `adbill invoices issue` and shown to each role over real Redis: the page beside the open month's
provisional statement, the CSV, the PDF (rendered by `pdftoppm` to `var/test-output/screens/invoice-pdf-page-1.png`),
the API; finance's month of invoices; an admin's billing profile through the page, refused as the command refuses."""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from ops import deps
from ops.settings import Settings
from tests.invoice_month import MONTH, PERIODS, write_closed_month
from tests.web_support import OTHER, OWN, Seeded, form_token, login, seed, web_screens_dir
from web import display
from web.app import create_app

pytestmark = pytest.mark.integration

NOW_MS = 1_767_250_000_000  # 2026-01-01T06:46:40Z: December is over, January open (the sample's hours)


@pytest.fixture
def invoiced(redis_settings: Settings) -> Seeded:
    """The sample (January, open) and December closed on files, invoiced by the command as an operator runs it
    (December only: the sample's January has exports on file but is open in Redis)."""
    seeded = seed(redis_settings)
    write_closed_month(seeded.settings.layout, seeded.catalog, OWN, OTHER, seeded.settings.database_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")} | seeded.settings.to_env()
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "invoices", "issue", "--month", MONTH],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "invoices of 2025-12: 2 issued (INV-000001 to INV-000002)" in done.stdout, done.stdout
    again = subprocess.run(
        [sys.executable, "-m", "ops.cli", "invoices", "issue", "--month", MONTH],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "nothing to issue" in again.stdout, again.stdout + again.stderr  # idempotent
    return seeded


def client_of(seeded: Seeded, who: str) -> FlaskClient:
    client = create_app(seeded.settings, clock=lambda: NOW_MS, cache_s=0).test_client()
    assert login(client, who).status_code == 302
    return client


def test_a_closed_month_is_invoiced_with_its_lines_rounding_tax_and_terms(invoiced: Seeded) -> None:
    book = invoiced.settings.invoice_store()
    own, other = book.invoice(MONTH, OWN), book.invoice(MONTH, OTHER)
    assert own is not None and other is not None
    assert (own.number, other.number) == (1, 2)
    assert own.periods == PERIODS
    # EUR: 10 clicks at 0.123456 = 1.23456 EUR; rounded once to 1.23; tax 20 % of 1.23 = 0.246 -> 0.25
    t = own.totals
    assert (t.net_micros, t.amount_micros, t.tax_micros, t.total_micros) == (1_234_560, 1_230_000, 250_000, 1_480_000)
    # JPY: 121.5 -> 122 (half away from zero); tax 10 % = 12.2 -> 12
    t = other.totals
    assert (t.net_micros, t.amount_micros, t.tax_micros, t.total_micros) == (
        121_500_000,
        122_000_000,
        12_000_000,
        134_000_000,
    )
    kinds = [(ln.kind, ln.description, ln.clicks, ln.amount_micros, ln.corrects) for ln in own.lines]
    assert kinds == [
        ("charges", "Clicks billed", 10, 1_234_560, ()),
        ("correction", "Correction before close: duplicate", -1, -123_456, (PERIODS[0],)),
        ("correction", "Correction before close: late click", 1, 123_456, (PERIODS[0],)),
        ("adjustment", "Adjustment: invalid activity", -1, -123_456, ("20251130T1000Z",)),
        ("adjustment", "Adjustment: late click", 1, 123_456, ("20251130T1100Z",)),
    ]
    assert own.bill_to is not None and own.bill_to.name == "Acme SA" and own.tax_rate == "20"


def test_the_advertiser_reads_its_invoice_beside_the_open_month_as_page_csv_and_pdf(invoiced: Seeded) -> None:
    alice = client_of(invoiced, "alice")
    listed = alice.get(f"/advertisers/{OWN}/invoices")
    assert listed.status_code == 200 and "INV-000001" in listed.text and "INV-000002" not in listed.text
    assert 'id="open-month"' in listed.text and "2026-01 so far" in listed.text
    page = alice.get(f"/advertisers/{OWN}/invoices/{MONTH}")
    assert page.status_code == 200
    text = page.text
    for expected in (
        "INV-000001",
        "Acme SA",
        "FR12345678901",
        display.money(1_234_560, "EUR"),  # the exact net: 1.23456 EUR
        'id="amount">1.23 EUR',
        'id="tax">0.25 EUR',
        'id="total">1.48 EUR',
        "half away from zero",
        "Payment due within 30 days",
        "Adjustment: invalid activity",
        "2025-11-30 10:00 UTC",
        "Correction before close: late click",
        "2026-01 so far",
    ):
        assert expected in text, expected
    assert OTHER not in text and "Kabushiki" not in text

    rows = list(csv.DictReader(io.StringIO(alice.get(f"/advertisers/{OWN}/invoices/{MONTH}/invoice.csv").text)))
    lines = [r for r in rows if r["line_kind"] in ("charges", "correction", "adjustment")]
    assert sum(int(r["amount_micros"]) for r in lines) == 1_234_560
    totals = {r["line_kind"]: r for r in rows if r["line_kind"] in ("net", "amount", "tax", "total")}
    assert [totals[k]["amount"] for k in ("net", "amount", "tax", "total")] == [
        "1.23456",  # exact: finer than the cent where the micros are
        "1.23",
        "0.25",
        "1.48",
    ]
    assert {r["invoice"] for r in rows} == {"INV-000001"}

    pdf = alice.get(f"/advertisers/{OWN}/invoices/{MONTH}/invoice.pdf")
    assert pdf.status_code == 200 and pdf.data.startswith(b"%PDF")
    assert pdf.headers["Content-Disposition"].startswith('attachment; filename="adbill-INV-000001-')
    for figure in (b"INV-000001", b"1.48 EUR", b"Acme SA", b"half away from zero"):
        assert figure in pdf.data, figure
    png = render_pdf(pdf.data, invoiced.settings.root / "invoice.pdf")
    assert png.stat().st_size > 20_000

    document = alice.get(f"/api/v1/advertisers/{OWN}/invoices/{MONTH}").json
    assert document["total_micros"] == "1480000" and document["label"] == "INV-000001"
    assert document["lines"][0]["amount_micros"] == "1234560"
    assert alice.get(f"/api/v1/advertisers/{OWN}/invoices").json["open_month"]["month"] == "2026-01"
    # Another advertiser's invoice, one not issued and a malformed month.
    assert alice.get(f"/advertisers/{OTHER}/invoices/{MONTH}").status_code == 404
    assert alice.get(f"/advertisers/{OWN}/invoices/2026-01").status_code == 404
    assert alice.get(f"/advertisers/{OWN}/invoices/2025-13").status_code == 400


def render_pdf(data: bytes, path: Path) -> Path:
    """The PDF's first page as a PNG (`pdftoppm`), copied to var/test-output/screens/ to be looked at."""
    tool = deps.ensure_pdftoppm()
    path.write_bytes(data)
    subprocess.run(
        [str(tool), "-png", "-r", "110", "-f", "1", "-l", "1", str(path), str(path.with_suffix(""))], check=True
    )
    png = next(path.parent.glob(f"{path.stem}-*1.png"))
    target = web_screens_dir() / "invoice-pdf-page-1.png"
    shutil.copy(png, target)
    return target


def test_finance_sees_a_months_invoices_and_an_admin_sets_a_profile_as_the_command_would(invoiced: Seeded) -> None:
    fiona, ada, alice = client_of(invoiced, "fiona"), client_of(invoiced, "ada"), client_of(invoiced, "alice")
    page = fiona.get(f"/finance/invoices?month={MONTH}")
    assert page.status_code == 200 and "INV-000001" in page.text and "INV-000002" in page.text
    assert 'data-currency="EUR"' in page.text and 'data-currency="JPY"' in page.text
    document = fiona.get(f"/api/v1/finance/invoices?month={MONTH}").json
    assert document["total_micros_by_currency"] == {"EUR": "1480000", "JPY": "134000000"}
    assert fiona.get(f"/advertisers/{OTHER}/invoices/{MONTH}/invoice.pdf").status_code == 200
    assert alice.get("/finance/invoices").status_code == 404

    profiles = fiona.get("/billing-profiles")
    assert profiles.status_code == 200 and "Acme SA" in profiles.text and "Kabushiki Kaisha" in profiles.text
    assert 'id="set-profile"' not in fiona.get(f"/billing-profiles/{OWN}").text  # finance reads, never changes
    form = ada.get(f"/billing-profiles/{OWN}")
    token = form_token(form.text)
    fields = {"name": "Acme Europe SA", "address": "2 Quai\nLyon", "tax_id": "FR9", "tax_rate": "5.5"}
    refused = ada.post(f"/billing-profiles/{OWN}", data={**fields, "tax_rate": "5,5", "csrf_token": token})
    assert refused.status_code == 400 and "a tax rate is a percentage" in refused.text
    past = ada.post(
        f"/billing-profiles/{OWN}", data={**fields, "effective_from": "2025-01-01T00:00", "csrf_token": token}
    )
    assert past.status_code == 400 and "a billing profile changes from now on" in past.text
    made = ada.post(f"/billing-profiles/{OWN}", data={**fields, "csrf_token": token})
    assert made.status_code == 303
    shown = ada.get(made.headers["Location"]).text
    assert "Acme Europe SA" in shown and "5.5 %" in shown and "ada" in shown and "page" in shown
    assert fiona.post(f"/billing-profiles/{OWN}", data={**fields, "csrf_token": token}).status_code in (400, 404)
    # The invoice issued before keeps the profile it was issued with.
    assert "Acme SA" in alice.get(f"/advertisers/{OWN}/invoices/{MONTH}").text
