"""What a long-running part says of itself beyond its heartbeat: that it waits, and for what (disk space).

`PREFIX:health:status:PART` (hash `state`, `message`, `since_ms`) is set while the streaming job (`stream`) or
reconciliation (`reconcile`) waits, and removed when it goes on; `adbill health PART` shows it. Reconciliation keeps
one more, `reconcile-run`, while a run is under way (`RUNNING`), for the health page. Recording it never
stops the part: a Redis that does not answer is logged and passed over.
"""

from __future__ import annotations

import logging
import time

import redis

from billing.periods import format_elapsed
from billing.store.redis_keys import RedisKeys
from billing.store.redis_totals import connect

log = logging.getLogger(__name__)

WAITING_FOR_DISK = "waiting for disk space"
WAITING_FOR_DATABASE = "waiting for the catalog's database"
"""Reconciliation's state while the catalog's database cannot be reached: it never closes with a catalog that may
be behind."""
PRICING_WITH_HELD = "pricing with the catalog it holds"
"""The streaming job's state while the catalog's database cannot be reached: it goes on pricing with the catalog
version it holds, and takes the changes it missed when the database is back (`STREAM_CATALOG_PART`)."""
STREAM_CATALOG_PART = "stream-catalog"
"""The streaming job's record of its catalog (`PRICING_WITH_HELD`), apart from its disk waits (`STREAM_PART`)."""
STREAM_PART, RECONCILE_PART = "stream", "reconcile"
"""The parts that keep a status record: the streaming job and reconciliation."""
RUNNING = "running"
RECONCILE_RUN_PART = "reconcile-run"
"""Reconciliation's run under way: set when a run starts (`state` running, `since_ms` its start), removed when it
ends however it ends; a record left by a run killed outright stays, and the health page says how long it has run."""


class PartStatus:
    """The status record of one part; call it with a message while the part waits, with None when it goes on."""

    def __init__(self, redis_url: str, prefix: str, part: str, state: str = WAITING_FOR_DISK) -> None:
        self.redis_url = redis_url
        self.key = RedisKeys(prefix).health_status(part)
        self.state = state
        self.since_ms: int | None = None

    def __call__(self, message: str | None) -> None:
        try:
            client = connect(self.redis_url, timeout_s=5.0, retries=0)
            try:
                if message is None:
                    self.since_ms = None
                    client.delete(self.key)
                else:
                    self.since_ms = self.since_ms or int(time.time() * 1000)
                    client.hset(
                        self.key, mapping={"state": self.state, "message": message, "since_ms": str(self.since_ms)}
                    )
            finally:
                client.close()
        except redis.RedisError:
            log.exception("could not record the status %r in %s", message, self.key)


def describe_wait(status: dict[str, str], now_ms: int) -> str:
    """A status record in a few words, with how long it has lasted: `waiting for disk space for 3 min`."""
    since = status.get("since_ms", "")
    elapsed = f" for {format_elapsed(now_ms - int(since))}" if since.isdigit() else ""
    return f"{status.get('state', 'waiting')}{elapsed}"


def read_status(client: redis.Redis, prefix: str, part: str) -> dict[str, str]:
    """The status record of `part` ({} when it is not waiting)."""
    return {str(k): str(v) for k, v in client.hgetall(RedisKeys(prefix).health_status(part)).items()}  # type: ignore[union-attr]
