"""One typed settings object per process, read from `ADBILL_*` environment variables.

Every default works on a fresh machine: the local stack on loopback, data under `./var`. `adbill settings` prints
the table below with the values in force; `docs/settings.md` is generated from it (`python -m ops.docs`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from billing.invalid import IvtRules
from billing.layout import DataLayout

if TYPE_CHECKING:
    from billing.store.catalog_db import CatalogDatabase
    from billing.store.invoice_db import InvoiceDatabase
    from billing.store.names_db import NamesDatabase
    from billing.store.profiles_db import ProfileDatabase
    from billing.store.schema_registry import SchemaRegistry
    from web.accounts import AccountsDatabase
    from web.tokens import TokensDatabase

PREFIX = "ADBILL_"
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _setting(default: Any, doc: str, env: str | None = None) -> Any:
    return field(default=default, metadata={"doc": doc, "env": env})


@dataclass(frozen=True)
class Settings:
    """Where everything is and how the pipeline behaves. Build it with `Settings.from_env()`."""

    home: Path = _setting(Path("var"), "Folder for local data: Kafka and Redis data, ledger, archive, exports, logs.")
    deps_dir: Path = _setting(PROJECT_ROOT / ".deps", "Folder the Kafka and Spark jars are fetched into.")

    kafka_bootstrap: str = _setting(
        "127.0.0.1:9092",
        "Kafka bootstrap servers. The local stack starts a broker here when it is on loopback.",
    )
    kafka_controller_port: int = _setting(
        9093, "Port of the local broker's KRaft controller listener (a local cluster's node N: this plus N - 1)."
    )
    topic_impressions: str = _setting("impressions", "Topic of impression events.")
    topic_clicks: str = _setting("clicks", "Topic of click events.")
    topic_quarantine: str = _setting("quarantine", "Dead-letter topic of bad input.")
    topic_partitions: int = _setting(4, "Partitions of the impressions and clicks topics (the same for both).")
    topic_replication: int = _setting(
        1,
        "Replication factor of the topics (3 on a multi-broker cluster); at 3 or more the topics get "
        "min.insync.replicas one less.",
    )
    schema_registry: str = _setting(
        "",
        "Schema registry: a postgresql:// URL, an http(s) URL of a Confluent-compatible registry, or a JSON file "
        "(a path or file://; one machine without a database). Default: the database (ADBILL_DATABASE_URL), which "
        "takes in HOME/schemas.json of an earlier release once, its ids kept, and sets it aside as "
        "schemas.json.imported.",
    )

    redis_url: str = _setting(
        "redis://127.0.0.1:6379/0",
        "Redis for live totals and health records. The local stack starts one here when it is on loopback.",
    )
    redis_prefix: str = _setting("adbill", "Prefix of every Redis key the product writes.")
    redis_timeout_ms: int = _setting(
        5_000,
        "Deadline of one Redis call of the job and reconciliation, in ms; tried 5 more times (about 40 s in all), "
        "then the batch or run fails.",
    )

    spark_master: str = _setting(
        "local[2]",
        "Spark master URL: local[N] or spark://host:7077. A loopback spark:// makes the local stack start a master "
        "and workers there.",
    )
    shuffle_partitions: int = _setting(4, "spark.sql.shuffle.partitions; fixed by the first checkpoint.")
    impression_watermark_ms: int = _setting(
        10_000,
        "Watermark delay of the impressions stream, in ms: an impression whose time is further behind the newest "
        "receipt time the stream has read is late (kept out of the streaming join, counted, its click billed by "
        "reconciliation). The join keeps about this plus the 10 s window of traffic and reads all of it every "
        "batch: a longer delay costs latency and throughput (docs/benchmarks.md).",
    )
    click_watermark_ms: int = _setting(
        10_000,
        "Watermark delay of the clicks stream, in ms: a click whose time is further behind the newest receipt time "
        "the stream has read is late (billed by reconciliation, counted meanwhile).",
    )
    clock_tolerance_ms: int = _setting(
        60_000,
        "How far an event's time may be ahead of the time Kafka received it before it is counted as clock ahead, "
        "in ms (counted per ad and period: dashboard, health page, /metrics). Such an event is valid (up to an hour "
        "ahead) and billed on its own time; a click ahead by more than the clicks' watermark delay is billed by "
        "reconciliation, not the stream, so that a copy re-sent later cannot be billed twice. Whatever its time, an "
        "event counts for its stream's watermark at most at its receipt time, so a wrong clock cannot make the "
        "traffic after it late.",
    )
    trigger_ms: int = _setting(1_000, "Micro-batch trigger interval of the streaming job, in ms.")
    period_ms: int = _setting(3_600_000, "Length of a billing period, in ms (UTC hours by default).")
    max_offsets_per_trigger: int = _setting(
        200_000,
        "Most Kafka records one micro-batch reads from each topic: a backlog (a burst, the job back after an outage) "
        "is read in batches of at most this many.",
    )
    state_store: str = _setting(
        "auto",
        "State store of a new checkpoint of the streaming job: hdfs (Spark's, in the JVM's memory, checkpointed to "
        "files each batch: the faster on one machine, docs/benchmarks.md), rocksdb (off-heap, changelog "
        "checkpointing: for a Spark cluster, where the state lives in executors of ADBILL_EXECUTOR_MEMORY), or auto "
        "(hdfs in local mode, rocksdb on a Spark master). A checkpoint keeps the store it started with.",
    )
    join_state_format: str = _setting(
        "default",
        "State format of the stream-stream join of a new checkpoint of the streaming job: default (Spark's, 2) or 4 "
        "(Spark 4.2's format 4, SPARK-55144, still marked under development: evicts by time instead of scanning the "
        "whole state every batch; RocksDB only, refused with ADBILL_STATE_STORE=hdfs). A checkpoint keeps the format "
        "it started with; moving to format 4: docs/operations.md.",
    )
    sink_writers: str = _setting(
        "auto",
        "Where the job writes each batch's files: executors (each task its share; the driver gets figures only), "
        "driver (the batch collected to it), or auto (driver in local mode, executors on a cluster).",
    )
    spark_conf: str = _setting(
        "",
        "Further Spark settings for the job's and reconciliation's sessions, as key=value pairs separated by "
        "spaces (they win over the product's own).",
    )
    driver_memory: str = _setting(
        "4g",
        "Memory of the Spark driver (in local mode, of the whole job, the join's state in memory included: at 2g its "
        "garbage collection took 0.6 cores at 20,000 events/s).",
    )
    executor_memory: str = _setting("1g", "Memory of each executor of an application on a Spark cluster.")
    stream_cores: int = _setting(
        2, "Cores the streaming job takes on a Spark cluster (spark.cores.max; one core per executor)."
    )
    batch_cores: int = _setting(
        1, "Cores reconciliation and the audit each take on a Spark cluster (spark.cores.max), beside the job."
    )
    spark_workers: int = _setting(2, "Spark workers the local cluster starts (`adbill up --cluster`).")
    spark_worker_cores: int = _setting(2, "Cores each local Spark worker offers.")
    spark_worker_memory: str = _setting("2g", "Memory each local Spark worker offers to executors.")
    spark_master_ui_port: int = _setting(8080, "Port of the local Spark master's web UI.")
    metrics_port: int = _setting(9464, "Port of the job's Prometheus /metrics (0: off).")
    reconcile_metrics_port: int = _setting(
        9465, "Port of the Prometheus /metrics of `adbill reconcile --every` (0: off; a single run serves none)."
    )
    spark_ui_port: int = _setting(
        4040, "Port of Spark's web UI of the job (the next free one when taken; loopback in local mode; 0: off)."
    )
    spark_event_log_path: Path | None = _setting(
        None,
        "Folder of Spark's event logs, for Spark's history server (default HOME/spark-events; rolled at 64 MB).",
        "SPARK_EVENT_LOG_DIR",
    )
    spark_event_log_max_mb: int = _setting(
        1024, "Size the event log folder is trimmed to, oldest applications first, when a Spark session starts."
    )
    lateness_horizon_ms: int = _setting(
        900_000,
        "How long after a period ends reconciliation waits for late data before closing it, in ms (and it closes it "
        "only once the streaming job has read what Kafka then held).",
    )
    reconcile_interval_s: int = _setting(300, "Seconds between reconciliation runs inside `adbill up` (0: off).")
    close_wait_s: int = _setting(
        60,
        "How long a reconciliation run waits for a live streaming job a few seconds behind the records a period past "
        "its horizon waits for, so that the period closes in this run (0: not at all).",
    )
    audit_after_close: int = _setting(
        1,
        "1: `adbill reconcile --every` (in `adbill up`) runs the audit after each run that closed a period, so finance "
        "sees the books proven; 0: only `adbill audit` does.",
    )
    compact_after_close: int = _setting(
        1,
        "1: each reconciliation run ends by compacting the batch files of the closed periods that the stream will "
        "not write again into one file per period and kind, and the quarantine's and `released/`'s by chunks of "
        "batch ids (`billing.store.compaction`); 0: they stay as written.",
    )
    compact_interval_s: int = _setting(
        120,
        "Seconds between the passes of `adbill reconcile --every` (in `adbill up`) that compact the open periods' "
        "batch files the stream will not write again (every kind: the ledger, the archive, `unbilled/`, "
        "`not_charged/`; `billing.store.compaction.compact_open`), between its runs and under their lock; 0: off.",
    )
    story_days: int = _setting(
        90,
        "Days back from the newest day the data folder holds (today, UTC, while the stream runs) that a click's "
        "story searches click-level detail (the archive, the ledger, "
        "corrections, the quarantine) when the click's day is not given; a click's day older than this "
        "(`adbill explain --day`, `?day=`) is told from that day's exports, as finance was given it.",
    )
    invoice_issuer: str = _setting("adbill", "Who issues the monthly invoices: the name printed at their top.")
    invoice_terms_days: int = _setting(30, "Days after the invoice date that a monthly invoice is due.")
    stream_invalid_traffic: int = _setting(
        1,
        "1: the stream filters invalid traffic live; 0: it does not (to measure the rules' cost with a benchmark's "
        "--variant; reconciliation applies them all the same).",
    )
    stream_budgets: int = _setting(
        1,
        "1: the stream holds each campaign to its daily budget live; 0: it does not (to measure the check's cost; "
        "reconciliation applies budgets all the same).",
    )
    ivt_flood_clicks: int = _setting(
        20,
        "Invalid traffic: a user's clicks within the flood window beyond this many are all a click flood. A change "
        "of this or the other ADBILL_IVT_* settings applies to periods not yet closed.",
    )
    ivt_flood_window_ms: int = _setting(60_000, "Invalid traffic: the click flood window, in ms.")
    ivt_duplicate_window_ms: int = _setting(
        30_000,
        "Invalid traffic: a click this many ms or less after the user's previous click on the ad is a duplicate.",
    )

    database_url: str = _setting(
        "postgresql://adbill@127.0.0.1:5433/adbill",
        "PostgreSQL for the records that several processes and hosts share: the ad catalog with its history and "
        "change log, names, billing profiles, invoice numbers, web accounts and API tokens, schema versions, and the "
        "job's and reconciliation's locks. The local stack starts one here when it is on loopback.",
    )
    catalog_path: Path | None = _setting(
        None,
        "A catalog JSON file written before the database (default HOME/catalog.json): taken into the database the "
        "first time it holds no catalog, then set aside as FILE.imported.",
        "CATALOG",
    )

    web_host: str = _setting("127.0.0.1", "Address the web UI listens on.")
    web_port: int = _setting(8000, "Port of the web UI.")
    web_workers: int = _setting(2, "Worker processes of the web UI's WSGI server (gunicorn).")
    web_threads: int = _setting(4, "Threads per web worker process.")
    password_scrypt_n: int = _setting(
        32_768,
        "scrypt's work factor (N) for a web password set from now on: a power of two of at least 1,024. Each "
        "halving halves the work of the server at a login and of whoever guesses at a stolen hash; the tests run "
        "with 1,024. A hash keeps the factor it was made with, so accounts log in whatever this says.",
    )
    users_path: Path | None = _setting(
        None,
        "An accounts file of the web UI written before the database (default HOME/users.json): taken into the "
        "database once (the accounts it lacks), then set aside as FILE.imported. `adbill users` manages the accounts.",
        "USERS_FILE",
    )
    api_tokens_path: Path | None = _setting(
        None,
        "An API tokens file written before the database (default HOME/api-tokens.json): taken into the database "
        "once, then set aside as FILE.imported. `adbill tokens` manages the tokens.",
        "API_TOKENS_FILE",
    )
    web_secret_path: Path | None = _setting(
        None, "The web UI's secret key, generated once with mode 0600 (default HOME/web-secret.key).", "WEB_SECRET_FILE"
    )
    web_secure_cookies: int = _setting(0, "1: session cookies always Secure (behind HTTPS); 0: only on HTTPS requests.")
    web_trusted_proxies: int = _setting(
        0,
        "Reverse proxies in front of the web UI whose X-Forwarded-For and X-Forwarded-Proto are believed (Werkzeug's "
        "ProxyFix; 0: none). "
        "Behind a TLS proxy, 1: cookies are then Secure and HSTS is sent.",
    )
    web_session_hours: int = _setting(12, "Hours a web session lasts after login, however active.")
    web_idle_minutes: int = _setting(
        30, "Minutes without a request after which a web session ends (the dashboard's own refresh does not count)."
    )
    web_login_limit: int = _setting(100, "Failed logins an account may have in an hour; further logins are refused.")
    web_address_login_limit: int = _setting(
        300, "Failed logins one client address (an IPv6 /64) may have in an hour; further logins are refused."
    )
    web_ready_batch_age_s: int = _setting(
        60,
        "`/readyz` answers 503 when the streaming job's last batch or idle trigger (every 10 s when idle) is older "
        "than this, in s.",
    )

    log_max_bytes: int = _setting(
        20_000_000, "Size at which each log of the local stack (HOME/logs/NAME.log) rolls over to NAME.log.1."
    )
    log_backups: int = _setting(3, "Rolled-over files kept of each log of the local stack (NAME.log.1 ...).")

    cluster: int = _setting(
        0,
        "1: the local cluster topology of `adbill up --cluster` (three Kafka brokers, a Spark master and two "
        "workers); it changes the defaults of the settings in CLUSTER_DEFAULTS.",
    )

    traffic_rate: int = _setting(200, "Events per second the local stack's traffic simulator offers (0: none).")
    traffic_seed: int = _setting(1, "Seed of the local stack's traffic simulator.")
    traffic_catalog_every_s: int = _setting(
        60,
        "Seconds between the catalog changes the local stack's traffic makes: a new price, a pause and its resume, "
        "and five new ads at the start (0: none).",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every `ADBILL_*` variable; unknown `ADBILL_*` names are refused, so a typo is not ignored."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        known = {}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        cluster = overrides.get("cluster") or environ.get(PREFIX + "CLUSTER", "0") not in ("", "0")
        if cluster:
            values.update({name: _parse(fields[name], raw) for name, raw in CLUSTER_DEFAULTS.items()})
        for f in fields.values():
            name = env_name(f)
            known[name] = f
            if name in environ:
                values[f.name] = _parse(f, environ[name])
        unknown = sorted(k for k in environ if k.startswith(PREFIX) and k not in known and k not in _NOT_SETTINGS)
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(unknown)}; `adbill settings` lists the known ones")
        values.update(overrides)
        return cls(**values)

    def __post_init__(self) -> None:
        if self.topic_partitions < 1:
            raise ValueError("ADBILL_TOPIC_PARTITIONS must be at least 1")
        if self.redis_timeout_ms < 1:
            raise ValueError("ADBILL_REDIS_TIMEOUT_MS must be at least 1: a Redis call without a deadline can hang")
        if self.period_ms < 60_000 or 86_400_000 % self.period_ms:
            raise ValueError("ADBILL_PERIOD_MS must be a whole number of minutes that divides a day")
        if self.cluster and not self.spark_master.startswith("spark://"):
            raise ValueError(
                "ADBILL_CLUSTER=1 runs the jobs on a Spark master: ADBILL_SPARK_MASTER must be spark://..."
            )
        for name, least in _LEAST.items():
            if getattr(self, name) < least:
                bound = f"be at least {least}" if least else "not be negative"
                raise ValueError(f"ADBILL_{name.upper()} must {bound}")
        if self.state_store not in STATE_STORES:
            raise ValueError(f"ADBILL_STATE_STORE must be {', '.join(STATE_STORES[:-1])} or {STATE_STORES[-1]}")
        if self.join_state_format not in JOIN_STATE_FORMATS:
            raise ValueError(f"ADBILL_JOIN_STATE_FORMAT must be {' or '.join(JOIN_STATE_FORMATS)}")
        if self.join_state_format == "4" and self.new_state_store != "rocksdb":
            now = "auto: in memory in local mode" if self.state_store == "auto" else self.state_store
            raise ValueError(
                "ADBILL_JOIN_STATE_FORMAT=4 keeps the join's state in RocksDB column families, which Spark's "
                f"in-memory store does not have: set ADBILL_STATE_STORE=rocksdb (now {now}) or leave "
                "ADBILL_JOIN_STATE_FORMAT at default"
            )
        spark_conf_pairs(self.spark_conf)
        if self.sink_writers not in ("auto", "executors", "driver"):
            raise ValueError("ADBILL_SINK_WRITERS must be auto, executors or driver")

    @property
    def ivt_rules(self) -> IvtRules:
        """The invalid traffic rules' thresholds (`billing.invalid.IvtRules`)."""
        return IvtRules(self.ivt_flood_clicks, self.ivt_flood_window_ms, self.ivt_duplicate_window_ms)

    # Derived locations: the layout of HOME is `billing.layout`'s.
    @property
    def root(self) -> Path:
        return self.home.resolve()

    @property
    def layout(self) -> DataLayout:
        return DataLayout(self.root)

    @property
    def postgres_dir(self) -> Path:
        """The local PostgreSQL's cluster (`initdb`), under the data folder."""
        return self.root / "postgres" / "cluster"

    @property
    def spark_event_log_dir(self) -> Path:
        return self.spark_event_log_path or self.layout.spark_events

    @property
    def catalog_file(self) -> Path:
        return self.catalog_path or self.layout.catalog_file

    def catalog_store(self) -> CatalogDatabase:
        """The ad catalog's store: the database (`database_url`), taking in `catalog_file` when it holds none."""
        from billing.store.catalog_db import CatalogDatabase

        return CatalogDatabase(self.database_url, imports=self.catalog_file)

    def invoice_store(self) -> InvoiceDatabase:
        """The monthly invoices and their numbers: the database (`database_url`), each invoice's file written into
        HOME/invoices from it, and an earlier release's invoice files there taken in when it holds none."""
        from billing.store.invoice_db import InvoiceDatabase

        return InvoiceDatabase(self.database_url, self.layout)

    def profile_store(self) -> ProfileDatabase:
        """The billing profiles' store: the database (`database_url`), taking in HOME/billing-profiles.json when it
        holds none."""
        from billing.store.profiles_db import ProfileDatabase

        return ProfileDatabase(self.database_url, imports=self.layout.billing_profiles_file)

    def names_store(self) -> NamesDatabase:
        """The names of campaigns and ads: the database (`database_url`), taking in HOME/names.json when it holds
        none."""
        from billing.store.names_db import NamesDatabase

        return NamesDatabase(self.database_url, imports=self.layout.names_file)

    def accounts_store(self) -> AccountsDatabase:
        """The web UI's accounts: the database (`database_url`), taking in `users_path` (default HOME/users.json)
        once."""
        from web.accounts import AccountsDatabase

        return AccountsDatabase(
            self.database_url, imports=self.users_path or self.layout.users_file, scrypt_n=self.password_scrypt_n
        )

    def tokens_store(self, accounts: AccountsDatabase | None = None) -> TokensDatabase:
        """The API tokens, beside `accounts` (default: `accounts_store()`), taking in `api_tokens_path`
        (default HOME/api-tokens.json) once."""
        from web.tokens import TokensDatabase

        return TokensDatabase(
            accounts or self.accounts_store(), imports=self.api_tokens_path or self.layout.api_tokens_file
        )

    @property
    def postgres_port(self) -> int:
        return _url_port(self.database_url, 5432)

    @property
    def database_is_local(self) -> bool:
        return _url_is_local(self.database_url)

    @property
    def web_secret_file(self) -> Path:
        return self.web_secret_path or self.layout.web_secret_file

    @property
    def registry_location(self) -> str:
        """The schema registry: `schema_registry`, or the database."""
        return self.schema_registry or self.database_url

    def schema_registry_store(self) -> SchemaRegistry:
        """The schema registry at `registry_location`; in a database, HOME/schemas.json of an earlier release taken
        in first (once)."""
        from billing.store.schema_registry import open_registry

        return open_registry(self.registry_location, imports=self.layout.schemas_file)

    @property
    def topics(self) -> dict[str, str]:
        """Event type to topic."""
        return {"impression": self.topic_impressions, "click": self.topic_clicks}

    @property
    def kafka_port(self) -> int:
        return self.kafka_ports[0]

    @property
    def kafka_ports(self) -> list[int]:
        """The port of each broker of the bootstrap list, in order."""
        return [int(server.rsplit(":", 1)[1]) for server in self.kafka_bootstrap.split(",")]

    @property
    def kafka_is_local(self) -> bool:
        """True when the brokers are this machine's own, for the local stack to start: one per listed port, their
        controllers on ADBILL_KAFKA_CONTROLLER_PORT and the ports after it."""
        hosts = [server.rsplit(":", 1)[0] for server in self.kafka_bootstrap.split(",")]
        return all(host in LOOPBACK for host in hosts)

    @property
    def writes_on_executors(self) -> bool:
        """Whether the streaming job's tasks write their batch's files (`ADBILL_SINK_WRITERS`)."""
        if self.sink_writers == "auto":
            return not self.spark_in_process
        return self.sink_writers == "executors"

    @property
    def spark_in_process(self) -> bool:
        """Spark runs inside the driver's process (`local[N]`: its executors are the driver's threads), not on a
        cluster."""
        return self.spark_master.startswith("local")

    @property
    def new_state_store(self) -> str:
        """The store a new checkpoint of the streaming job gets (`ADBILL_STATE_STORE`, `auto` resolved): in memory
        where the state lives in the driver (local mode), RocksDB where it lives in executors (a Spark master)."""
        if self.state_store != "auto":
            return self.state_store
        return "hdfs" if self.spark_in_process else "rocksdb"

    @property
    def spark_is_local_cluster(self) -> bool:
        """True when the Spark master is a standalone master on this machine's loopback, for the stack to start."""
        return self.spark_master.startswith("spark://") and self.spark_master_host in LOOPBACK

    @property
    def spark_master_host(self) -> str:
        return self.spark_master.removeprefix("spark://").rsplit(":", 1)[0]

    @property
    def spark_master_port(self) -> int:
        tail = self.spark_master.removeprefix("spark://").rsplit(":", 1)
        return int(tail[1]) if len(tail) == 2 else 7077

    @property
    def redis_port(self) -> int:
        return _url_port(self.redis_url, 6379)

    @property
    def redis_is_local(self) -> bool:
        return _url_is_local(self.redis_url)

    def to_env(self) -> dict[str, str]:
        """These settings as the `ADBILL_*` variables that would give them, for a child process."""
        return {
            env_name(f): str(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }


_LEAST: dict[str, int] = dict.fromkeys(
    (
        "stream_cores",
        "batch_cores",
        "spark_workers",
        "spark_worker_cores",
        "web_session_hours",
        "web_idle_minutes",
        "web_login_limit",
        "web_address_login_limit",
        "web_ready_batch_age_s",
        "log_max_bytes",
        "invoice_terms_days",
        "story_days",
    ),
    1,
) | dict.fromkeys(
    (
        "impression_watermark_ms",
        "click_watermark_ms",
        "clock_tolerance_ms",
        "trigger_ms",
        "web_trusted_proxies",
        "log_backups",
        "compact_interval_s",
    ),
    0,
)
"""The least value of each whole-number setting that has no check of its own (`Settings.__post_init__`)."""

LOOPBACK = ("127.0.0.1", "localhost")


def _url_port(url: str, default: int) -> int:
    """The port a service's URL names, or the service's default."""
    from urllib.parse import urlparse

    return urlparse(url).port or default


def _url_is_local(url: str) -> bool:
    """Whether a service's URL names this machine (`LOOPBACK`)."""
    from urllib.parse import urlparse

    return urlparse(url).hostname in LOOPBACK


CLUSTER_DEFAULTS: dict[str, str] = {
    "home": "var/cluster",
    "kafka_bootstrap": "127.0.0.1:9092,127.0.0.1:9192,127.0.0.1:9292",
    "topic_replication": "3",
    "spark_master": "spark://127.0.0.1:7077",
    "driver_memory": "1g",
}
"""The settings `ADBILL_CLUSTER=1` (`adbill up --cluster`) changes, by field name; an ADBILL_* variable still wins.
Its own folder, so that a checkpoint of the one-node stack never meets the cluster's offsets."""

STATE_STORES = ("auto", "hdfs", "rocksdb")
"""The values of ADBILL_STATE_STORE (`Settings.new_state_store`)."""

JOIN_STATE_FORMATS = ("default", "4")
"""The values of ADBILL_JOIN_STATE_FORMAT: Spark's default format of the join's state, or format 4."""

TOOL_VARIABLES: dict[str, str] = {
    "ADBILL_NO_PROGRESS": "Any value turns progress bars off (the local stack sets it for its children).",
    "ADBILL_DEBUG": "Any value: a failing command shows its traceback instead of one line.",
}
"""Variables with the prefix that are not settings of the pipeline but of the tools around it, and what they do."""
_NOT_SETTINGS = frozenset(TOOL_VARIABLES)


def env_name(f: dataclasses.Field[Any]) -> str:
    return PREFIX + (f.metadata.get("env") or f.name.upper())


def setting_names() -> set[str]:
    """Every environment variable the project reads as a setting."""
    return {env_name(f) for f in dataclasses.fields(Settings)} | _NOT_SETTINGS


def describe(settings: Settings) -> list[tuple[str, str, str]]:
    """(variable, value in force, what it is) for every setting."""
    return [
        (
            env_name(f),
            "" if getattr(settings, f.name) is None else str(getattr(settings, f.name)),
            f.metadata["doc"],
        )
        for f in dataclasses.fields(settings)
    ]


def _parse(f: dataclasses.Field[Any], raw: str) -> Any:
    parsers: dict[str, Callable[[str], Any]] = {
        "int": int,
        "str": str,
        "Path": Path,
        "Path | None": lambda s: Path(s) if s else None,
    }
    parser = parsers[str(f.type)]
    try:
        return parser(raw)
    except ValueError as exc:
        raise ValueError(f"{env_name(f)}={raw!r} is not a valid {f.type}: {exc}") from None


def spark_conf_pairs(text: str) -> dict[str, str]:
    """`ADBILL_SPARK_CONF` as a dict: `key=value` pairs separated by whitespace, each key a `spark.` setting."""
    pairs = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("spark.") or not value:
            raise ValueError(f"ADBILL_SPARK_CONF: {item!r} is not spark.NAME=VALUE")
        pairs[key] = value
    return pairs
