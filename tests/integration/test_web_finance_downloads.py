"""Every download link of the finance page answers 200 with the file it names: each closed period's export files
(`billing.parquet`, `billing.csv`, `not_charged.parquet`, `manifest.json`, `SHA256SUMS`) byte for byte as
reconciliation wrote them, and the months' CSVs.

The app as `adbill web` serves it (`create_app`), on the session's Redis, with the sample's periods and one export
written with its not-charged clicks, as a reconciliation run writes it.
"""

from __future__ import annotations

import hashlib
import re
from html import unescape

import pytest

from billing.store.export_files import export_table, not_charged_table, write_export
from ops.settings import Settings
from tests.web_support import FIRST_PERIOD_MS, OWN, login, seed
from web.app import create_app, exports_dir

pytestmark = pytest.mark.integration

H = 3_600_000


def test_every_download_link_on_the_finance_page_answers_with_its_file(redis_settings: Settings) -> None:
    seeded = seed(redis_settings)
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    start = FIRST_PERIOD_MS - 2 * H  # before the sample's periods: an export of its own, with not-charged clicks
    period = "20251231T2200Z"
    click = {
        "click_id": "c-bot",
        "impression_id": "i-bot",
        "ad_id": ad.ad_id,
        "campaign_id": ad.campaign_id,
        "advertiser_id": OWN,
        "user_id": "u-bot",
        "click_time": start + 60_000,
        "impression_time": start + 55_000,
        "amount_micros": ad.cpc_micros,
        "currency": ad.currency,
    }
    write_export(
        redis_settings.root,
        period,
        export_table([{**click, "click_id": "c-ok", "record_type": "click", "net_micros": ad.cpc_micros,
                       "status": "billed", "corrects_period": period, "booked_period": period}]),
        start,
        start + H,
        start + 2 * H,
        not_charged=not_charged_table([{**click, "reason": "known_bot"}]),
    )  # fmt: skip
    fiona = create_app(redis_settings, cache_s=0).test_client()
    assert login(fiona, "fiona").status_code == 302
    page = fiona.get("/finance").text
    links = [unescape(h) for h in re.findall(r'<a class="download" href="([^"]+)"', page)]
    folder = exports_dir(redis_settings) / period
    ours = [link for link in links if f"/{period}/" in link]
    assert sorted(link.rsplit("/", 1)[1] for link in ours) == sorted(
        ["billing.parquet", "billing.csv", "not_charged.parquet", "manifest.json", "SHA256SUMS"]
    ), ours
    downloaded = {}
    for link in links:
        response = fiona.get(link)
        assert response.status_code == 200, (link, response.status_code, response.text[:200])
        if "/exports/" in link:
            name = link.rsplit("/", 1)[1]
            exported = link.split("/exports/")[1].split("/")[0]
            assert response.data == (exports_dir(redis_settings) / exported / name).read_bytes(), link
            if exported == period:
                downloaded[name] = response.data
        else:  # a month's CSV
            assert response.mimetype == "text/csv" and response.text.count("\n") >= 1, link
    # The checksums file proves the files downloaded beside it.
    sums = dict(line.split("  ")[::-1] for line in downloaded["SHA256SUMS"].decode().splitlines())
    assert sums == {name: hashlib.sha256(downloaded[name]).hexdigest() for name in sums}
    assert set(sums) == {"billing.parquet", "billing.csv", "not_charged.parquet", "manifest.json"}
    assert (folder / "not_charged.parquet").read_bytes() == downloaded["not_charged.parquet"]
