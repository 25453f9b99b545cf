"""Whether a long-running part of the deployment is healthy, for health checks (`adbill health PART`)."""

from __future__ import annotations

import time
import urllib.request

from ops.settings import Settings

ALIVE_WITHIN_MS = 120_000
"""A streaming job silent for longer is down (reconciliation holds periods past the same bound)."""


def check(settings: Settings, part: str) -> tuple[bool, str]:
    """(healthy, why) of `part`: `stream` (its heartbeat in Redis is recent), `reconcile` (its last run finished
    within two intervals and five minutes), `web` (its login page answers). A part that records that it waits
    (for disk space: `billing.store.part_status`) is not healthy, and the reason says what it waits for."""
    if part == "web":
        url = f"http://127.0.0.1:{settings.web_port}/login"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status == 200, f"{url} answered {response.status}"
        except OSError as exc:
            return False, f"{url}: {exc}"
    import redis

    from billing.store.part_status import read_status
    from billing.store.redis_keys import RedisKeys

    client = redis.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=5)
    keys = RedisKeys(settings.redis_prefix)
    now = int(time.time() * 1000)
    try:
        waiting = read_status(client, settings.redis_prefix, part)
        if waiting:
            return False, f"{waiting.get('message', waiting.get('state', 'waiting'))}"
        if part == "stream":
            beat = client.get(keys.heartbeat("billing"))
            if beat is None:
                return False, "the billing query has not reported yet"
            silent = now - int(str(beat))
            return silent <= ALIVE_WITHIN_MS, f"the billing query reported {silent / 1000:.0f} s ago"
        if part == "reconcile":
            finished = client.hget(keys.last_reconciliation(), "finished_at_ms")
            if finished is None:
                return False, "no reconciliation run has finished yet"
            ago = now - int(str(finished))
            bound = (2 * settings.reconcile_interval_s + 300) * 1000
            return ago <= bound, f"the last run finished {ago / 1000:.0f} s ago (bound {bound / 1000:.0f} s)"
    except redis.RedisError as exc:
        return False, f"Redis at {settings.redis_url}: {exc}"
    finally:
        client.close()
    raise ValueError(f"unknown part {part!r}")
