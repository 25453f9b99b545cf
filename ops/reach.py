"""Whether the services a command needs answer, asked once before it starts, so that it fails in one line and
within seconds instead of retrying for minutes.

`require(settings, needs)` raises `Unreachable` naming the first service that did not answer and its address.
librdkafka's own log lines (every reconnect, by the hundred) go to `HOME/logs/kafka-client.log`, not the terminal.
"""

from __future__ import annotations

import logging
import logging.handlers
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

from ops.process import ServiceError
from ops.settings import Settings

KAFKA_TIMEOUT_S = 6.0
REDIS_TIMEOUT_S = 3.0
KAFKA_CLIENT_LOGGER = "librdkafka"
"""The Python logger every Kafka client of the product hands librdkafka's log lines to (its `logger` setting);
`producers.publisher` names the same one."""


EXIT_UNREACHABLE = 69
"""A command's exit status when a service it needs did not answer (`EX_UNAVAILABLE` of sysexits.h)."""


class Unreachable(ServiceError):
    """A service a command needs did not answer; the message names it and its address."""


def require(settings: Settings, needs: Iterable[str]) -> None:
    """Raise `Unreachable` unless every service in `needs` (`kafka`, `redis`, `postgres`) answers."""
    for need in needs:
        if need == "kafka" and not kafka_answers(settings.kafka_bootstrap):
            raise Unreachable(
                f"cannot reach Kafka at {settings.kafka_bootstrap} (no broker answered within "
                f"{KAFKA_TIMEOUT_S:.0f} s); start it (`adbill up`) or set ADBILL_KAFKA_BOOTSTRAP"
            )
        if need == "redis" and not redis_answers(settings.redis_url):
            raise Unreachable(
                f"cannot reach Redis at {redis_address(settings.redis_url)} (no answer within "
                f"{REDIS_TIMEOUT_S:.0f} s); start it (`adbill up`) or set ADBILL_REDIS_URL"
            )
        if need == "postgres" and not database_answers(settings.database_url):
            raise Unreachable(
                f"cannot reach PostgreSQL at {database_address(settings.database_url)} (no answer within "
                f"{REDIS_TIMEOUT_S:.0f} s); start it (`adbill up`) or set ADBILL_DATABASE_URL"
            )


def kafka_answers(bootstrap: str, timeout_s: float = KAFKA_TIMEOUT_S) -> bool:
    """True when a broker answers a metadata request and lists itself; False, never an exception, otherwise."""
    from confluent_kafka.admin import AdminClient

    try:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "socket.timeout.ms": int(timeout_s * 1000),
            "logger": logging.getLogger(KAFKA_CLIENT_LOGGER),
        }
        admin = AdminClient(config)
        return bool(admin.list_topics(timeout=timeout_s).brokers)
    except Exception:  # KafkaException on a timeout, ValueError on a malformed address: either way, no broker
        return False


def database_answers(url: str, timeout_s: float = REDIS_TIMEOUT_S) -> bool:
    """True when PostgreSQL at `url` accepts a connection to its database."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=max(1, int(timeout_s))) as connection:
            connection.execute("SELECT 1")
        return True
    except (psycopg.Error, OSError, ValueError):
        return False


def database_address(url: str) -> str:
    """host:port/database of a database URL, without its user or password."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path}"


def redis_answers(url: str, timeout_s: float = REDIS_TIMEOUT_S) -> bool:
    """True when Redis at `url` answers PING."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


def redis_address(url: str) -> str:
    """`url` without its password, for messages."""
    parsed = urlparse(url)
    host = parsed.hostname or "?"
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{host}{port}{parsed.path}"


def log_kafka_client_to_file(settings: Settings) -> None:
    """Send librdkafka's log lines (warnings and up) to `HOME/logs/kafka-client.log`, capped, never to the
    terminal: a broker that is down makes it log every reconnect attempt."""
    logger = logging.getLogger(KAFKA_CLIENT_LOGGER)
    if logger.handlers:
        return
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    try:
        settings.layout.logs.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.handlers.RotatingFileHandler(
            settings.layout.logs / "kafka-client.log", maxBytes=5_000_000, backupCount=2, delay=True
        )
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
