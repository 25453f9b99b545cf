"""The whole catalog listed a page at a time (the admin's `/catalog` and `GET /api/v1/catalog/ads`), in the order of
advertiser, campaign and ad, on the real database and Redis: a network's catalog is never rendered whole."""

from __future__ import annotations

import re

import pytest

from billing.catalog import AdChange, generate_catalog
from ops.settings import Settings
from tests.web_support import PASSWORD, login
from web.access import Role
from web.app import create_app

pytestmark = pytest.mark.integration


def test_the_catalog_page_and_its_api_list_every_ad_a_page_at_a_time(redis_settings: Settings) -> None:
    catalog = generate_catalog(advertisers=30, campaigns_per_advertiser=10, ads_per_campaign=4, seed=5)  # 1,200
    store = redis_settings.catalog_store()
    store.start(catalog)
    store.change(lambda current, now: AdChange("aaa-new-ad", now, 1_000, "aaa-c", "aaa-adv", "EUR"))
    accounts = redis_settings.accounts_store()
    accounts.add("root", Role.ADMIN, PASSWORD, None)
    token = redis_settings.tokens_store(accounts).create("root")[0]
    app = create_app(redis_settings)
    client = app.test_client()
    login(client, "root")
    expected = sorted(
        [*catalog, store.current()["aaa-new-ad"]], key=lambda a: (a.advertiser_id, a.campaign_id, a.ad_id)
    )
    order = [ad.ad_id for ad in expected]

    seen: list[str] = []
    offset = 0
    while True:
        html = client.get(f"/catalog?offset={offset}").get_data(as_text=True)
        rows = re.findall(r'<tr id="ad-([^"]+)">', html)
        assert len(rows) <= 500
        seen += rows
        if 'id="catalog-next"' not in html:
            break
        offset += 500
    assert seen == order and seen[0] == "aaa-new-ad", "every ad once, the new one in its place"
    assert "1,201 ads, 1,001 to 1,201 shown" in html

    headers = {"Authorization": f"Bearer {token}"}
    page = client.get("/api/v1/catalog/ads?offset=1190&limit=50", headers=headers).get_json()
    assert (page["total"], page["offset"], page["limit"]) == (1201, 1190, 50)
    assert [a["ad_id"] for a in page["ads"]] == order[1190:]
    assert client.get("/api/v1/catalog/ads?limit=0", headers=headers).status_code == 400
