"""Live totals in Redis: clicks and micros per advertiser, campaign and ad, per period, applied exactly once.

The keys are named by `billing.store.redis_keys.RedisKeys` (their layout is in its docstring).

A batch is applied by one Lua script: if its id is not above the last applied one it changes nothing, so a batch
replayed after a crash (between the ledger write and this one, or after it) is never counted twice.
Reconciliation applies each correction once (a Lua script adds it only if its id is new to
`corrections:applied`), and so the counts of each record it releases from quarantine (`released:applied`), so a run
repeated or resumed after a crash changes nothing twice.

Every call has a deadline (`connect`): a Redis that does not answer within `timeout_s` raises a timeout, the call is
tried again `REDIS_RETRIES` times with a growing pause, and then the error reaches the caller (the streaming job's
batch fails, and is replayed from its checkpoint when the job restarts). The writes here are safe to repeat: a Lua
script keyed by batch id or by correction id, or a value set whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from billing.budgets import OVER_BUDGET, DaysMovedError, day_start, utc_day
from billing.invalid import INVALID_REASONS
from billing.periods import ANY_PERIOD
from billing.store.redis_keys import RedisKeys

REDIS_TIMEOUT_S = 5.0
"""Default deadline of one Redis call (connecting, or a command and its reply), in seconds."""

REDIS_RETRIES = 5
"""How many times a call that timed out or lost its connection is tried again, after pauses of 0.5 s, 1 s, then 2 s:
with the default deadline, a Redis silent for about 40 s (6 x 5 s + 7.5 s) fails the call."""

_RUN_OPS = """
local function run(ops, closed)
  for _, op in ipairs(ops) do
    if op[1] == 'hincrby' then redis.call('HINCRBY', op[2], op[3], op[4])
    elseif op[1] == 'open-hincrby' then
      if not redis.call('ZSCORE', closed, op[2]) then redis.call('HINCRBY', op[3], op[4], op[5]) end
    elseif op[1] == 'hset' then redis.call('HSET', op[2], op[3], op[4])
    elseif op[1] == 'sadd' then redis.call('SADD', op[2], op[3])
    elseif op[1] == 'zadd' then redis.call('ZADD', op[2], op[3], op[4])
    elseif op[1] == 'lpush' then redis.call('LPUSH', op[2], op[3])
    end
  end
end
local function once(seen, items)
  local applied = 0
  for _, item in ipairs(items) do
    if redis.call('SADD', seen, item[1]) == 1 then
      applied = applied + 1
      run(item[2], nil)
    end
  end
  return applied
end
"""
"""Runs a list of [command, key, args...] operations (`run`), or each [id, operations] item whose id is new to the set
`seen` (`once`); the scripts below apply them once per batch or per id.
`open-hincrby` takes a period first and adds only while that period is not in the sorted set `closed`: a closed
period's totals are its export's, whatever the stream bills for it later."""

_CLOSE_PERIOD = """
local closed, prefix, period, start = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local want = {}
for _, item in ipairs(cjson.decode(ARGV[4])) do want[item[1] .. ':' .. item[2]] = item end
local function negated(n)
  if string.sub(n, 1, 1) == '-' then return string.sub(n, 2) end
  return '-' .. n
end
local function settle(level, id, clicks, micros)
  local totals = prefix .. ':totals:' .. period .. ':' .. level .. ':' .. id
  local fixes = prefix .. ':corrections:' .. period .. ':' .. level .. ':' .. id
  local fixed = redis.call('HMGET', fixes, 'clicks', 'micros')
  local was = redis.call('HMGET', totals, 'clicks', 'micros')
  -- Integer text in, integer arithmetic in Redis (HINCRBY, 64 bits): a Lua number is a double, which keeps
  -- 14 significant digits in tostring() and 53 bits in arithmetic, and would round large totals.
  redis.call('HSET', totals, 'clicks', clicks, 'micros', micros)
  if fixed[1] and fixed[1] ~= '0' then redis.call('HINCRBY', totals, 'clicks', negated(fixed[1])) end
  if fixed[2] and fixed[2] ~= '0' then redis.call('HINCRBY', totals, 'micros', negated(fixed[2])) end
  if level == 'cmp' then
    -- The campaign's day holds the period's share as the stream counted it while open; from the close on, the
    -- export's (less the corrections booked in it, which the day counts with the corrections): a bill the stream
    -- counted that the export lacks (its batch not yet committed when the run read) comes back as an adjustment.
    local day = prefix .. ':budget-day:' .. ARGV[5] .. ':' .. id
    local now = redis.call('HMGET', totals, 'clicks', 'micros')
    if was[1] and was[1] ~= '0' then redis.call('HINCRBY', day, 'charged_clicks', negated(was[1])) end
    if was[2] and was[2] ~= '0' then redis.call('HINCRBY', day, 'charged_micros', negated(was[2])) end
    if now[1] and now[1] ~= '0' then redis.call('HINCRBY', day, 'charged_clicks', now[1]) end
    if now[2] and now[2] ~= '0' then redis.call('HINCRBY', day, 'charged_micros', now[2]) end
    if (now[1] and now[1] ~= '0') or (now[2] and now[2] ~= '0') then
      redis.call('SADD', prefix .. ':budget-day-campaigns:' .. ARGV[5], id)
      redis.call('ZADD', prefix .. ':budget-days', ARGV[6], ARGV[5])
    end
  end
end
for _, item in ipairs(cjson.decode(ARGV[4])) do
  settle(item[1], item[2], item[3], item[4])
  if item[5] then
    redis.call('SADD', prefix .. ':period:' .. period .. ':advertisers', item[5])
    redis.call('ZADD', prefix .. ':periods', start, period)
    if item[1] == 'cmp' then redis.call('SADD', prefix .. ':period:' .. period .. ':campaigns:' .. item[5], item[2]) end
    if item[1] == 'ad' then redis.call('SADD', prefix .. ':period:' .. period .. ':ads:' .. item[5], item[2]) end
  end
end
for _, adv in ipairs(redis.call('SMEMBERS', prefix .. ':period:' .. period .. ':advertisers')) do
  local listed = {{'adv', adv}}
  for _, c in ipairs(redis.call('SMEMBERS', prefix .. ':period:' .. period .. ':campaigns:' .. adv)) do
    table.insert(listed, {'cmp', c})
  end
  for _, a in ipairs(redis.call('SMEMBERS', prefix .. ':period:' .. period .. ':ads:' .. adv)) do
    table.insert(listed, {'ad', a})
  end
  for _, pair in ipairs(listed) do
    if not want[pair[1] .. ':' .. pair[2]] then settle(pair[1], pair[2], '0', '0') end
  end
end
redis.call('ZADD', closed, start, period)
return 1
"""
"""Closes a period in one step: each advertiser's, campaign's and ad's provisional totals become what its export
bills less the period's corrections (so provisional + corrections = the export), and the period joins the closed
set, after which `open-hincrby` leaves its totals alone. Each campaign's UTC day moves with it: the period's share
becomes the export's (less the corrections booked in the period, which the day counts with the corrections), so a
bill the stream counted that the export lacks is not counted twice when it comes back as an adjustment."""

_APPLY_BATCH = (
    _RUN_OPS
    + """
local marker = KEYS[1]
local batch_id = tonumber(ARGV[1])
local recorded = redis.call('GET', marker)
if ARGV[3] ~= '' then
  -- Redis lost its data (no record) or its latest writes (an older one): RedisBehindError, nothing applied.
  local need = tonumber(ARGV[3])
  if (not recorded and need >= 0) or (recorded and tonumber(recorded) < need) then return -3 end
end
local last = tonumber(recorded or '-1')
if batch_id <= last then return 0 end
for _, item in ipairs(cjson.decode(ARGV[4])) do
  -- A day total the batch decided on, as text: moved since (a reconciliation run), the batch is decided again.
  if (redis.call('HGET', item[1], 'charged_micros') or '0') ~= item[2] then return -2 end
end
run(cjson.decode(ARGV[2]), KEYS[2])
redis.call('SET', marker, batch_id)
return 1
"""
)

_APPLY_ONCE = (
    _RUN_OPS
    + """
return once(KEYS[1], cjson.decode(ARGV[1]))
"""
)

_APPLY_ONCE_ON_DAY = (
    _RUN_OPS
    + """
local seen, day, expected = KEYS[1], KEYS[2], ARGV[2]
local items = cjson.decode(ARGV[1])
local new = false
for _, item in ipairs(items) do
  if redis.call('SISMEMBER', seen, item[1]) == 0 then new = true break end
end
if not new then return 0 end
-- The day total the run counted on, as text: moved since (the stream charged it), nothing is applied.
if (redis.call('HGET', day, 'charged_micros') or '0') ~= expected then return -1 end
return once(seen, items)
"""
)
"""Applies the corrections of one campaign's day once per id, all or none, only while the day's charged total is
the one the run read: a reconciliation run's retractions and additions of a budgeted day reach Redis together, on
the day as the run counted it. A call whose corrections are all applied already checks nothing."""


def connect(url: str, timeout_s: float = REDIS_TIMEOUT_S, retries: int = REDIS_RETRIES) -> redis.Redis:
    """A client (text replies) whose every call gives up after `timeout_s`, tried `retries` more times before the
    timeout or connection error is raised: a hung Redis fails the call instead of blocking it for ever."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.25), retries),
    )


@dataclass(frozen=True, slots=True)
class TotalsRow:
    """Billed clicks and micros of one ad in one period, as the stream aggregates a micro-batch."""

    period: str
    period_start_ms: int
    advertiser_id: str
    campaign_id: str
    ad_id: str
    clicks: int
    micros: int


@dataclass(frozen=True, slots=True)
class EventCount:
    """Events of one type on one ad and period, as a micro-batch counts them."""

    period: str
    period_start_ms: int
    advertiser_id: str
    ad_id: str
    event_type: str
    """`impression` or `click`."""
    events: int


@dataclass(frozen=True, slots=True)
class LateCount(EventCount):
    """Events that the watermark kept out of the streaming join."""


@dataclass(frozen=True, slots=True)
class ClockAheadCount(EventCount):
    """Events whose time was ahead of the time Kafka received them by more than the tolerance: valid and billed on
    their own time, counted so that the producer's clock gets fixed."""


@dataclass(frozen=True, slots=True)
class UnbilledCount:
    """Matched clicks on one ad and period that had no price at their time, for one reason (`ad_paused`,
    `unknown_ad`); `advertiser_id` is empty when the catalog does not know the ad."""

    period: str
    period_start_ms: int
    advertiser_id: str
    ad_id: str
    reason: str
    clicks: int


@dataclass(frozen=True, slots=True)
class NotChargedCount:
    """Priced clicks of one ad and period that were not charged, for one reason (an invalid traffic rule,
    `over_budget`), with what they would have cost."""

    period: str
    period_start_ms: int
    advertiser_id: str
    campaign_id: str
    ad_id: str
    reason: str
    clicks: int
    micros: int


@dataclass(frozen=True, slots=True)
class BudgetDayCount:
    """A campaign's clicks charged and over budget on a UTC day, from one period's bills (the day's figures are
    added only while that period is open: a closed period's are its export's)."""

    period: str
    campaign_id: str
    day: str
    day_start_ms: int
    charged_clicks: int
    charged_micros: int
    over_clicks: int = 0
    over_micros: int = 0


BUDGET_DAY_FIELDS = ("charged_clicks", "charged_micros", "over_clicks", "over_micros")


@dataclass(frozen=True, slots=True)
class QuarantineCount:
    """Quarantined records of one reason from one topic (and one advertiser when the ad is known)."""

    reason: str
    topic: str
    advertiser_id: str | None
    records: int


@dataclass(frozen=True, slots=True)
class Totals:
    clicks: int = 0
    micros: int = 0


class RedisBehindError(RuntimeError):
    """Redis has not applied every batch the streaming job committed: it lost its data, or its latest writes."""

    def __init__(self, batch_id: int, last: int | None, applied_through: int) -> None:
        self.batch_id, self.last, self.applied_through = batch_id, last, applied_through
        if last is None:
            said = f"Redis has no record of the batches applied before batch {batch_id}: it lost its data"
        else:
            said = (
                f"Redis has applied the batches up to {last}, but the batches up to {applied_through} were applied "
                f"before batch {batch_id}: it lost its latest writes (a power loss, or a copy from before them)"
            )
        super().__init__(
            f"adbill: {said}; nothing of the batch is decided or counted on it. Stop the job and run adbill "
            "restore-redis"
        )


class DayTotalsMovedError(RuntimeError):
    """A campaign's day total that a batch decided on moved before the batch was applied."""

    def __init__(self, batch_id: int) -> None:
        super().__init__(f"a campaign's day total that batch {batch_id} decided on moved before it was applied")


@dataclass(frozen=True, slots=True)
class BatchStart:
    """What Redis holds when the streaming job decides a batch (`RedisTotals.batch_day_charged`)."""

    last_applied: int | None
    day_charged: dict[tuple[str, str], int]


class RedisTotals:
    """Writes the live totals under one key prefix (and reads the little the writers need back)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.keys = RedisKeys(prefix)
        self._apply = client.register_script(_APPLY_BATCH)
        self._apply_once = client.register_script(_APPLY_ONCE)
        self._apply_on_day = client.register_script(_APPLY_ONCE_ON_DAY)
        self._close = client.register_script(_CLOSE_PERIOD)

    @classmethod
    def from_url(cls, url: str, prefix: str, timeout_s: float = REDIS_TIMEOUT_S) -> RedisTotals:
        return cls(connect(url, timeout_s), prefix)

    def apply_batch(
        self,
        sink: str,
        batch_id: int,
        rows: Iterable[TotalsRow],
        late: Iterable[LateCount] = (),
        quarantined: Iterable[QuarantineCount] = (),
        clock_ahead: Iterable[ClockAheadCount] = (),
        applied_through: int | None = None,
        unbilled: Iterable[UnbilledCount] = (),
        not_charged: Iterable[NotChargedCount] = (),
        budget_days: Iterable[BudgetDayCount] = (),
        day_totals_read: Mapping[tuple[str, str], int] | None = None,
    ) -> bool:
        """Add a micro-batch's totals, late, quarantine, clock-ahead and unbilled counts once; False when that batch
        (or a later one) was already applied. With `applied_through` (the streaming job: the batch Redis must have
        applied before this one, `attribution.epoch.Epoch.needs_applied`; -1 for none), the batch is refused
        (RedisBehindError) when Redis has no record of the batches applied, or an older one: Redis lost its data or
        its latest writes. With `day_totals_read` ((campaign, day) -> the charged total the batch decided on),
        DayTotalsMovedError when one of them moved since, and nothing is applied. Bills of a closed period change
        nothing: finance has its export (reconciliation books
        what the stream billed after the close as adjustments in an open period)."""
        k = self.keys
        ops: list[list[Any]] = []
        counters = k.counters()
        for row in rows:
            ops.append(["hincrby", counters, "billed_clicks", str(row.clicks)])
            adv = k.totals(row.period, "adv", row.advertiser_id)
            cmp = k.totals(row.period, "cmp", row.campaign_id)
            ad = k.totals(row.period, "ad", row.ad_id)
            for key in (adv, cmp, ad):
                # Numbers travel as strings: Lua's doubles would print large integers in exponent form.
                ops.append(["open-hincrby", row.period, key, "clicks", str(row.clicks)])
                ops.append(["open-hincrby", row.period, key, "micros", str(row.micros)])
            ops += [
                ["hset", cmp, "advertiser", row.advertiser_id],
                ["hset", ad, "advertiser", row.advertiser_id],
                ["hset", ad, "campaign", row.campaign_id],
                ["zadd", k.periods(), str(row.period_start_ms), row.period],
                ["sadd", k.period_advertisers(row.period), row.advertiser_id],
                ["sadd", k.period_campaigns(row.period, row.advertiser_id), row.campaign_id],
                ["sadd", k.period_ads(row.period, row.advertiser_id), row.ad_id],
            ]
        ops += self._late_ops(late)
        for ahead in clock_ahead:
            field = f"{ahead.event_type}s"
            ops += [
                ["hincrby", k.clock_ahead(ahead.period, "ad", ahead.ad_id), field, str(ahead.events)],
                ["sadd", k.clock_ahead_ads(ahead.period), ahead.ad_id],
                ["zadd", k.clock_ahead_periods(), str(ahead.period_start_ms), ahead.period],
            ]
            if ahead.advertiser_id:
                adv = k.clock_ahead(ahead.period, "adv", ahead.advertiser_id)
                ops.append(["hincrby", adv, field, str(ahead.events)])
        for held in unbilled:
            ops += [
                ["hincrby", counters, f"unbilled_{held.reason}", str(held.clicks)],
                ["hincrby", k.unbilled(held.period, "ad", held.ad_id), held.reason, str(held.clicks)],
                ["sadd", k.unbilled_ads(held.period), held.ad_id],
                ["zadd", k.unbilled_periods(), str(held.period_start_ms), held.period],
            ]
            if held.advertiser_id:
                ops.append(
                    ["hincrby", k.unbilled(held.period, "adv", held.advertiser_id), held.reason, str(held.clicks)]
                )
        ops += self._quarantine_ops(quarantined)
        for n in not_charged:
            ops += not_charged_ops(k, n, open_only=True)
            ops.append(["hincrby", counters, f"not_charged_{n.reason}", str(n.clicks)])
        for day in budget_days:
            ops += budget_day_ops(k, day, open_only=True)
        keys = [k.applied(sink), k.closed_periods()]
        need = "" if applied_through is None else str(applied_through)
        read = [
            [k.budget_day(day, campaign), str(micros)] for (campaign, day), micros in (day_totals_read or {}).items()
        ]
        done = int(self._apply(keys=keys, args=[batch_id, json.dumps(ops), need, json.dumps(read)]))
        if done == -3:
            raise RedisBehindError(batch_id, self.last_applied(sink), applied_through or 0)
        if done == -2:
            raise DayTotalsMovedError(batch_id)
        return bool(done)

    def apply_corrections(
        self,
        corrections: Iterable[Any],
        period_start_ms: Mapping[str, int],
        days_read: Mapping[tuple[str, str], int] | None = None,
    ) -> int:
        """Add each correction (`billing.corrections.Correction`) to the figures of the period it is booked in
        (the corrected period while that is open; the open period for an adjustment of a closed one) and to its
        advertiser's list, once per correction id; returns how many were new. `period_start_ms` maps each
        booked period to its start, for the period index.

        With `days_read` ((campaign, UTC day of the corrected period) -> the charged micros the caller read there),
        the corrections of each of those days are applied in one script call, in the order given, and only while the
        day still holds that total; the days that moved are applied nothing and raised together as DaysMovedError,
        after the other corrections are applied."""
        k = self.keys
        read = days_read or {}
        items = []
        guarded: dict[tuple[str, str], list[list[Any]]] = {}
        for c in corrections:
            period = c.booked_period
            ops: list[list[Any]] = []
            for key in (
                k.corrections(period, "adv", c.advertiser_id),
                k.corrections(period, "cmp", c.campaign_id),
                k.corrections(period, "ad", c.ad_id),
            ):
                ops.append(["hincrby", key, "clicks", str(c.clicks)])
                ops.append(["hincrby", key, "micros", str(c.amount_micros)])
            ops += [
                ["zadd", k.periods(), str(period_start_ms[period]), period],
                ["sadd", k.period_advertisers(period), c.advertiser_id],
                ["sadd", k.period_campaigns(period, c.advertiser_id), c.campaign_id],
                ["sadd", k.period_ads(period, c.advertiser_id), c.ad_id],
                ["hset", k.totals(period, "cmp", c.campaign_id), "advertiser", c.advertiser_id],
                ["hset", k.totals(period, "ad", c.ad_id), "advertiser", c.advertiser_id],
                ["hset", k.totals(period, "ad", c.ad_id), "campaign", c.campaign_id],
                ["lpush", k.correction_list(c.advertiser_id), json.dumps(c.to_dict(), sort_keys=True)],
            ]
            ops += correction_side_ops(k, c, period_start_ms)
            pair = (c.campaign_id, utc_day(ANY_PERIOD.parse_key(c.corrects_period)))
            if pair in read:
                guarded.setdefault(pair, []).append([c.correction_id, ops])
            else:
                items.append([c.correction_id, ops])
        applied, moved = 0, []
        for (campaign, day), of_day in guarded.items():
            # One call per day, however many corrections: its retractions and additions reach Redis together.
            done = int(
                self._apply_on_day(
                    keys=[k.corrections_applied(), k.budget_day(day, campaign)],
                    args=[json.dumps(of_day), str(read[(campaign, day)])],
                )
            )
            if done < 0:
                moved.append((campaign, day))
            else:
                applied += done
        applied += self._apply_items(k.corrections_applied(), items)
        if moved:
            raise DaysMovedError(moved)
        return applied

    def read_days(self, pairs: Iterable[tuple[str, str]], sink: str = "billing") -> BatchStart:
        """What a reconciliation run reads before it applies corrections to budgeted days, in one transaction: the
        last batch `sink` (the streaming job's) applied, and (campaign, day) -> micros charged that day so far. The
        stream's bills of those days in Redis are those of the batches up to that one."""
        return self.batch_day_charged(sink, 0, -1, pairs)

    def add_conflicts(self, conflicts: Iterable[tuple[str, str, str | None]]) -> int:
        """Count quarantined id conflicts, each (`topic/partition/offset`, topic, advertiser) once."""
        items = []
        for coordinates, topic, advertiser in conflicts:
            ops = [["hincrby", self.keys.quarantine("id_conflict"), topic, "1"]]
            if advertiser is not None:
                ops.append(["hincrby", self.keys.quarantined(advertiser), "id_conflict", "1"])
            items.append([coordinates, ops])
        return self._apply_items(self.keys.conflicts_applied(), items)

    def apply_released(self, records: Iterable[tuple[str, Iterable[LateCount], Iterable[QuarantineCount]]]) -> int:
        """Apply the late and quarantine counts of records released from quarantine by reconciliation
        (`attribution.release`), each record (`topic/partition/offset`, its counts) once; returns how many were
        new."""
        items = [[key, self._late_ops(late) + self._quarantine_ops(quarantined)] for key, late, quarantined in records]
        return self._apply_items(self.keys.released_applied(), items)

    def _late_ops(self, late: Iterable[LateCount]) -> list[list[Any]]:
        k, ops = self.keys, []
        for count in late:
            field = f"{count.event_type}s"
            ops += [
                ["hincrby", k.counters(), f"late_{field}", str(count.events)],
                ["hincrby", k.late(count.period, "ad", count.ad_id), field, str(count.events)],
                ["zadd", k.late_periods(), str(count.period_start_ms), count.period],
            ]
            if count.advertiser_id:  # empty for an ad the catalog does not know
                ops.append(["hincrby", k.late(count.period, "adv", count.advertiser_id), field, str(count.events)])
        return ops

    def _quarantine_ops(self, quarantined: Iterable[QuarantineCount]) -> list[list[Any]]:
        k, ops = self.keys, []
        for q in quarantined:
            ops.append(["hincrby", k.quarantine(q.reason), q.topic, str(q.records)])
            if q.advertiser_id is not None:
                ops.append(["hincrby", k.quarantined(q.advertiser_id), q.reason, str(q.records)])
        return ops

    def _apply_items(self, seen_key: str, items: list[list[Any]]) -> int:
        applied = 0
        for start in range(0, len(items), 2000):  # keeps each script call short
            applied += int(self._apply_once(keys=[seen_key], args=[json.dumps(items[start : start + 2000])]))
        return applied

    def close_period(
        self, period: str, period_start_ms: int, exported: Mapping[tuple[str, str], tuple[int, int, str]]
    ) -> None:
        """Close `period` with the figures of its export: (level `adv`/`cmp`/`ad`, id) -> (clicks, micros,
        advertiser), as `billing.export.export_totals` sums them. Idempotent: it sets, never adds."""
        items = [[level, item, str(c), str(m), adv] for (level, item), (c, m, adv) in sorted(exported.items())]
        self._close(
            keys=[self.keys.closed_periods()],
            args=[
                self.prefix,
                period,
                str(period_start_ms),
                json.dumps(items),
                utc_day(period_start_ms),
                str(day_start(period_start_ms)),
            ],
        )

    def set_not_charged(self, period: str, period_start_ms: int, counts: Iterable[NotChargedCount]) -> None:
        """Replace a period's not-charged figures with `counts` (a closed period: its export's). Idempotent."""
        k = self.keys
        doomed = list(self.client.scan_iter(match=k.not_charged(period, "*", "*"), count=1000))
        pipe = self.client.pipeline(transaction=True)
        if doomed:
            pipe.delete(*doomed)
        for count in counts:
            for op in not_charged_ops(k, count, open_only=False):
                if op[0] == "hincrby":
                    pipe.hincrby(op[1], op[2], int(op[3]))
                elif op[0] == "zadd":
                    pipe.zadd(op[1], {op[3]: int(op[2])})
                elif op[0] == "sadd":
                    pipe.sadd(op[1], op[2])
        pipe.execute()

    def day_charged(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """(campaign, day) -> micros charged that UTC day so far (the stream's and the corrections')."""
        wanted = sorted(set(pairs))
        if not wanted:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for campaign, day in wanted:
            pipe.hget(self.keys.budget_day(day, campaign), "charged_micros")
        return {pair: int(value or 0) for pair, value in zip(wanted, pipe.execute(), strict=True)}

    def batch_day_charged(
        self, sink: str, batch_id: int, applied_through: int, pairs: Iterable[tuple[str, str]]
    ) -> BatchStart:
        """What the streaming job reads before it decides batch `batch_id`, in one transaction: the last batch Redis
        applied and (campaign, day) -> micros charged that day so far. RedisBehindError, before anything is
        decided, when Redis has not applied every batch up to `applied_through` (-1: none needed): a day total read
        from a Redis that lost its data, or its latest writes, would let the batch charge past a budget."""
        wanted = sorted(set(pairs))
        pipe = self.client.pipeline(transaction=True)
        pipe.get(self.keys.applied(sink))
        for campaign, day in wanted:
            pipe.hget(self.keys.budget_day(day, campaign), "charged_micros")
        recorded, *values = pipe.execute()
        last = None if recorded is None else int(recorded)
        if applied_through >= 0 and (last is None or last < applied_through):
            raise RedisBehindError(batch_id, last, applied_through)
        return BatchStart(last, {pair: int(value or 0) for pair, value in zip(wanted, values, strict=True)})

    def budget_day(self, day: str, campaign_id: str) -> dict[str, int]:
        """A campaign's figures on a UTC day (`BUDGET_DAY_FIELDS`)."""
        values = self.client.hmget(self.keys.budget_day(day, campaign_id), *BUDGET_DAY_FIELDS)
        return {name: int(v or 0) for name, v in zip(BUDGET_DAY_FIELDS, values, strict=True)}  # type: ignore[arg-type]

    def closed_periods(self) -> list[str]:
        return [_text(v) for v in self.client.zrange(self.keys.closed_periods(), 0, -1)]  # type: ignore[union-attr,arg-type]

    def record_reconciliation(self, record: Mapping[str, Any]) -> None:
        """The last reconciliation run, for the health page."""
        self._record(self.keys.last_reconciliation(), record)

    def record_compaction(self, part: str, record: Mapping[str, Any]) -> None:
        """The last compaction pass of `part` (`closed`, `open`) or the last writing of the click filters
        (`filters`), for the health page."""
        self._record(self.keys.compaction(part), record)

    def record_audit(self, record: Mapping[str, Any]) -> None:
        """The last `adbill audit`, for the finance page."""
        self._record(self.keys.last_audit(), record)

    def _record(self, key: str, record: Mapping[str, Any]) -> None:
        """Replace the hash `key` with `record` (values as text; lists and dicts as JSON)."""
        mapping: dict[str | bytes, str | bytes] = {
            k: json.dumps(v) if isinstance(v, list | dict) else str(v) for k, v in record.items()
        }
        pipe = self.client.pipeline()
        pipe.delete(key)
        pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
        pipe.execute()

    def last_applied(self, sink: str) -> int | None:
        value = self.client.get(self.keys.applied(sink))
        return None if value is None else int(value)

    def all_ad_totals(self) -> dict[tuple[str, str], Totals]:
        """(period, ad_id) -> totals, over every period: for checks and rebuilds."""
        k, out = self.keys, {}
        for period in map(_text, self.client.zrange(k.periods(), 0, -1)):  # type: ignore[arg-type]
            for advertiser in map(_text, self.client.smembers(k.period_advertisers(period))):  # type: ignore[arg-type]
                for ad in map(_text, self.client.smembers(k.period_ads(period, advertiser))):  # type: ignore[arg-type]
                    out[(period, ad)] = self._totals(k.totals(period, "ad", ad))
        return out

    def wipe_billing(self) -> int:
        """Delete every billing figure under the prefix (`RedisKeys.billing_patterns`); returns how many keys."""
        doomed = [
            key for pattern in self.keys.billing_patterns() for key in self.client.scan_iter(match=pattern, count=1000)
        ]
        for start in range(0, len(doomed), 1000):
            self.client.delete(*doomed[start : start + 1000])
        return len(doomed)

    def _totals(self, key: str) -> Totals:
        values = self.client.hmget(key, "clicks", "micros")
        return Totals(int(values[0] or 0), int(values[1] or 0))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


NOT_CHARGED_LEVELS = ("adv", "cmp", "ad")


def not_charged_ops(keys: RedisKeys, n: NotChargedCount, *, open_only: bool) -> list[list[Any]]:
    """The operations that add `n` to its period's not-charged figures (`open_only`: while the period is open)."""
    ops: list[list[Any]] = []
    for level, item in (("adv", n.advertiser_id), ("cmp", n.campaign_id), ("ad", n.ad_id)):
        key = keys.not_charged(n.period, level, item)
        for name, value in ((n.reason, n.clicks), (f"{n.reason}:micros", n.micros)):
            ops.append(
                ["open-hincrby", n.period, key, name, str(value)] if open_only else ["hincrby", key, name, str(value)]
            )
    ops += [
        ["zadd", keys.not_charged_periods(), str(n.period_start_ms), n.period],
        ["zadd", keys.periods(), str(n.period_start_ms), n.period],
        ["sadd", keys.period_advertisers(n.period), n.advertiser_id],
        ["sadd", keys.period_campaigns(n.period, n.advertiser_id), n.campaign_id],
        ["sadd", keys.period_ads(n.period, n.advertiser_id), n.ad_id],
        ["hset", keys.totals(n.period, "cmp", n.campaign_id), "advertiser", n.advertiser_id],
        ["hset", keys.totals(n.period, "ad", n.ad_id), "advertiser", n.advertiser_id],
        ["hset", keys.totals(n.period, "ad", n.ad_id), "campaign", n.campaign_id],
    ]
    return ops


def budget_day_ops(keys: RedisKeys, day: BudgetDayCount, *, open_only: bool) -> list[list[Any]]:
    """The operations that add `day`'s figures to its campaign's UTC day (`open_only`: while its period is open)."""
    key = keys.budget_day(day.day, day.campaign_id)
    ops: list[list[Any]] = []
    for name in BUDGET_DAY_FIELDS:
        value = getattr(day, name)
        if value:
            ops.append(
                ["open-hincrby", day.period, key, name, str(value)] if open_only else ["hincrby", key, name, str(value)]
            )
    ops += [
        ["sadd", keys.budget_day_campaigns(day.day), day.campaign_id],
        ["zadd", keys.budget_days(), str(day.day_start_ms), day.day],
    ]
    return ops


def correction_side_ops(keys: RedisKeys, c: Any, period_start_ms: Mapping[str, int]) -> list[list[Any]]:
    """What a correction changes besides the corrections' sums: the day total of its click's campaign (by the
    corrected period's day), and, for an invalid traffic or `over_budget` reason, the not-charged figures of the
    period it is booked in (a retraction adds a click there, an addition takes one away)."""
    corrected_start = ANY_PERIOD.parse_key(c.corrects_period)
    day = BudgetDayCount(
        c.corrects_period,
        c.campaign_id,
        utc_day(corrected_start),
        day_start(corrected_start),
        c.clicks,
        c.amount_micros,
    )
    reason = str(c.reason)
    if reason == OVER_BUDGET:
        day = BudgetDayCount(
            day.period,
            day.campaign_id,
            day.day,
            day.day_start_ms,
            day.charged_clicks,
            day.charged_micros,
            -c.clicks,
            -c.amount_micros,
        )
    ops = budget_day_ops(keys, day, open_only=False)
    if reason in NOT_CHARGED_REASONS:
        n = NotChargedCount(
            c.booked_period,
            period_start_ms[c.booked_period],
            c.advertiser_id,
            c.campaign_id,
            c.ad_id,
            reason,
            -c.clicks,
            -c.amount_micros,
        )
        ops += not_charged_ops(keys, n, open_only=False)
    return ops


NOT_CHARGED_REASONS = frozenset({*INVALID_REASONS, OVER_BUDGET})
"""The reasons a priced click is not charged: the invalid traffic rules and the budget."""
