"""Fixtures that start the real services on free loopback ports: Kafka (KRaft), Redis, PostgreSQL and local Spark.

They start on first use, once per test session, and stop at its end; a run in several processes (`pytest -n`) has one
Kafka broker for all of them (`SHARED_KAFKA_ENV`). Each test gets its own topics, database, data folder and Redis key
prefix, so tests never see each other's data.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from attribution.session import build_spark
from billing.store.database import connection_pool
from ops import deps
from ops.kafka_service import TOPIC_CONFIGS, LocalKafka, ensure_topics
from ops.postgres_service import LocalPostgres, database_url, ensure_database
from ops.process import free_port, free_ports
from ops.redis_service import LocalRedis
from ops.settings import PROJECT_ROOT, Settings
from tests import spark_archive

DEPS_DIR = PROJECT_ROOT / ".deps"
SPARK_STOP_WAIT_S = 30.0

TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The JVMs the tests start (the brokers, the session's Spark, each job's and reconciliation's driver, the local
cluster's master, workers and executors) live for seconds to minutes on small heaps, so they compile with C1 alone
and collect with the serial collector: the heaviest fault tests, three processes at once, took 275 s and 422 s of CPU
with C1 against 387 s and 642 s with the default tiered compilation, and with the serial collector besides 235 s and
338 s against 243 to 256 s and 368 to 386 s with G1 (docs/getting-started.md, "The tests"). What the tests check
depends on neither; the product's own runs and benchmarks keep the JVM's defaults (and a broker's G1,
`ops.kafka_service.gc_options`, which gives way to a collector chosen here). Where `make test` dumped Spark's
classes into an archive (`tests/spark_archive.py`), the JVMs map them from there instead of loading them from the
jars: the same three files took 238 s and 363 s of CPU against 268 s and 405 s without it. A `JAVA_TOOL_OPTIONS` of
the caller's own is kept."""
JVM_CRASHES = Path(tempfile.gettempdir()) / "adbill-test-jvm-crashes"
"""Where a test's JVM that crashes writes its report (`-XX:ErrorFile`): the end of the run names each one written
during it, since the tests that fail after it only say that their Spark no longer answers."""
JVM_CRASHES.mkdir(exist_ok=True)  # a JVM writes its report there only if the folder exists
if "JAVA_TOOL_OPTIONS" not in os.environ:  # a test process of xdist has the one its parent set
    crash_file = f"-XX:ErrorFile={JVM_CRASHES}/hs_err_pid%p.log"
    os.environ["JAVA_TOOL_OPTIONS"] = spark_archive.java_options(f"{TEST_JAVA_OPTIONS} {crash_file}")
TEST_SCRYPT_N = 1_024
"""scrypt's work factor for the tests' web passwords (`ADBILL_PASSWORD_SCRYPT_N`) in place of the product's 32,768: a
hash at 1,024 takes 2.4 ms of CPU against 134 ms, and the web tests make and check some for every test (the accounts
`tests.web_support.seed` makes, each log-in). `tests/integration/test_web_security.py`, `test_web_access_matrix.py` and
`tests/e2e/test_browser.py` together took 102 s of CPU against 212 s (1:47 against 3:24). What a test checks does not
depend on the factor; the product's own is checked in `tests/unit/test_web_accounts.py`. The tests' settings take it
(`isolated_settings`), and so does the environment of what they start."""
os.environ.setdefault("ADBILL_PASSWORD_SCRYPT_N", str(TEST_SCRYPT_N))
SESSION_STARTED = time.time()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each JVM crash report written during the run, with its first lines (what crashed, and where), and each
    session Spark that had ended before its tests did."""
    reports = sorted(p for p in JVM_CRASHES.iterdir() if p.stat().st_mtime >= SESSION_STARTED)
    for report in reports:
        terminalreporter.write_sep("-", f"a JVM ended early: {report}")
        terminalreporter.write_line("\n".join(report.read_text(errors="replace").splitlines()[:40]))


@contextlib.contextmanager
def _timed(config: pytest.Config, service: str) -> Iterator[None]:
    """Says on the terminal how long a session service took to stop (it counts in the last test's teardown)."""
    started = time.monotonic()
    yield
    _say(config, f"{service} stopped in {time.monotonic() - started:.1f} s")


def _say(config: pytest.Config, line: str) -> None:
    """A line on the terminal, past the output capture of the test being torn down."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if capture is None or reporter is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


SHARED_KAFKA_ENV = "PYTEST_ADBILL_SHARED_KAFKA"
"""Set by the controller of a run in several processes (`pytest -n`) to a folder of its own: the first test process
that needs Kafka starts the broker there and the others use it, and the controller stops it when they have all ended.
One broker for the three processes of `make test` in place of three: a broker takes 4.6 s of CPU to format its storage
and start and 2.4 % of a core while idle (with the tests' JVM options), some 50 s of CPU a run for the two not
started. Each test that uses Kafka has topics of its own (`topics`), so a test never sees another's data, and no test
stops the session's broker (the tests of brokers that stop start their own). Not `ADBILL_*`: the product refuses a
setting it does not know."""


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        # The controller: its test processes start after this and inherit its environment.
        os.environ[SHARED_KAFKA_ENV] = tempfile.mkdtemp(prefix="adbill-test-kafka-")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = os.environ.get(SHARED_KAFKA_ENV)
    if folder is None or hasattr(config, "workerinput"):
        return
    del os.environ[SHARED_KAFKA_ENV]
    broker = _shared_broker(Path(folder))
    if broker is not None:
        with _timed(config, "Kafka (shared by the test processes)"):
            broker.stop()
    _remove_in_background(Path(folder))


def _new_broker(home: Path, port: int, controller_port: int) -> LocalKafka:
    return LocalKafka(
        data_dir=home, port=port, controller_port=controller_port, deps_dir=DEPS_DIR, run_dir=home / "run"
    )


def _shared_broker(folder: Path) -> LocalKafka | None:
    """The broker a test process started in `folder` for the others, or None if none needed one."""
    record = folder / "broker.json"
    if not record.exists():
        return None
    ports = json.loads(record.read_text())
    return _new_broker(folder / "broker", ports["port"], ports["controller_port"])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[LocalKafka]:
    """A real single-node Kafka broker on free ports, for the whole test session (one for all the processes of a
    run in several: `SHARED_KAFKA_ENV`)."""
    shared = os.environ.get(SHARED_KAFKA_ENV)
    if shared is not None and hasattr(pytestconfig, "workerinput"):
        folder = Path(shared)
        with _locked(folder / "broker.lock"):
            broker = _shared_broker(folder)
            if broker is None:
                broker = _new_broker(folder / "broker", *free_ports(2))
                broker.start()
                (folder / "broker.json").write_text(
                    json.dumps({"port": broker.port, "controller_port": broker.controller_port})
                )
            elif not broker.ready():
                raise RuntimeError(f"the test processes' shared broker on {broker.bootstrap} does not answer")
        yield broker
        return  # the controller stops it (`pytest_unconfigure`)
    broker = _new_broker(tmp_path_factory.mktemp("kafka"), *free_ports(2))
    broker.start()
    yield broker
    with _timed(pytestconfig, "Kafka"):
        broker.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[LocalRedis]:
    """A real redis-server on a free port, for the whole test session."""
    home = tmp_path_factory.mktemp("redis")
    server = LocalRedis(data_dir=home, port=free_port(), run_dir=home / "run", appendonly=False)
    server.start()
    yield server
    with _timed(pytestconfig, "Redis"):
        server.stop()


@pytest.fixture(scope="session")
def postgres_server(pytestconfig: pytest.Config) -> Iterator[LocalPostgres]:
    """A real PostgreSQL server on a free port, for the whole test session. Its folder is under /tmp: when the tests
    run as root the server runs as the `postgres` user, which pytest's own temporary folders (mode 700) keep out."""
    home = Path(tempfile.mkdtemp(prefix="adbill-postgres-"))
    home.chmod(0o755)
    server = LocalPostgres(data_dir=home / "cluster", port=free_port(), run_dir=home / "run", log_dir=home / "logs")
    server.start()
    yield server
    with _timed(pytestconfig, "PostgreSQL"):
        server.stop(immediate=True)
    _remove_in_background(home)


def _remove_in_background(folder: Path) -> None:
    """Delete `folder` in a process of its own that outlives the test session. A session's PostgreSQL holds a
    database per test that asked for one, some 300 files each (300 databases: 91,000 files, 8 to 12 s to delete, at
    the end of the run where no test runs beside it). `rm` is detached from the session, so neither pytest nor
    `make test` waits for it."""
    subprocess.Popen(
        ["rm", "-rf", "--", str(folder)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def new_database(postgres_server: LocalPostgres) -> str:
    """The URL of a new, empty database on the session's PostgreSQL."""
    name = f"t{uuid.uuid4().hex[:12]}"
    ensure_database(database_url(postgres_server.port, "postgres"), name)
    return database_url(postgres_server.port, name)


@pytest.fixture
def database(postgres_server: LocalPostgres) -> Iterator[str]:
    """The URL of a database of one test's own, new and empty, on the session's PostgreSQL. After the test, this
    process's connections to it are closed: the product keeps one pool per database for the life of the process
    (`billing.store.database.connection_pool`), and the pools of every test's database would otherwise hold the
    server's connections until it refuses more."""
    url = new_database(postgres_server)
    yield url
    connection_pool(url).close()


@pytest.fixture(scope="session")
def spark_jars() -> list[Path]:
    return deps.ensure_spark_connector_jars(DEPS_DIR)


@pytest.fixture(scope="session")
def spark(
    spark_jars: list[Path], tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[SparkSession]:
    """One local Spark (2 cores, 2 shuffle partitions) with the Kafka and Avro connectors, for the session; a new
    checkpoint's state in the store the product's settings give (ADBILL_STATE_STORE, in memory by default)."""
    session = build_spark(
        "adbill-tests",
        "local[2]",
        spark_jars,
        shuffle_partitions=2,
        local_dir=tmp_path_factory.mktemp("spark-local"),
        rocksdb_state=Settings.from_env().new_state_store == "rocksdb",
        # Loopback only: by default the driver listens on the address the host name resolves to.
        extra_conf={"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"},
    )
    yield session
    _note_if_ended(session)
    with _timed(pytestconfig, "Spark"):
        # A graceful stop after hundreds of queries can take minutes; the session's JVM ends with this process
        # anyway (it exits when its parent's pipe closes), so the wait is bounded.
        stopping = threading.Thread(target=session.stop, name="spark-stop", daemon=True)
        stopping.start()
        stopping.join(SPARK_STOP_WAIT_S)
        if stopping.is_alive():
            _say(pytestconfig, f"Spark still stopping after {SPARK_STOP_WAIT_S:.0f} s: left to end with the tests")


def _note_if_ended(session: SparkSession) -> None:
    """If the session's JVM ended before its tests did, how (its exit code: -9 or 137 killed, -15 or 143 told to
    stop, 134 aborted), for the end of the run: the tests after it fail with the connection refused, and no more."""
    gateway = session.sparkContext._gateway  # type: ignore[attr-defined]
    process = getattr(gateway, "proc", None)
    if process is None or (code := process.poll()) is None:
        return
    (JVM_CRASHES / f"spark-session-{process.pid}.txt").write_text(
        f"the Spark JVM of test process {os.getpid()} (pid {process.pid}) had ended with exit code {code} "
        f"before its tests did (seen at {time.strftime('%H:%M:%S')} UTC)\n"
    )


def child_env(settings: Settings, **overrides: str) -> dict[str, str]:
    """The environment of an `adbill` child process of a test: this one's, with the test's settings in place of
    any `ADBILL_*` variable, and `overrides` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")}
    return {**env, **settings.to_env(), **overrides}


@pytest.fixture(autouse=True)
def no_query_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that fails with a streaming query still running stops it, so the next test can start its own; and the
    query listeners a test added (the job adds its heartbeat and its lock each time it starts) are removed after it.
    The session's Spark hands every event to every listener, one after the other on one thread: listeners left from
    earlier tests would make later tests hear of their batches later and later, and the session's stop wait for all
    of it."""
    if "spark" not in request.fixturenames:
        yield
        return
    session: SparkSession = request.getfixturevalue("spark")
    manager = session._jsparkSession.streams()  # type: ignore[attr-defined]
    before = list(manager.listListeners())
    yield
    for query in session.streams.active:
        query.stop()
    for listener in manager.listListeners():
        if not any(listener.equals(kept) for kept in before):
            manager.removeListener(listener)


@dataclass(frozen=True)
class TopicNames:
    impressions: str
    clicks: str
    quarantine: str

    @property
    def by_type(self) -> dict[str, str]:
        return {"impression": self.impressions, "click": self.clicks}


def fresh_topics(kafka: LocalKafka) -> TopicNames:
    """New impressions, clicks and quarantine topics (4 partitions each, the stack's configs)."""
    tag = uuid.uuid4().hex[:10]
    names = TopicNames(f"impressions-{tag}", f"clicks-{tag}", f"quarantine-{tag}")
    ensure_topics(
        kafka.bootstrap, [names.impressions, names.clicks, names.quarantine], partitions=4, configs=TOPIC_CONFIGS
    )
    return names


def isolated_settings(**overrides: Any) -> Settings:
    """The tests' settings: none of the caller's `ADBILL_*` variables, the project's jars, web passwords hashed at
    `TEST_SCRYPT_N`, and `overrides`."""
    return Settings.from_env({}, deps_dir=DEPS_DIR, password_scrypt_n=TEST_SCRYPT_N, **overrides)


def own_settings(
    folder: Path, kafka: LocalKafka, topics: TopicNames, redis_server: LocalRedis, database_url: str
) -> Settings:
    """Settings on the session's services with their own topics, data folder (under `folder`), key prefix and
    database."""
    return isolated_settings(
        home=folder / "home",
        database_url=database_url,
        kafka_bootstrap=kafka.bootstrap,
        topic_impressions=topics.impressions,
        topic_clicks=topics.clicks,
        topic_quarantine=topics.quarantine,
        redis_url=redis_server.url,
        redis_prefix=f"t{uuid.uuid4().hex[:10]}",
        spark_ui_port=0,  # no fixed port in tests: other test runs share the machine
    )


@pytest.fixture
def topics(kafka: LocalKafka) -> TopicNames:
    """Fresh topics for one test."""
    return fresh_topics(kafka)


@pytest.fixture
def settings(
    tmp_path: Path, kafka: LocalKafka, topics: TopicNames, redis_server: LocalRedis, database: str
) -> Settings:
    """Settings of one test: the session's services, the test's own topics, data folder, key prefix and database."""
    return own_settings(tmp_path, kafka, topics, redis_server, database)


@pytest.fixture
def redis_settings(tmp_path: Path, redis_server: LocalRedis, database: str) -> Settings:
    """Settings of one test that needs Redis but not Kafka: the session's Redis and PostgreSQL, its own data folder,
    key prefix and database."""
    return isolated_settings(
        home=tmp_path / "home",
        database_url=database,
        redis_url=redis_server.url,
        redis_prefix=f"t{uuid.uuid4().hex[:10]}",
    )
