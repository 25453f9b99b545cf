"""What a chaos run (`make chaos`, `ops.chaos`) does and when: its faults in order, the periods and horizon it closes
with, the traffic's shape (poison, catalog changes, invalid traffic, budgets, a schema deployed mid-run), and how long
each recovery may take, and the records a run keeps of its faults and its web reads. Shared by the run and its
verdict (`ops.chaos_verdict`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

FAULTS = ["driver"] * 3 + ["worker"] + ["broker"] * 2 + ["redis", "redis-restarted", "outage"]
FAULTS += ["driver+broker", "redis+reconcile", "worker+closing", "disk", "database"]
"""One at a time, then overlapping (a second fault while the first one's recovery runs), then the full disk."""
PERIOD_MS = 60_000
HORIZON_MS = 60_000
POISON_FRACTION = 0.01
CATALOG_EVERY_S = 60
NEW_ADS = 2
DISK_SIZE = "1g"
"""The small filesystem of the data folder (a tmpfs), which the `disk` fault fills."""
DISK_FULL_S = 30.0
OUTSIDE_THE_DATA_DISK = ("kafka", "redis", "postgres", "run", "logs", "spark", "spark-events")
"""Folders of HOME that stay on the machine's own disk: the services' data and logs (a full data folder is the
fault, not a broker or a log that dies of it)."""
INVALID_TRAFFIC_BUDGET_SHARE = "0.10"
"""With invalid traffic on: each budgeted campaign's daily budget as a share of what the traffic (two hours) would
spend on it, so that budgets run out about 12 minutes in, in the middle of the faults."""
RECOVERY_DEADLINE_S = 600.0
BUDGET_EXHAUSTED_WAIT_S = 900.0
"""How long the `redis-restarted` fault waits for a budget to run out before it strikes all the same."""
JOB_STOPS_BY_ITSELF_S = 120.0
"""How long the job may take to stop by itself on a Redis restarted empty: its next batch (a trigger and a batch, or
Redis calls' deadlines while Redis was away)."""
OUTAGE_S = 1200.0
"""How long the `outage` fault keeps the job down: 20 minutes of live traffic, prices changing, periods held."""
CHANGES_AT_S = 900.0
"""With invalid traffic on: when the budgets change (one raised by half, one halved, one made unlimited) and a range
joins the IP exclusion list (`adbill produce --changes-at`), seconds after the traffic started: after the budgets ran
out, so that a raised and an unlimited budget let the stream charge again, under the faults (a run with a 5-minute
outage sends traffic for some 20 minutes)."""
SCHEMA_DEPLOY_AT_S = 1200.0
"""When the traffic's producers deploy a new schema version (`adbill produce --deploy-schema-at`), seconds after
the traffic started: about halfway through a full run."""


@dataclass(frozen=True)
class ChaosOptions:
    """What a run is asked to do: its seed, the traffic's rate in events a second, the faults in order, how long the
    `outage` fault keeps the job down, when the producers deploy a new schema version, whether the traffic carries
    invalid clicks and budgets, and when the budgets and the IP exclusion list change (seconds after the traffic
    started)."""

    seed: int
    rate: int
    plan: list[str]
    outage_s: float = OUTAGE_S
    schema_deploy_at_s: float = SCHEMA_DEPLOY_AT_S
    invalid_traffic: bool = True
    changes_at_s: float = CHANGES_AT_S


@dataclass
class FaultRecord:
    """One fault of a run: when it struck, what, and how the job came back."""

    kind: str
    pause_s: float
    """Seeded pause before the fault, after the previous one recovered."""
    at_s: float = 0.0
    """When it struck, seconds after the traffic started."""
    target: str = ""
    recovered_s: float | None = None
    """From the fault until the job billed a batch again (None: it did not, within the deadline)."""
    delayed_events: int = 0
    """Records that reached Kafka between the fault and the recovery."""
    note: str = ""
    failed_step: str = ""
    """The recovery step that failed (the command and its output's last line); empty when none did."""


@dataclass
class WebReads:
    """The web client's reads of the JSON API, one a second: those answered, and those failed with the fault then."""

    ok: int = 0
    failed: int = 0
    failed_during: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
