"""What the web tests share: a seeded data folder, Redis prefix and catalog database, the accounts, and logging in
with the form."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Self

import redis
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from billing.catalog import Catalog, generate_catalog
from billing.layout import DataLayout
from billing.store.stream_offsets import LagReading
from ops.settings import Settings
from web.access import Role
from web.app import create_app, exports_dir
from web.sample_data import SampleWriter, seed_sample

PASSWORD = "correct horse battery staple"
FIRST_PERIOD_MS = 1_767_225_600_000  # 2026-01-01T00:00Z
PERIODS = 6
CLOSED = 4
OWN = "adv-0000"
OTHER = "adv-0001"

# username -> (role, advertiser)
ACCOUNTS: dict[str, tuple[Role, str | None]] = {
    "alice": (Role.ADVERTISER, OWN),
    "bob": (Role.ADVERTISER, OTHER),
    "fiona": (Role.FINANCE, None),
    "ada": (Role.ADMIN, None),
}


@dataclass(frozen=True)
class Seeded:
    settings: Settings
    catalog: Catalog
    client: redis.Redis

    @property
    def writer(self) -> SampleWriter:
        return SampleWriter(self.client, self.settings.redis_prefix, exports_dir(self.settings))


def seed(settings: Settings, accounts: dict[str, tuple[Role, str | None]] | None = None) -> Seeded:
    """Three advertisers (2 campaigns x 2 ads each) in the settings' catalog database (`database_url`), six hourly
    periods, four closed and two exported, the accounts.

    The catalog is loaded as `adbill catalog import` loads one without a change log: its start has no recorded time,
    so it is older than anything the tests' clocks (January 2026) make."""
    catalog = generate_catalog(advertisers=3, campaigns_per_advertiser=2, ads_per_campaign=2, seed=7)
    settings.catalog_store().load(catalog, [])
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    seed_sample(
        SampleWriter(client, settings.redis_prefix, exports_dir(settings)),
        catalog,
        FIRST_PERIOD_MS,
        PERIODS,
        closed=CLOSED,
        exports=2,
    )
    store = settings.accounts_store()
    for name, (role, advertiser) in (ACCOUNTS if accounts is None else accounts).items():
        store.add(name, role, PASSWORD, advertiser)
    # The names' and the billing profiles' tables made now, as the catalog's: a test that compares every table's
    # rows before and after a request (`tests.catalog_rows`) sees the rows the request changed, not a table made.
    settings.names_store().version()
    settings.profile_store().current()
    return Seeded(settings, catalog, client)


@dataclass(frozen=True)
class SignedIn:
    """The app on the sample data (`seed`), each account of ACCOUNTS logged in on a client of its own, and an API
    token each."""

    app: Flask
    seeded: Seeded
    clients: dict[str, FlaskClient]
    tokens: dict[str, str]

    @classmethod
    def of(cls, settings: Settings) -> Self:
        seeded = seed(settings)
        app = create_app(settings, cache_s=0)
        clients = {}
        for name in ACCOUNTS:
            clients[name] = app.test_client()
            assert login(clients[name], name).status_code == 302
        store = settings.tokens_store()
        return cls(app, seeded, clients, {name: store.create(name)[0] for name in ACCOUNTS})

    @property
    def catalog(self) -> Catalog:
        """The catalog as every other part of the product reads it."""
        return self.seeded.settings.catalog_store().current()


def client_at(seeded: Seeded, who: str, now_ms: int) -> FlaskClient:
    """A client of the app on `seeded` whose clock says `now_ms` and whose Kafka has no lag, `who` logged in."""
    lag = LagReading({"clicks": 0, "impressions": 0}, True, now_ms)
    client = create_app(seeded.settings, clock=lambda: now_ms, cache_s=0, kafka_lag=lambda: lag).test_client()
    assert login(client, who).status_code == 302
    return client


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso(at_ms: int) -> str:
    """As a `datetime-local` field sends it: UTC, to the second."""
    return datetime.fromtimestamp(at_ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def form_token(html: str) -> str:
    """The CSRF token of the page's first form (on the login page: the login form's, after the logout form)."""
    if 'id="login-form"' in html:
        html = html[html.index('id="login-form"') :]
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the page has no CSRF token field"
    return match.group(1)


def login(client: FlaskClient, username: str, password: str = PASSWORD, next_url: str | None = None) -> TestResponse:
    """Log in through the form, as a browser does: fetch it for its token, then post."""
    page = client.get("/login")
    url = "/login" if next_url is None else f"/login?next={next_url}"
    return client.post(url, data={"username": username, "password": password, "csrf_token": form_token(page.text)})


def session_cookie(client: FlaskClient) -> str | None:
    cookie = client.get_cookie("adbill_session")
    return None if cookie is None else cookie.value


def web_screens_dir() -> Path:
    """Where screenshots are copied for people to look at: var/test-output/screens/."""
    from ops.settings import PROJECT_ROOT

    folder = PROJECT_ROOT / "var" / "test-output" / "screens"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def plant_exported_click(root: Path, period: str, advertiser_id: str, duplicate: bool = False) -> str:
    """The archive and ledger of a click the sample export of `period` bills to `advertiser_id` (its first billed
    row), written as the streaming job writes them, so that the click's story has its copies, impression, live bill
    and export row; `duplicate` adds a second, identical copy received later. Returns the click id."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from attribution.batch_output import ARCHIVE_COLUMNS, write_batch_files
    from billing.periods import Periods
    from billing.store.parquet_ledger import LEDGER_COLUMNS

    layout = DataLayout(root)
    export = pq.read_table(layout.export(period) / "billing.parquet")
    billed = pc.equal(export["status"], "billed")
    mine = export.filter(pc.and_(pc.equal(export["advertiser_id"], advertiser_id), billed))
    row = mine.slice(0, 1).to_pylist()[0]
    start = Periods().parse_key(period)
    at = start + 754_321
    batch = 500 + sum(map(ord, advertiser_id))

    def event(event_type: str, event_id: str, time_ms: int, received_ms: int, offset: int) -> dict[str, object]:
        return {
            "event_type": event_type, "event_id": event_id, "ad_id": row["ad_id"], "user_id": row["user_id"],
            "event_time": time_ms, "received_ms": received_ms, "topic": f"{event_type}s", "partition": 1,
            "offset": offset, "value": b"\0\0\0\0\1", "user_agent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/133.0",
            "ip": "192.0.2.44", "late": False, "period_start_ms": start, "period": period, "batch_id": batch,
        }  # fmt: skip

    events = [
        event("impression", row["impression_id"], at - 2_500, at - 2_300, 41),
        event("click", row["click_id"], at, at + 180, 57),
    ]
    if duplicate:
        events.append(event("click", row["click_id"], at, at + 4_180, 58))
    table = pa.Table.from_pylist(events).select(list(ARCHIVE_COLUMNS))
    write_batch_files(table, layout.archive, ["event_type", "period", "batch_id"])
    bill = {**row, "click_time": at, "impression_time": at - 2_500, "click_received_ms": at + 180,
            "billed_at_ms": at + 2_000, "period_start_ms": start, "period": period, "batch_id": batch}  # fmt: skip
    ledger = pa.Table.from_pylist([{name: bill[name] for name in LEDGER_COLUMNS}])
    write_batch_files(ledger, layout.ledger, ["period", "batch_id"])
    return str(row["click_id"])


def plant_not_charged_click(seeded: Seeded, period_start_ms: int, reason: str = "over_budget") -> str:
    """A click of the open period from `period_start_ms` that the stream did not charge for `reason`, written as the
    streaming job writes it: its impression and click in the archive, its row in the stream's `not_charged/` files.
    Returns the click id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from attribution.batch_output import ARCHIVE_COLUMNS, write_batch_files
    from billing.periods import Periods

    layout = DataLayout(seeded.settings.root)
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    period = Periods().key(period_start_ms)
    at = period_start_ms + 600_000
    click_id, impression_id, user_id, batch = f"nc-story-{reason}", f"i-nc-story-{reason}", "u-nc-story", 900

    def event(event_type: str, event_id: str, time_ms: int, offset: int) -> dict[str, object]:
        return {
            "event_type": event_type, "event_id": event_id, "ad_id": ad.ad_id, "user_id": user_id,
            "event_time": time_ms, "received_ms": time_ms + 150, "topic": f"{event_type}s", "partition": 0,
            "offset": offset, "value": b"\0\0\0\0\1", "user_agent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/133.0",
            "ip": "192.0.2.45", "late": False, "period_start_ms": period_start_ms, "period": period, "batch_id": batch,
        }  # fmt: skip

    events = [event("impression", impression_id, at - 3_000, 71), event("click", click_id, at, 72)]
    write_batch_files(
        pa.Table.from_pylist(events).select(list(ARCHIVE_COLUMNS)), layout.archive, ["event_type", "period", "batch_id"]
    )
    row = {
        "click_id": click_id, "impression_id": impression_id, "ad_id": ad.ad_id, "campaign_id": ad.campaign_id,
        "advertiser_id": OWN, "user_id": user_id, "click_time": at, "impression_time": at - 3_000,
        "amount_micros": ad.cpc_micros, "currency": ad.currency, "reason": reason,
    }  # fmt: skip
    folder = layout.not_charged / f"period={period}" / f"batch_id={batch}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([row]), folder / "part-0.parquet")
    return click_id
