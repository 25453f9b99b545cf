"""`adbill`: the one command-line entry point. Each subcommand is a thin translation into a call."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from billing.store.catalog_file import command_made_by
from billing.store.durable import write_whole
from ops.process import interrupt_on_sigterm
from ops.reach import EXIT_UNREACHABLE
from ops.settings import Settings, describe

if TYPE_CHECKING:
    import datetime as dt

    from billing.catalog import AdChange, BudgetSetting, Catalog, ExclusionSetting
    from billing.store.catalog_db import CatalogDatabase


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "cluster", False):
        # The children read their settings from the environment too: they all see the cluster's.
        os.environ["ADBILL_CLUSTER"] = "1"
    # `adbill down` and the stack stop children with SIGTERM: let them end as cleanly as on Ctrl-C.
    interrupt_on_sigterm()
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        parser.error(str(exc))
    try:
        _require(settings, getattr(args, "needs", ()))
        return int(args.run(settings, args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the CLI's last line of defence: one clear line, not a traceback
        if os.environ.get("ADBILL_DEBUG"):
            raise
        from ops.deps import DependencyError
        from ops.process import ServiceError
        from ops.reach import Unreachable

        if isinstance(exc, Unreachable):
            print(f"adbill {args.command}: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
        kind = "error" if isinstance(exc, DependencyError | ServiceError | ValueError | OSError) else "unexpected error"
        print(f"adbill {args.command}: {kind}: {exc}", file=sys.stderr)
        return 1


def _require(settings: Settings, needs: tuple[str, ...]) -> None:
    """Fail in one line, within seconds, when a service the command needs does not answer."""
    if not needs:
        return
    from ops.reach import log_kafka_client_to_file, require

    if "kafka" in needs:
        log_kafka_client_to_file(settings)
    require(settings, needs)


_CHANGE_TIMING = (
    "A change takes effect now or at a later --at, never in the past (--backfill, for recorded history, is the one "
    "exception)"
)
"""The catalog's rule for when a change (a price, a budget, an IP exclusion) takes effect, as the commands say it."""


def _add_change_time(p: argparse.ArgumentParser, at_help: str) -> None:
    """A catalog-changing command's `--at` (helped by `at_help`) and `--backfill`; the rule they follow is said once,
    in the commands' descriptions (`_CHANGE_TIMING`)."""
    p.add_argument("--at", help=at_help)
    p.add_argument("--backfill", action="store_true", help="accept an --at in the past (recorded history only)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adbill", description="Ad-attribution billing on Kafka, Spark and Redis.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("up", help="start the local stack in the foreground; Ctrl-C stops it")
    p.add_argument("--detach", action="store_true", help="start, print where everything is, and return")
    p.add_argument("--no-traffic", action="store_true", help="do not start the traffic simulator")
    p.add_argument("--no-job", action="store_true", help="do not start the streaming job")
    p.add_argument("--no-web", action="store_true", help="do not start the web UI")
    p.add_argument(
        "--cluster",
        action="store_true",
        help="the local cluster: three Kafka brokers, a Spark master and two workers, the jobs submitted to it "
        "(ADBILL_CLUSTER=1; data in var/cluster)",
    )
    p.set_defaults(run=cmd_up)

    p = sub.add_parser("down", help="stop a local stack or cluster left in the background")
    p.add_argument("--cluster", action="store_true", help="only the local cluster's (ADBILL_CLUSTER=1)")
    p.set_defaults(run=cmd_down)

    p = sub.add_parser(
        "deps",
        help="fetch the jars; install redis-server, chromium, promtool, pdftoppm and dot if missing",
    )
    p.add_argument("--jars-only", action="store_true", help="fetch the jars only (where Redis runs elsewhere)")
    p.set_defaults(run=cmd_deps)

    p = sub.add_parser("settings", help="list the ADBILL_* settings and the values in force")
    p.set_defaults(run=cmd_settings)

    p = sub.add_parser("topics", help="create the impressions, clicks and quarantine topics (idempotent)")
    p.set_defaults(run=cmd_topics, needs=("kafka",))

    p = sub.add_parser(
        "catalog",
        help="the ad catalog: generate, show, create-ad, set-price, pause, resume, history, set-budget, budgets",
        description=f"The ad catalog, its price histories and the campaigns' daily budgets. {_CHANGE_TIMING}; the "
        "streaming job, reconciliation and the web UI see it within seconds, without a restart.",
    )
    p.add_argument("action", choices=list(CATALOG_ACTIONS))
    p.add_argument(
        "ad_id",
        nargs="?",
        metavar="ID",
        help="the ad (create-ad, set-price, pause, resume, history), the campaign (set-budget, budgets) or the "
        "file (export: - for standard output; import: into a database that holds no catalog)",
    )
    p.add_argument("--campaign", help="create-ad: the campaign the ad belongs to")
    p.add_argument("--advertiser", help="create-ad: the advertiser the ad belongs to")
    p.add_argument("--currency", help="create-ad: ISO 4217 currency of its prices, such as EUR")
    p.add_argument("--cpc-micros", help="create-ad, set-price, resume: the price of one click, in integer micros")
    p.add_argument("--daily-micros", help="set-budget: the campaign's daily budget, in integer micros of its currency")
    p.add_argument("--unlimited", action="store_true", help="set-budget: no daily budget from --at on")
    _add_change_time(p, "when the change takes effect: epoch ms or ISO-8601 (default: now)")
    p.add_argument("--advertisers", type=int, default=5)
    p.add_argument("--campaigns", type=int, default=3, help="generate: campaigns per advertiser")
    p.add_argument("--ads", type=int, default=4, help="generate: ads per campaign")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--force",
        action="store_true",
        help="generate: replace an existing catalog that was never changed nor priced with (never one with a history)",
    )
    p.set_defaults(run=cmd_catalog, needs=("postgres",))

    p = sub.add_parser(
        "ivt",
        help="invalid traffic: the IP exclusion list (exclude, include, list)",
        description="The operator's IP exclusion list: a click from a range excluded at its time is invalid and not "
        f"charged (excluded_ip). {_CHANGE_TIMING}; every part sees it within seconds, without a restart.",
    )
    p.add_argument("action", choices=["exclude", "include", "list"])
    p.add_argument("cidr", nargs="?", help="an IPv4 or IPv6 range, such as 203.0.113.0/24 or 2001:db8::/32")
    _add_change_time(p, "when the change takes effect, or the time to list: epoch ms or ISO-8601 (default: now)")
    p.add_argument("--history", action="store_true", help="list: every entry of the list's history too")
    p.set_defaults(run=cmd_ivt, needs=("postgres",))

    p = sub.add_parser("produce", help="simulate traffic into Kafka, writing the ground truth beside the run")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--events", type=int, help="number of events to send")
    size.add_argument("--duration", type=float, help="seconds of event time to simulate")
    p.add_argument("--rate", type=float, default=None, help="events per second offered (default: as fast as possible)")
    p.add_argument(
        "--live",
        action="store_true",
        help="send each event when the wall clock reaches its arrival time, so event time tracks now "
        "(at --rate events per second on average, or as --impression-rate makes it)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run-dir", type=Path, default=None, help="where the ground truth goes (default HOME/runs/...)")
    p.add_argument("--users", type=int, default=1_000)
    p.add_argument("--impression-rate", type=float, default=None, help="impressions per second of event time")
    p.add_argument("--ctr", type=float, default=0.1, help="click-through rate")
    p.add_argument("--beyond-window", type=float, default=0.05, help="fraction of clicks later than 10 s")
    p.add_argument("--out-of-order", type=float, default=0.05, help="fraction of events out of order")
    p.add_argument("--late", type=float, default=0.01, help="fraction of events arriving past the watermark")
    p.add_argument("--duplicates", type=float, default=0.01, help="fraction of events sent twice")
    p.add_argument("--bad", type=float, default=0.002, help="fraction of bad records")
    p.add_argument(
        "--catalog-every",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="change the catalog every SECONDS of event time during the run: new prices, pauses and resumes, "
        "--new-ads created (made in the pipeline's catalog as the run goes; default 0: no changes)",
    )
    p.add_argument("--new-ads", type=int, default=0, help="ads the run creates (with --catalog-every)")
    invalid = p.add_argument_group(
        "invalid traffic and budgets",
        "FRACTIONs are per click of ordinary traffic; all default to 0 (none). The ground truth says how each such "
        "click is billed (summary.json: not_charged by reason, budgets per campaign and day).",
    )
    invalid.add_argument(
        "--crawlers", type=float, default=0.0, metavar="FRACTION", help="clicks from known crawlers (known_bot)"
    )
    invalid.add_argument(
        "--excluded-ips",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="clicks from excluded IP ranges; the run adds 198.51.100.0/24 and 2001:db8::/32 to the IP exclusion "
        "list from its start and 203.0.113.0/24 from halfway or --changes-at (excluded_ip)",
    )
    invalid.add_argument(
        "--floods",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="clicks in floods: users making 25 to 40 clicks within a minute, across ads (click_flood)",
    )
    invalid.add_argument(
        "--double-clicks",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="clicks followed by a second one of the user on the ad 100 to 900 ms later (duplicate_click)",
    )
    invalid.add_argument(
        "--late-duplicates",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="clicks that a late click of the same user and ad, up to 10 s earlier in event time, makes duplicates "
        "after they were billed (duplicate_click)",
    )
    invalid.add_argument(
        "--budget-campaigns",
        type=int,
        default=0,
        metavar="N",
        help="campaigns given a daily budget the run exhausts (from its start; halfway or at --changes-at, one raised "
        "by half, one halved, one made unlimited)",
    )
    invalid.add_argument(
        "--changes-at",
        type=float,
        default=None,
        metavar="SECONDS",
        help="SECONDS of the run's time after its start, the budgets change and 203.0.113.0/24 joins the IP "
        "exclusion list (default: halfway through the run)",
    )
    invalid.add_argument(
        "--budget-share",
        type=float,
        default=0.3,
        metavar="SHARE",
        help="each budget as a share of what the traffic is expected to spend on the campaign in the run (a day at "
        "most; default 0.3)",
    )
    p.add_argument(
        "--deploy-schema-at",
        type=float,
        default=None,
        metavar="SECONDS",
        help="SECONDS of the run's time after its start, the producers deploy a new schema version of both event "
        "types (one more optional field, `placement`), registered then, and write every later event with it",
    )
    p.add_argument(
        "--follow-catalog",
        action="store_true",
        help="send the traffic to the ads of the pipeline's catalog as it is (an ad an admin creates gets traffic), "
        "and leave alone what someone else changed there (the run makes none of its own changes to it)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=cmd_produce, needs=("kafka", "postgres"))

    p = sub.add_parser("stream", help="run the streaming attribution job until stopped")
    p.add_argument(
        "--new-checkpoint",
        action="store_true",
        help="start a new checkpoint over the output of an earlier one: its batches continue the earlier ones and "
        "it reads from where they stopped (the earlier checkpoint folder must be gone)",
    )
    p.set_defaults(run=cmd_stream, needs=("kafka", "redis", "postgres"))

    p = sub.add_parser("web", help="serve the web UI (gunicorn) on ADBILL_WEB_HOST:ADBILL_WEB_PORT until stopped")
    p.set_defaults(run=cmd_web)

    p = sub.add_parser("users", help="manage the web UI's accounts: add, list, disable, enable, reset-password")
    users = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    u = users.add_parser("add", help="add an account (the password is prompted for, or read from stdin)")
    u.add_argument("username")
    u.add_argument("--role", required=True, choices=["advertiser", "finance", "admin"])
    u.add_argument("--advertiser", help="the advertiser an advertiser account sees (required for that role)")
    u.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    users.add_parser("list", help="list the accounts")
    for action, what in (("disable", "refuse logins and end the account's sessions"), ("enable", "allow logins")):
        u = users.add_parser(action, help=what)
        u.add_argument("username")
    u = users.add_parser("reset-password", help="set a new password; the account's sessions end")
    u.add_argument("username")
    u.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    p.set_defaults(run=cmd_users, needs=("postgres",))

    p = sub.add_parser("tokens", help="manage API tokens for /api/v1: create, list, revoke")
    tokens = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    t = tokens.add_parser("create", help="a new token with exactly USER's access, printed once")
    t.add_argument("username")
    t = tokens.add_parser("list", help="the tokens (ids and when made, never the tokens) of USER, or of everyone")
    t.add_argument("username", nargs="?")
    t = tokens.add_parser("revoke", help="revoke USER's token TOKEN_ID, or all of USER's tokens")
    t.add_argument("username")
    t.add_argument("token_id", nargs="?")
    p.set_defaults(run=cmd_tokens, needs=("postgres",))

    p = sub.add_parser("reconcile", help="reconcile the periods past their lateness horizon, close them, export them")
    p.add_argument(
        "--until",
        metavar="TIME",
        help="also reconcile and close every period that ends by TIME (ISO-8601 UTC or epoch ms): back-fills, tests",
    )
    p.add_argument(
        "--every",
        type=int,
        nargs="?",
        const=0,
        metavar="SECONDS",
        help="run again every SECONDS until stopped (no number: every ADBILL_RECONCILE_INTERVAL_S)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="close periods even when the streaming job has not read everything Kafka held for them "
        "(what it bills for them later becomes adjustments)",
    )
    p.set_defaults(run=cmd_reconcile, needs=("redis", "postgres"))

    p = sub.add_parser(
        "audit",
        help="prove the books: the rule over every event received against the exports plus adjustments (closed "
        "periods) and the ledger plus corrections (open ones); exits 1 on any difference",
    )
    p.set_defaults(run=cmd_audit, needs=("redis", "postgres"))

    p = sub.add_parser(
        "explain",
        help="a click's whole story: every copy received, its impression, price, outcome and why, what the stream "
        "did, its corrections and export rows",
    )
    p.add_argument("click_id")
    p.add_argument(
        "--day",
        type=_click_day,
        help="the click's UTC day, YYYY-MM-DD: only that day's periods are searched (without it, the newest day first, "
        "back ADBILL_STORY_DAYS days); a day older than that is told from its exports",
    )
    p.add_argument("--json", action="store_true", help="the story as JSON (as GET /api/v1/clicks/ID gives it)")
    p.set_defaults(run=cmd_explain, needs=("postgres",))

    p = sub.add_parser(
        "invoices",
        help="the monthly invoices: issue (those of every month whose periods are all closed), list, show",
        description="Reconciliation issues a month's invoices when it closes the month's last period; `issue` does "
        "the same by hand (idempotent: an issued invoice never changes, a month is invoiced once).",
    )
    p.add_argument("action", choices=["issue", "list", "show"])
    p.add_argument("advertiser", nargs="?", help="show: the advertiser; list: only its invoices")
    p.add_argument("--month", help="YYYY-MM: issue that month (and those before it), list or show it")
    p.set_defaults(run=cmd_invoices, needs=("postgres",))  # the invoices; the profiles and names they are made with

    p = sub.add_parser(
        "profiles",
        help="the advertisers' billing profiles (who an invoice is addressed to, tax id and rate): set, show, list",
        description="A profile takes effect now or at a later --at, never in the past; its history is kept, and "
        "an invoice takes the profile in force at its month's end.",
    )
    p.add_argument("action", choices=["set", "show", "list"])
    p.add_argument("advertiser", nargs="?")
    p.add_argument("--name", help="set: the name invoices are addressed to")
    p.add_argument("--address", help="set: the postal address (lines separated by \\n)")
    p.add_argument("--tax-id", help="set: the advertiser's tax id (VAT number)")
    p.add_argument("--tax-rate", help="set: the tax rate in percent, an exact decimal such as 19 or 7.7 (0: none)")
    p.add_argument("--at", help="set: when it takes effect: epoch ms or ISO-8601 (default: now)")
    p.set_defaults(run=cmd_profiles, needs=("postgres",))

    p = sub.add_parser("names", help="the names of campaigns and ads, for people (pages, invoices): set, list")
    p.add_argument("action", choices=["set", "list"])
    p.add_argument("kind", nargs="?", choices=["campaign", "ad"], help="list: only the names of campaigns or ads")
    p.add_argument("item_id", nargs="?", metavar="ID", help="list: only this campaign's or ad's name")
    p.add_argument("name", nargs="?", help="set: the name (empty: none)")
    p.set_defaults(run=cmd_names, needs=("postgres",))

    p = sub.add_parser(
        "health", help="exit 0 when a long-running part is healthy, 1 if not, with one line saying why (health checks)"
    )
    p.add_argument("part", choices=["stream", "reconcile", "web"])
    p.set_defaults(run=cmd_health)

    p = sub.add_parser(
        "click-filters",
        help="write again the day filters and price counts that click stories read (of DAY, or of every closed "
        "period); reconciliation writes them as periods close",
    )
    p.add_argument("--day", metavar="YYYY-MM-DD", help="the UTC day whose closed periods to write (default: all)")
    p.set_defaults(run=cmd_click_filters)

    p = sub.add_parser("export", help="copy the finance exports of closed periods to a folder")
    p.add_argument("period", help="a period key such as 20260101T0000Z, or the first of a range with --to")
    p.add_argument("--to", metavar="PERIOD", help="the last period of the range (inclusive)")
    p.add_argument("--out", type=Path, required=True, help="folder to copy PERIOD/ folders into")
    p.set_defaults(run=cmd_export)

    p = sub.add_parser(
        "restore-redis",
        aliases=["rebuild-totals"],
        help="put back every billing figure in Redis from the data folder after Redis lost its data "
        "(stop the job first)",
    )
    p.set_defaults(run=cmd_restore_redis, needs=("redis", "postgres"))

    p = sub.add_parser("replay", help="publish a recorded capture (JSON Lines) in file order")
    p.add_argument("file", type=Path)
    p.add_argument("--rate", type=float, default=None, help="events per second (default: as fast as possible)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=cmd_replay, needs=("kafka", "postgres"))

    p = sub.add_parser(
        "kafka",
        help="run one of Kafka's own tools with the fetched jars, e.g. `adbill kafka console-consumer ...`",
    )
    p.add_argument("tool", help="console-consumer, console-producer, topics, consumer-groups, get-offsets, ...")
    p.add_argument("tool_args", nargs=argparse.REMAINDER)
    p.set_defaults(run=cmd_kafka)
    return parser


CHILDREN = {"stream": ["stream"], "reconcile": ["reconcile", "--every"], "web": ["web"]}
"""The product's long-running processes `adbill up` starts, with their adbill arguments (and the traffic, below);
docker-compose.yml runs the same commands."""


def cmd_up(settings: Settings, args: argparse.Namespace) -> int:
    from ops.stack import Stack, print_where

    s = settings
    # Services elsewhere must answer; local ones the stack starts itself.
    services = (("kafka", s.kafka_is_local), ("redis", s.redis_is_local), ("postgres", s.database_is_local))
    _require(settings, tuple(n for n, local in services if not local))
    stack = Stack(settings)
    try:
        stack.start_services()
        if not args.no_job:
            stack.start_child("stream", CHILDREN["stream"])
            if settings.reconcile_interval_s > 0:
                stack.start_child("reconcile", CHILDREN["reconcile"])
        if not args.no_web:
            stack.start_child("web", CHILDREN["web"])
            stack.wait_healthy("web", f"{_web_url(settings)}/healthz")
        if not args.no_traffic and settings.traffic_rate > 0:
            stack.start_child("traffic", _traffic_args(settings))
    except BaseException:
        stack.stop()
        raise
    print_where(settings)
    if args.detach:
        return 0
    stack.watch(ready_url=None if args.no_web else f"{_web_url(settings)}/readyz")
    return 0


def _web_url(settings: Settings) -> str:
    """Where this machine reaches the web UI (a wildcard listen address is reached on loopback)."""
    host = "127.0.0.1" if settings.web_host in ("0.0.0.0", "", "::") else settings.web_host  # nosec B104: compared
    return f"http://{host}:{settings.web_port}"


STACK_INVALID_TRAFFIC = (
    "--crawlers",
    "0.01",
    "--excluded-ips",
    "0.01",
    "--floods",
    "0.01",
    "--double-clicks",
    "0.01",
    "--late-duplicates",
    "0.005",
    "--budget-campaigns",
    "3",
    "--budget-share",
    "0.03",
)
"""The local stack's invalid traffic, a few percent of the clicks (with those that ordinary traffic repeats within
30 s), and its budgets: three campaigns capped after about three quarters of an hour of a day's traffic."""


def _traffic_args(settings: Settings) -> list[str]:
    """The simulator of the local stack: a steady, realistic mix at ADBILL_TRAFFIC_RATE for a day, live, so its
    event time is the wall clock's: the current period is the one on the dashboard, and periods close on time. A
    few percent of its clicks are invalid and some campaigns run out of budget, so the dashboard shows both."""
    run_dir = settings.root / "runs" / f"stack-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    return [
        "produce",
        "--live",
        "--duration",
        "86400",
        "--rate",
        str(settings.traffic_rate),
        "--seed",
        str(settings.traffic_seed),
        "--catalog-every",
        str(settings.traffic_catalog_every_s),
        "--new-ads",
        "5" if settings.traffic_catalog_every_s else "0",
        *STACK_INVALID_TRAFFIC,
        "--follow-catalog",  # the admin's new ads get traffic; what the admin changed is left alone
        "--run-dir",
        str(run_dir),
        "--no-progress",
    ]


def cmd_down(settings: Settings, args: argparse.Namespace) -> int:
    from ops.stack import down

    stopped = down(settings)
    if not settings.cluster:
        # The cluster keeps its own folder: `adbill down` stops whichever of the two runs.
        stopped += down(Settings.from_env(cluster=1))
    print(f"stopped: {', '.join(stopped)}" if stopped else f"nothing was running (run folder {settings.layout.run})")
    return 0


def cmd_deps(settings: Settings, args: argparse.Namespace) -> int:
    from ops.deps import ensure_all

    ensure_all(settings.deps_dir, redis=not args.jars_only, browser=not args.jars_only)
    return 0


def cmd_settings(settings: Settings, args: argparse.Namespace) -> int:
    rows = describe(settings)
    width = max(len(name) for name, _, _ in rows)
    for name, value, doc in rows:
        print(f"{name:<{width}}  {value or '(default)'}\n{'':<{width}}  {doc}")
    return 0


def cmd_topics(settings: Settings, args: argparse.Namespace) -> int:
    from ops.stack import ensure_stack_topics

    names = ensure_stack_topics(settings)
    print(f"topics ready on {settings.kafka_bootstrap}: {', '.join(names)} ({settings.topic_partitions} partitions)")
    return 0


CATALOG_ACTIONS = (
    "generate",
    "show",
    "create-ad",
    "set-price",
    "pause",
    "resume",
    "history",
    "set-budget",
    "budgets",
    "export",
    "import",
)


def cmd_catalog(settings: Settings, args: argparse.Namespace) -> int:
    from billing.catalog import generate_catalog
    from billing.catalog_changes import describe_entry, price_status
    from ops.times import parse_time

    store = settings.catalog_store()
    now_ms = int(time.time() * 1000)
    if args.action == "generate":
        catalog = generate_catalog(args.advertisers, args.campaigns, args.ads, args.seed)
        versions = settings.layout.catalog_versions
        priced = versions.is_dir() and any(versions.iterdir())
        store.start(catalog, replace=args.force, priced=priced, made_by=command_made_by())
        print(f"wrote {len(catalog)} ads of {len(catalog.advertiser_ids)} advertisers to {store.where}")
        return 0
    if args.action in ("export", "import"):
        return _catalog_document(store, args)
    if args.action == "show":
        catalog = store.current()
        for ad in catalog:
            print(f"{ad.ad_id}\t{ad.campaign_id}\t{ad.advertiser_id}\t{price_status(ad, now_ms)}")
        return 0
    if args.action in ("set-budget", "budgets"):
        return _catalog_budgets(settings, args, now_ms)
    if not args.ad_id:
        raise ValueError(f"catalog {args.action} needs the ad's id")
    if args.action == "history":
        found = store.current().get(args.ad_id)
        if found is None:
            raise ValueError(f"unknown ad {args.ad_id}")
        print(f"{found.ad_id}\tcampaign {found.campaign_id}\tadvertiser {found.advertiser_id}\t{found.currency}")
        for entry in found.prices:
            print(describe_entry(entry, found.currency))
        return 0
    from billing.catalog_changes import AdRequest
    from billing.store.catalog_db import Scope

    at_ms = parse_time(args.at, "--at") if args.at else None
    asked = AdRequest(args.action, args.ad_id, args.cpc_micros, args.campaign, args.advertiser, args.currency)

    def request(current: Catalog | None, now: int) -> AdChange:
        # Read against the catalog as the lock holds it, and "now" read under the lock (an absent --at).
        return asked.change(now if at_ms is None else at_ms, current)

    # One change and the process ends: only what it is about is read, not the whole catalog.
    about = Scope(
        ad_ids=(args.ad_id,),
        campaign_ids=(args.campaign,) if args.campaign else (),
        advertiser_ids=(args.advertiser,) if args.advertiser else (),
    )
    catalog = store.change(request, backfill=args.backfill, made_by=command_made_by(), scope=about)
    ad = catalog[args.ad_id]
    entry = next(p for p in ad.prices if p.version == catalog.version)
    print(f"{args.action}: {ad.ad_id} {describe_entry(entry, ad.currency)} (catalog version {catalog.version})")
    return 0


def _catalog_document(store: CatalogDatabase, args: argparse.Namespace) -> int:
    """`adbill catalog export FILE`: the whole catalog with its history and change log, as one JSON document;
    `adbill catalog import FILE`: such a document (or a catalog file) into a database that holds no catalog."""
    from billing.store.catalog_db import catalog_document, read_catalog_document

    if not args.ad_id:
        raise ValueError(f"catalog {args.action} needs the file ({'-' if args.action == 'export' else 'FILE'})")
    if args.action == "export":
        catalog = store.current()
        text = catalog_document(catalog, store.changes())
        if args.ad_id == "-":
            sys.stdout.write(text + "\n")
        else:
            target = Path(args.ad_id)
            write_whole(target, text + "\n")
            print(f"exported catalog version {catalog.version} ({len(catalog)} ads) to {target}")
        return 0
    catalog, changes = read_catalog_document(Path(args.ad_id).read_text(encoding="utf-8"))
    store.load(catalog, changes)
    print(f"imported catalog version {catalog.version} ({len(catalog)} ads) into {store.where}")
    return 0


def _catalog_budgets(settings: Settings, args: argparse.Namespace, now_ms: int) -> int:
    """`adbill catalog set-budget CAMPAIGN --daily-micros N | --unlimited`, `adbill catalog budgets [CAMPAIGN]`."""
    from billing.catalog_changes import budget_change, budget_text, describe_budget
    from billing.store.catalog_db import Scope
    from ops.times import parse_time

    store = settings.catalog_store()
    if args.action == "budgets":
        catalog = store.current()
        if args.ad_id:
            owner = catalog.advertiser_of_campaign(args.ad_id)
            if owner is None:
                raise ValueError(f"unknown campaign {args.ad_id}")
            currency = catalog.currency_of(owner)
            print(f"{args.ad_id}\tadvertiser {owner}\t{currency}")
            entries = catalog.budget_history(args.ad_id)
            for entry in entries:
                print(describe_budget(entry, currency))
            if not entries:
                print("unlimited since the beginning (no budget was ever set)")
            return 0
        for campaign in catalog.campaign_ids:
            owner = catalog.advertiser_of_campaign(campaign) or ""
            now = budget_text(catalog.budget_at(campaign, now_ms), catalog.currency_of(owner))
            print(f"{campaign}\t{owner}\t{now}")
        return 0
    if args.cpc_micros is not None:
        raise ValueError(
            "set-budget takes --daily-micros (the campaign's daily budget) or --unlimited, not --cpc-micros"
        )
    at_ms = parse_time(args.at, "--at") if args.at else None
    maker = command_made_by()

    def request(current: Catalog | None, now: int) -> BudgetSetting:
        return budget_change(
            args.ad_id or "",
            now if at_ms is None else at_ms,
            current,
            daily_micros=args.daily_micros,
            unlimited=args.unlimited,
            made_by=maker,
        )

    catalog = store.change(request, backfill=args.backfill, scope=Scope(campaign_ids=(args.ad_id or "",)))
    entry = next(b for b in catalog.budget_history(args.ad_id) if b.version == catalog.version)
    currency = catalog.currency_of(catalog.advertiser_of_campaign(args.ad_id) or "")
    print(f"set-budget: {args.ad_id} {describe_budget(entry, currency)} (catalog version {catalog.version})")
    return 0


def cmd_ivt(settings: Settings, args: argparse.Namespace) -> int:
    """`adbill ivt exclude|include CIDR [--at TIME] [--backfill]`, `adbill ivt list [--at TIME] [--history]`."""
    from billing.catalog import format_time
    from billing.catalog_changes import describe_exclusion, exclusion_change
    from billing.store.catalog_db import Scope
    from ops.times import parse_time

    store = settings.catalog_store()
    at_ms = parse_time(args.at, "--at") if args.at else None
    if args.action == "list":
        if args.cidr:
            raise ValueError("ivt list takes no range; it lists every range (--history: every entry)")
        exclusions = store.current().exclusions
        when = int(time.time() * 1000) if at_ms is None else at_ms
        in_force = exclusions.ranges_at(when)
        for cidr in in_force:
            entry = [e for e in exclusions.history(cidr) if e.effective_from <= when][-1]
            print(describe_exclusion(entry))
        if not in_force:
            print(f"no IP range is excluded at {format_time(when)}", file=sys.stderr)
        if args.history:
            for entry in sorted(exclusions.changes, key=lambda e: (e.version, e.cidr)):
                print(f"history\t{describe_exclusion(entry)}")
        return 0
    maker = command_made_by()

    def request(current: Catalog | None, now: int) -> ExclusionSetting:
        return exclusion_change(args.action, args.cidr or "", now if at_ms is None else at_ms, maker)

    catalog = store.change(request, backfill=args.backfill, scope=Scope())
    entry = next(e for e in catalog.exclusions.changes if e.version == catalog.version)
    print(f"{args.action}: {describe_exclusion(entry)} (catalog version {catalog.version})")
    return 0


def cmd_produce(settings: Settings, args: argparse.Namespace) -> int:
    from producers.publisher import simulate_to_kafka
    from producers.simulator import SimulationConfig

    if args.live and args.rate and args.impression_rate:
        raise ValueError("--live sends at the simulated rate: give --rate or --impression-rate, not both")
    store = settings.catalog_store()
    shape: dict[str, Any] = _catalog_shape(store.current()) if store.exists() else {}
    config = SimulationConfig(
        **shape,
        users=args.users,
        impression_rate=args.impression_rate or (args.rate / 1.15 if args.rate else 10_000.0),
        click_through_rate=args.ctr,
        beyond_window_fraction=args.beyond_window,
        out_of_order_fraction=args.out_of_order,
        late_fraction=args.late,
        duplicate_fraction=args.duplicates,
        bad_fraction=args.bad,
        seed=args.seed,
        events=args.events,
        duration_s=args.duration,
        catalog_change_every_s=args.catalog_every,
        new_ads=args.new_ads,
        crawler_fraction=args.crawlers,
        excluded_ip_fraction=args.excluded_ips,
        flood_fraction=args.floods,
        double_click_fraction=args.double_clicks,
        late_duplicate_fraction=args.late_duplicates,
        budget_campaigns=args.budget_campaigns,
        budget_share=args.budget_share,
        changes_at_s=args.changes_at,
    )
    if args.live and args.rate:
        config = config.at_arrival_rate(args.rate)  # live, the offered rate is the simulated one, exactly
    _check_catalog(settings, config.catalog(), args.seed)
    run_dir = (
        args.run_dir or settings.root / "runs" / f"seed{args.seed}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    )
    summary = simulate_to_kafka(
        config,
        bootstrap_servers=settings.kafka_bootstrap,
        registry=settings.schema_registry_store(),
        run_dir=run_dir,
        topics=settings.topics,
        rate=None if args.live else args.rate,
        progress=_progress(args),
        live=args.live,
        catalog_store=store,
        deploy_schema_at_s=args.deploy_schema_at,
        follow_catalog=args.follow_catalog,
    )
    print(f"ground truth in {run_dir}")
    return _delivery_outcome("produce", summary.not_delivered, 0)


def cmd_stream(settings: Settings, args: argparse.Namespace) -> int:
    from ops.streaming import run_stream

    return run_stream(settings, new_checkpoint=args.new_checkpoint)


def cmd_web(settings: Settings, args: argparse.Namespace) -> int:
    # gunicorn's workers are processes: their metrics meet in one folder, named before prometheus_client loads.
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        import shutil

        folder = settings.layout.run / "web-metrics"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    from web.server import serve

    return serve(settings)


def cmd_users(settings: Settings, args: argparse.Namespace) -> int:
    from web.access import Role

    accounts = settings.accounts_store()
    if args.action == "list":
        rows = sorted(accounts.all().values(), key=lambda a: a.username)
        for a in rows:
            state = "disabled" if a.disabled else "enabled"
            print(f"{a.username}\t{a.role.value}\t{a.advertiser_id or '-'}\t{state}")
        if not rows:
            print(f"no accounts yet in {accounts.where}; add one with `adbill users add`", file=sys.stderr)
        return 0
    if args.action == "add":
        role = Role(args.role)
        if (role is Role.ADVERTISER) != bool(args.advertiser):
            raise ValueError("--advertiser is required for an advertiser account, and only for one")
        account = accounts.add(args.username, role, _new_password(args.password_stdin), args.advertiser)
        print(f"added {account.username} ({account.role.value}) to {accounts.where}")
    elif args.action == "reset-password":
        account = accounts.reset_password(args.username, _new_password(args.password_stdin))
        print(f"new password for {account.username}; its sessions have ended")
    else:
        account = accounts.set_disabled(args.username, args.action == "disable")
        print(f"{account.username} {args.action}d")
    return 0


def cmd_tokens(settings: Settings, args: argparse.Namespace) -> int:
    tokens = settings.tokens_store()
    if args.action == "create":
        token, record = tokens.create(args.username)
        print(token)
        print(
            f"API token {record.token_id} for {record.username}: shown this once, only its hash is kept "
            f"({tokens.accounts.where}); send it as `Authorization: Bearer TOKEN`",
            file=sys.stderr,
        )
    elif args.action == "list":
        rows = tokens.of(args.username)
        for t in rows:
            made = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(t.created_at_ms / 1000))
            print(f"{t.token_id}\t{t.username}\t{made}")
        if not rows:
            print("no API tokens", file=sys.stderr)
    else:
        gone = tokens.revoke(args.username, args.token_id)
        print(f"revoked {len(gone)} token(s) of {args.username}: {', '.join(gone)}")
    return 0


def _new_password(from_stdin: bool) -> str:
    """A password from stdin's first line, or prompted for twice; never from the command line."""
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    import getpass

    first = getpass.getpass("password: ")
    if getpass.getpass("again: ") != first:
        raise ValueError("the two passwords differ")
    return first


def cmd_reconcile(settings: Settings, args: argparse.Namespace) -> int:
    from ops.reconcile import run_reconcile
    from ops.times import parse_time

    if not args.force:  # Kafka's end offsets decide what may close; --force closes without them
        _require(settings, ("kafka",))
    return run_reconcile(
        settings,
        until_ms=parse_time(args.until) if args.until else None,
        every_s=settings.reconcile_interval_s if args.every == 0 else args.every,
        force=args.force,
    )


def cmd_audit(settings: Settings, args: argparse.Namespace) -> int:
    from ops.reconcile import run_audit

    return run_audit(settings)


def _click_day(text: str) -> dt.date:
    from billing.store.click_files import parse_day

    try:
        return parse_day(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_explain(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0 with the story of a click received, 1 for a click id never received or not found where the story
    searched (the last ADBILL_STORY_DAYS days, or an older day's exports)."""
    import json

    from billing.periods import Periods
    from billing.store.click_story import ClickStories
    from billing.story import NOT_RECEIVED, PAST_HORIZON, story_text

    stories = ClickStories(
        settings.layout,
        settings.catalog_store(),
        Periods(settings.period_ms),
        settings.ivt_rules,
        settings.topic_clicks,
        story_days=settings.story_days,
    )
    story = stories.tell(args.click_id, args.day)
    print(json.dumps(story.to_dict(), indent=1) if args.json else story_text(story))
    return 1 if story.outcome.status in (NOT_RECEIVED, PAST_HORIZON) else 0


def cmd_invoices(settings: Settings, args: argparse.Namespace) -> int:
    from ops import invoicing

    if args.action == "issue":
        return invoicing.issue_invoices(settings, args.month)
    if args.action == "list":
        return invoicing.list_invoices(settings, args.month, args.advertiser)
    if not (args.advertiser and args.month):
        raise ValueError("invoices show needs the advertiser and --month")
    return invoicing.show_invoice(settings, args.advertiser, args.month)


def cmd_profiles(settings: Settings, args: argparse.Namespace) -> int:
    from ops import invoicing

    if args.action == "set":
        if not args.advertiser:
            raise ValueError("profiles set needs the advertiser")
        return invoicing.set_profile(
            settings, args.advertiser, args.name, args.address, args.tax_id, args.tax_rate, args.at
        )
    return invoicing.show_profiles(settings, args.advertiser if args.action == "show" else None)


def cmd_names(settings: Settings, args: argparse.Namespace) -> int:
    store = settings.names_store()
    if args.action == "list":
        if args.item_id:
            listed = [(args.kind, store.names_of(args.kind, [args.item_id]))]
        elif args.kind:
            listed = [(args.kind, store.named(args.kind))]
        else:
            names = store.current()
            listed = [("campaign", names.campaigns), ("ad", names.ads)]
        for kind, named in listed:
            for item_id, name in sorted(named.items()):
                print(f"{kind}\t{item_id}\t{name}")
        return 0
    if not (args.kind and args.item_id and args.name is not None):
        raise ValueError("names set needs campaign or ad, its id and the name")
    catalog = settings.catalog_store().current()
    known = catalog.get(args.item_id) if args.kind == "ad" else catalog.advertiser_of_campaign(args.item_id)
    if known is None:
        raise ValueError(f"unknown {args.kind} {args.item_id}")
    store.set(args.kind, args.item_id, args.name)
    print(
        f"names: {args.kind} {args.item_id} is named {args.name!r}" if args.name else f"names: {args.item_id} unnamed"
    )
    return 0


def cmd_health(settings: Settings, args: argparse.Namespace) -> int:
    from ops.health import check

    healthy, why = check(settings, args.part)
    print(f"{args.part}: {'healthy' if healthy else 'unhealthy'}: {why}")
    return 0 if healthy else 1


def cmd_click_filters(settings: Settings, args: argparse.Namespace) -> int:
    from ops.reconcile import rebuild_click_filters

    return rebuild_click_filters(settings, args.day)


def cmd_export(settings: Settings, args: argparse.Namespace) -> int:
    from ops.reconcile import export_periods

    return export_periods(settings, args.period, args.to, args.out)


def cmd_restore_redis(settings: Settings, args: argparse.Namespace) -> int:
    from ops.streaming import restore_redis

    return restore_redis(settings)


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from producers.capture import CatalogEdit
    from producers.publisher import apply_to_store, replay_to_kafka

    catalog = settings.catalog_store()

    def apply_catalog(line: CatalogEdit) -> None:
        # A capture's `ad`, `budget` and `ip_exclusion` lines are recorded history: they take effect at their own
        # time, even in the past (docs/billing-rules.md).
        apply_to_store(catalog, line, int(time.time() * 1000), command_made_by("replay"))

    summary = replay_to_kafka(
        args.file,
        bootstrap_servers=settings.kafka_bootstrap,
        registry=settings.schema_registry_store(),
        topics=settings.topics,
        rate=args.rate,
        progress=_progress(args),
        apply_catalog=apply_catalog,
    )
    return _delivery_outcome("replay", summary.publish.not_delivered, summary.bad_lines)


def _delivery_outcome(command: str, not_delivered: int, bad_lines: int) -> int:
    """1, with one line saying how many, when any record was not delivered or any input line was bad."""
    problems = []
    if not_delivered:
        problems.append(f"{not_delivered:,} record(s) not delivered to Kafka")
    if bad_lines:
        problems.append(f"{bad_lines:,} bad line(s) not sent")
    if not problems:
        return 0
    print(f"adbill {command}: {'; '.join(problems)}", file=sys.stderr)
    return 1


def cmd_kafka(settings: Settings, args: argparse.Namespace) -> int:
    from ops.kafka_service import TOOLS

    if args.tool not in TOOLS:
        raise ValueError(f"unknown Kafka tool {args.tool!r}; one of {', '.join(TOOLS)}")
    from ops.stack import local_kafka

    command = local_kafka(settings).tool_command(args.tool, *args.tool_args)
    os.execv(command[0], command)
    return 0  # not reached


def _catalog_shape(catalog: Catalog) -> dict[str, int]:
    """The simulator draws ads from the catalog the stack uses, so every simulated ad is known."""
    advertisers = catalog.advertiser_ids
    campaigns = {ad.campaign_id for ad in catalog}
    return {
        "advertisers": len(advertisers),
        "campaigns_per_advertiser": max(1, len(campaigns) // max(1, len(advertisers))),
        "ads_per_campaign": max(1, len(catalog) // max(1, len(campaigns))),
    }


def _check_catalog(settings: Settings, simulated: Catalog, seed: int) -> None:
    """The simulator draws its traffic from the ads of its seed: the pipeline's catalog must hold those ads, with
    the same owners and currency (their prices are the catalog's history, whoever changed them)."""
    from billing.catalog import CatalogError

    store = settings.catalog_store()
    if not store.exists():
        try:
            store.start(simulated, made_by=command_made_by("simulator"))
        except CatalogError:
            pass  # another writer made one meanwhile: it is checked below like any other
        else:
            print(f"wrote the simulator's catalog to {store.where}", file=sys.stderr)
            return
    held = store.current()
    for ad in simulated:
        other = held.get(ad.ad_id)
        if other is None or (other.campaign_id, other.advertiser_id, other.currency) != (
            ad.campaign_id,
            ad.advertiser_id,
            ad.currency,
        ):
            raise ValueError(
                f"the catalog in {store.where} does not hold the ads the simulator derives from --seed {seed} and "
                f"its shape (ad {ad.ad_id}); use the seed it was generated with, or start afresh with a new database"
            )


def _progress(args: argparse.Namespace) -> bool:
    return not (args.no_progress or os.environ.get("ADBILL_NO_PROGRESS"))


if __name__ == "__main__":
    sys.exit(main())
