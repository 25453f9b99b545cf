"""The adapters one web app uses, wired once by `create_app`, and how a view reaches them and the logged-in person."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from flask import current_app, g

from billing.store.stream_offsets import LagReading
from web.access import Principal
from web.accounts import AccountsDatabase
from web.advertiser_figures import AdvertiserFigures
from web.budget_days import BudgetDays
from web.cache import RecentResults
from web.correction_lists import CorrectionLists
from web.exports import ExportFolder
from web.finance_figures import FinanceFigures
from web.job_health import JobHealth
from web.readers import CatalogView, PeriodReader
from web.sessions import LoginLimiter, SessionRecord, SessionStore
from web.tokens import TokensDatabase


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Services:
    """Everything a request may need, built once per process."""

    catalog: CatalogView
    """The ad catalog as of its latest version: currencies, and which ad or campaign belongs to whom."""
    periods: PeriodReader
    """The periods in Redis and who has totals in each."""
    figures: AdvertiserFigures
    """An advertiser's figures: its dashboard, campaigns and ads."""
    corrections: CorrectionLists
    budgets: BudgetDays
    finance: FinanceFigures
    exports: ExportFolder
    """The finished exports and their files, and the clicks not charged."""
    job: JobHealth
    """The streaming job's heartbeat and health, what each part waits for, the last reconciliation."""
    accounts: AccountsDatabase
    tokens: TokensDatabase
    sessions: SessionStore
    limiter: LoginLimiter
    secret: bytes
    secure_cookies: bool
    session_ttl_s: int
    refresh_ms: int
    recent: RecentResults
    clock: Callable[[], int] = now_ms
    ready_batch_age_s: int = 60
    kafka_lag: Callable[[], LagReading] | None = None
    """The billing query's lag read from Kafka and its checkpoint now (the health page), None: not asked."""
    watermark_delay_ms: int = 10_000
    """The streams' watermark delay (the longer of the two): how far behind the clock the job's watermark is by
    design (the health page says how much further it is)."""
    horizon_ms: int = 15 * 60_000
    """The lateness horizon: how long after its end a period waits for late events before reconciliation corrects
    and closes it (the pages say when an open period's figures become final)."""


def services() -> Services:
    """The app's services (inside a request or app context)."""
    found: Services = current_app.extensions["adbill"]
    return found


def current_principal() -> Principal | None:
    """Who is logged in for this request, or None."""
    return g.get("principal")


def current_session() -> tuple[str, SessionRecord] | None:
    """(session id, record) of this request's session, or None."""
    return g.get("session")
