"""`create_app(settings)`: the Flask app of the admin UI, wired to Redis, the database (the catalog, the accounts and
the API tokens) and the export folder.

`settings` is the project's settings object (`ops.settings.Settings`); this package only needs the attributes of
`WebSettings`, so that it does not import `ops` (the arrows of ARCHITECTURE.md point down).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import redis
from flask import Flask, Response, jsonify, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException
from werkzeug.middleware.proxy_fix import ProxyFix

from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.database import DatabaseUnavailable
from billing.store.stream_offsets import KafkaLag, LagReading
from web import (
    ad_catalog,
    api,
    auth,
    catalog_api,
    catalog_pages,
    display,
    downloads,
    invoice_documents,
    invoice_views,
    lookups,
    naming,
    pages,
    probes,
)
from web.access import LoginLimit, Role, may_change_catalog, may_see_finance, may_see_health
from web.advertiser_figures import AdvertiserFigures
from web.budget_days import BudgetDays
from web.cache import RecentResults
from web.changes import api_bp as change_api
from web.changes import bp as change_pages
from web.click_pages import register as register_click_pages
from web.correction_lists import CorrectionLists
from web.exports import ExportFolder
from web.finance_figures import FinanceFigures
from web.job_health import QUERY_NAMES, JobHealth
from web.metrics import instrument
from web.ranges import PRESETS
from web.readers import CatalogView, PeriodReader
from web.reasons import REASONS, reason_explanation, reason_label
from web.security import add_security_headers, load_or_create_secret, wants_secure_cookies
from web.services import Services, current_principal, now_ms, services
from web.sessions import LoginLimiter, SessionStore

if TYPE_CHECKING:
    from billing.store.catalog_db import CatalogDatabase
    from billing.store.invoice_db import InvoiceDatabase
    from billing.store.names_db import NamesDatabase
    from billing.store.profiles_db import ProfileDatabase
    from web.accounts import AccountsDatabase
    from web.tokens import TokensDatabase

RETRY_AFTER_S = 5
"""What a 503 (Redis unreachable) tells a client to wait before it tries again."""

REFRESH_MS = 3000
"""How often an advertiser's open dashboard asks the API for fresh figures."""

CACHE_S = 1.0
"""How long a worker keeps an advertiser's dashboard (see `web.cache`)."""


class WebSettings(Protocol):
    """What the web UI reads from the settings."""

    @property
    def redis_url(self) -> str: ...
    @property
    def redis_prefix(self) -> str: ...
    @property
    def root(self) -> Path: ...
    def catalog_store(self) -> CatalogDatabase: ...
    def invoice_store(self) -> InvoiceDatabase: ...
    def profile_store(self) -> ProfileDatabase: ...
    def names_store(self) -> NamesDatabase: ...
    def accounts_store(self) -> AccountsDatabase: ...
    def tokens_store(self, accounts: AccountsDatabase | None = None) -> TokensDatabase: ...
    @property
    def web_secret_file(self) -> Path: ...
    @property
    def web_secure_cookies(self) -> int: ...
    @property
    def web_trusted_proxies(self) -> int: ...
    @property
    def web_session_hours(self) -> int: ...
    @property
    def web_idle_minutes(self) -> int: ...
    @property
    def web_login_limit(self) -> int: ...
    @property
    def web_address_login_limit(self) -> int: ...
    @property
    def web_ready_batch_age_s(self) -> int: ...
    @property
    def period_ms(self) -> int: ...
    @property
    def lateness_horizon_ms(self) -> int: ...
    @property
    def impression_watermark_ms(self) -> int: ...
    @property
    def click_watermark_ms(self) -> int: ...
    @property
    def kafka_bootstrap(self) -> str: ...
    @property
    def topic_impressions(self) -> str: ...
    @property
    def topic_clicks(self) -> str: ...
    @property
    def story_days(self) -> int: ...


def exports_dir(settings: WebSettings) -> Path:
    """Where reconciliation writes each closed period's export: `HOME/exports/PERIOD/` (`billing.layout`)."""
    return DataLayout(settings.root).exports


def create_app(
    settings: WebSettings,
    clock: Callable[[], int] = now_ms,
    cache_s: float = CACHE_S,
    kafka_lag: Callable[[], LagReading] | None = None,
) -> Flask:
    """The app. `clock` (epoch ms) is injected for tests of the login limit, `cache_s` for tests that change Redis
    and look at once, `kafka_lag` for tests of the health page (default: read from Kafka and the billing query's
    checkpoint, `billing.store.stream_offsets.KafkaLag`); nothing connects until a request."""
    app = Flask(__name__)
    secret = load_or_create_secret(settings.web_secret_file)
    app.secret_key = secret
    app.config.update(MAX_CONTENT_LENGTH=64 * 1024, JSON_SORT_KEYS=False, TEMPLATES_AUTO_RELOAD=False)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=5, socket_connect_timeout=2)
    accounts = settings.accounts_store()  # one per process: each request asks the database one small question
    catalogs = settings.catalog_store()  # one per process: each request reads only what changed since the last
    catalog, period_length = CatalogView(catalogs), Periods(settings.period_ms)
    periods = PeriodReader(client, settings.redis_prefix, catalog, period_length)
    exports = ExportFolder(exports_dir(settings), period_length)
    app.extensions["adbill"] = Services(
        catalog=catalog,
        periods=periods,
        figures=AdvertiserFigures(periods, catalog),
        corrections=CorrectionLists(client, periods.keys, catalog),
        budgets=BudgetDays(client, periods.keys, catalog),
        finance=FinanceFigures(periods, catalog, exports),
        exports=exports,
        job=JobHealth(periods, catalog),
        accounts=accounts,
        tokens=settings.tokens_store(accounts),
        sessions=SessionStore(
            client, settings.redis_prefix, secret, settings.web_session_hours * 3600, settings.web_idle_minutes * 60
        ),
        limiter=LoginLimiter(
            client,
            settings.redis_prefix,
            per_account=LoginLimit(max_failures=settings.web_login_limit),
            per_address=LoginLimit(max_failures=settings.web_address_login_limit),
        ),
        secret=secret,
        secure_cookies=bool(settings.web_secure_cookies),
        session_ttl_s=settings.web_session_hours * 3600,
        refresh_ms=REFRESH_MS,
        recent=RecentResults(cache_s),
        clock=clock,
        ready_batch_age_s=settings.web_ready_batch_age_s,
        horizon_ms=settings.lateness_horizon_ms,
        watermark_delay_ms=max(settings.impression_watermark_ms, settings.click_watermark_ms),
        kafka_lag=kafka_lag
        or KafkaLag(
            DataLayout(settings.root).checkpoint(QUERY_NAMES[0]),
            settings.kafka_bootstrap,
            (settings.topic_impressions, settings.topic_clicks),
        ).read,
    )

    if settings.web_trusted_proxies:
        # Only as many X-Forwarded-* entries as there are proxies of ours are believed: the client's own are not.
        n = settings.web_trusted_proxies
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=n, x_proto=n)  # type: ignore[method-assign]

    instrument(app)
    app.before_request(auth.load_principal)
    app.before_request(auth.check_csrf)
    app.register_blueprint(auth.bp)
    app.register_blueprint(pages.bp)
    app.register_blueprint(downloads.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(probes.bp)
    app.register_blueprint(catalog_pages.bp)  # the catalog: advertisers' ads, an admin's changes
    app.register_blueprint(catalog_api.bp)
    ad_catalog.register(app, catalogs)
    register_click_pages(app, settings, catalogs, clock)  # a click's story: its page and API document
    app.register_blueprint(change_pages)  # the catalog's change log
    app.register_blueprint(change_api)
    # the monthly invoices and the billing profiles; the names of campaigns and ads: one store of each per process
    invoice_views.register(app, settings.invoice_store(), settings.profile_store())
    naming.register(app, settings.names_store())

    @app.after_request
    def headers(response: Response) -> Response:
        return add_security_headers(response, wants_secure_cookies(request, bool(settings.web_secure_cookies)))

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> ResponseReturnValue:
        status = error.code or 500
        if request.path.startswith("/api/"):
            message = "login required" if status == 401 else (error.description or error.name)
            if status == 404:
                message = "not found"
            return jsonify({"error": message, "status": status}), status
        if status == 401:
            return redirect(url_for("auth.login_form"))
        return render_template("error.html", status=status, name=error.name, error=error), status

    def unavailable(message: str, api_error: str) -> ResponseReturnValue:
        """503 with a clear page, or a JSON body under /api/, and a hint to retry."""
        if request.path.startswith("/api/"):
            response = jsonify({"error": api_error, "status": 503})
        else:
            response = Response(
                render_template("error.html", status=503, name="Service Unavailable", error=_Described(message)),
                mimetype="text/html",
            )
        response.status_code = 503
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response

    @app.errorhandler(redis.ConnectionError)
    @app.errorhandler(redis.TimeoutError)
    def redis_unreachable(error: redis.RedisError) -> ResponseReturnValue:
        """Redis down is not a bug of the page."""
        app.logger.warning("Redis at %s is unreachable: %s", redis_address(settings.redis_url), error)
        return unavailable(
            "The billing data store (Redis) is unreachable; figures cannot be shown. Try again shortly.",
            "Redis is unreachable",
        )

    @app.errorhandler(DatabaseUnavailable)
    def database_unreachable(error: DatabaseUnavailable) -> ResponseReturnValue:
        """The database down (and nothing held to go on with, such as the accounts of a worker that has read none
        yet); the database is named in the log only."""
        app.logger.warning("%s", error)
        return unavailable(
            "The product's database (PostgreSQL) is unreachable; this cannot be shown. Try again shortly.",
            "the database is unreachable",
        )

    app.jinja_env.globals.update(
        csrf_token=auth.csrf_token,
        login_csrf_token=auth.login_csrf_token,
        principal=current_principal,
        may_see_finance=may_see_finance,
        may_see_health=may_see_health,
        may_change_catalog=may_change_catalog,
        Role=Role,
        age=display.age,
        reasons=REASONS,
        range_presets=PRESETS,
        range_url=pages.range_url,
        months_of=downloads.months_of,
        clock_ms=lambda: services().clock(),
        final_at_ms=final_at_ms,
        horizon_minutes=lambda: services().horizon_ms // 60_000,
        range_problem=lookups.range_problem,
        name_of=naming.name_of,
    )
    app.jinja_env.filters.update(
        money=display.money,
        budget=display.budget,
        currency_digits=display.currency_digits,
        signed_money=display.signed_money,
        count=display.count,
        plural=display.plural,
        corrects_label=invoice_documents.corrects_label,
        signed_count=display.signed_count,
        utc=display.utc,
        iso_utc=display.iso_utc,
        period_label=display.period_label,
        size=display.size,
        duration=display.duration_ms,
        reason_label=reason_label,
        reason_explanation=reason_explanation,
    )
    return app


def final_at_ms(period_start_ms: int) -> int:
    """When an open period's figures can become final at the earliest: its end plus the lateness horizon, the first
    moment reconciliation corrects and closes it (`billing.reconcile_plan.plan_run`; later if the stream has not read
    past it by then)."""
    svc = services()
    return period_start_ms + svc.periods.length.length_ms + svc.horizon_ms


class _Described:
    """An error with a description, as `error.html` shows one."""

    def __init__(self, description: str) -> None:
        self.description = description


def redis_address(url: str) -> str:
    """`url` without its password, for the log."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.hostname}{f':{parsed.port}' if parsed.port else ''}{parsed.path}"
