"""The Redis keyspace: the one place that spells a key. Every writer and reader (the streaming job, reconciliation,
restore, the job's listeners, the web UI, its sample data, the tests) builds keys through `RedisKeys`.

Key layout (PREFIX is the `ADBILL_REDIS_PREFIX` setting; LEVEL is `adv`, `cmp` or `ad`):

| key | type | holds |
| --- | --- | --- |
| `PREFIX:totals:PERIOD:adv:ADVERTISER` | hash | `clicks`, `micros` (the stream's; closed: export less corrections) |
| `PREFIX:totals:PERIOD:cmp:CAMPAIGN` | hash | the same per campaign, plus `advertiser` |
| `PREFIX:totals:PERIOD:ad:AD` | hash | the same per ad, plus `advertiser`, `campaign` |
| `PREFIX:periods` | sorted set | period keys with totals, scored by period start |
| `PREFIX:period:PERIOD:advertisers` | set | advertisers with totals in that period |
| `PREFIX:period:PERIOD:campaigns:ADVERTISER`, `...:ads:ADVERTISER` | set | an advertiser's campaigns and ads |
| `PREFIX:applied:SINK` | string | the last micro-batch id applied by SINK |
| `PREFIX:quarantine:REASON` | hash | quarantined records per topic |
| `PREFIX:quarantined:adv:ADVERTISER` | hash | quarantined records on that advertiser's ads, per reason |
| `PREFIX:late:PERIOD:ad:AD`, `...:adv:ADVERTISER` | hash | `impressions`, `clicks` the watermark kept out of the join |
| `PREFIX:late-periods` | sorted set | event periods with late events, scored by period start |
| `PREFIX:clock-ahead:PERIOD:ad:AD`, `...:adv:ADV` | hash | `impressions`, `clicks` too far ahead of Kafka's clock |
| `PREFIX:clock-ahead:PERIOD:ads` | set | ads with clock-ahead events in that period |
| `PREFIX:clock-ahead-periods` | sorted set | event periods with clock-ahead events, scored by period start |
| `PREFIX:unbilled:PERIOD:ad:AD`, `...:adv:ADV` | hash | matched clicks without a price: `ad_paused`, `unknown_ad` |
| `PREFIX:unbilled:PERIOD:ads` | set | ads with unbilled clicks in that period |
| `PREFIX:unbilled-periods` | sorted set | event periods with unbilled clicks, scored by period start |
| `PREFIX:not-charged:PERIOD:adv:ADV`, `...:cmp:CMP`, `...:ad:AD` | hash | priced clicks not charged per reason |
| `PREFIX:not-charged-periods` | sorted set | periods with clicks not charged, scored by period start |
| `PREFIX:budget-day:DAY:CAMPAIGN` | hash | a campaign's UTC day: `charged_clicks`, `charged_micros`, `over_*` |
| `PREFIX:budget-day-campaigns:DAY` | set | campaigns with figures that day |
| `PREFIX:budget-days` | sorted set | days with figures, scored by midnight UTC |
| `PREFIX:corrections:PERIOD:adv:ADV`, `...:cmp:CMP`, `...:ad:AD` | hash | signed `clicks`, `micros` of corrections |
| `PREFIX:correction-list:ADVERTISER` | list | the advertiser's corrections as JSON, newest first |
| `PREFIX:corrections:applied` | set | ids of the corrections applied (each is applied once) |
| `PREFIX:periods:closed` | sorted set | closed periods, scored by period start |
| `PREFIX:reconcile:last` | hash | the last reconciliation run: `run_id`, times, periods, counts |
| `PREFIX:audit:last` | hash | the last `adbill audit`: when, periods, the periods that differ |
| `PREFIX:conflicts:applied` | set | quarantined id conflicts counted, as `topic/partition/offset` |
| `PREFIX:released:applied` | set | records reconciliation released from quarantine, as `topic/partition/offset` |
| `PREFIX:counters` | hash | the stream's counts: `billed_clicks`, `late_impressions`, `late_clicks`, `unbilled_*` |
| `PREFIX:health:query:NAME`, `...:history:NAME` | hash, list | a query's last progress record; its recent ones |
| `PREFIX:health:heartbeat:NAME` | string | when the query last reported (epoch ms) |
| `PREFIX:health:status:PART` | hash | what `stream` or `reconcile` waits for while it waits (disk space) |
| `PREFIX:web:session:HMAC` | hash | a web session (`web/sessions.py`) |
| `PREFIX:web:login-failures:account:SHA256`, `...:address:ADDRESS` | sorted set | login attempts, by time |

`not-charged` fields: `REASON` (clicks) and `REASON:micros` per invalid traffic rule and `over_budget`; the stream's
and the corrections' (booked in the period), a closed period's from its export. `budget-day` holds the stream's
charged clicks of open periods, a closed period's share from its export (less the corrections booked in it), plus
every correction of the day's periods, by the clicks' day.

Who writes what: the stream (`apply_batch`) the totals, the period sets, `applied`, `counters`, `late*`,
`clock-ahead*`, `unbilled*`, `not-charged*`, `budget-day*`, `quarantine*`; reconciliation the `corrections*` keys,
`correction-list`, `conflicts:applied`, `released:applied` (with the late and quarantine counts of what it
releases) and `reconcile:last`, and on closing a period `periods:closed` and the period's totals; `adbill audit`
`audit:last`; the job's listeners `health:*`; the web UI `web:*`. `adbill restore-redis` rewrites the billing
figures from the data folder (`billing_patterns`).

The one exception: the Lua script that closes a period (`billing.store.redis_totals`) walks the period's sets and
builds `totals`, `corrections` and `period` keys inside Redis, from the same prefix and the same names as above.
"""

from __future__ import annotations


class RedisKeys:
    """The names of every key under one prefix, a method per key family. Arguments may be `*` to make a pattern for
    `SCAN MATCH`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    # The figures of billing ------------------------------------------------------------------------------------
    def totals(self, period: str, level: str, item_id: str) -> str:
        """Provisional clicks and micros of an advertiser (`adv`), campaign (`cmp`) or ad (`ad`) in a period."""
        return self._key("totals", period, level, item_id)

    def corrections(self, period: str, level: str, item_id: str) -> str:
        """Signed sums of the corrections booked in a period, per advertiser, campaign or ad."""
        return self._key("corrections", period, level, item_id)

    def corrections_applied(self) -> str:
        return self._key("corrections", "applied")

    def correction_list(self, advertiser_id: str) -> str:
        return self._key("correction-list", advertiser_id)

    def periods(self) -> str:
        return self._key("periods")

    def closed_periods(self) -> str:
        return self._key("periods", "closed")

    def period_advertisers(self, period: str) -> str:
        return self._key("period", period, "advertisers")

    def period_campaigns(self, period: str, advertiser_id: str) -> str:
        return self._key("period", period, "campaigns", advertiser_id)

    def period_ads(self, period: str, advertiser_id: str) -> str:
        return self._key("period", period, "ads", advertiser_id)

    def applied(self, sink: str) -> str:
        """The last micro-batch id applied by `sink`."""
        return self._key("applied", sink)

    def counters(self) -> str:
        return self._key("counters")

    def late(self, period: str, level: str, item_id: str) -> str:
        """Late events of an ad (`ad`) or an advertiser (`adv`) in a period."""
        return self._key("late", period, level, item_id)

    def late_periods(self) -> str:
        return self._key("late-periods")

    def clock_ahead(self, period: str, level: str, item_id: str) -> str:
        """Clock-ahead events of an ad (`ad`) or an advertiser (`adv`) in a period."""
        return self._key("clock-ahead", period, level, item_id)

    def clock_ahead_ads(self, period: str) -> str:
        return self._key("clock-ahead", period, "ads")

    def clock_ahead_periods(self) -> str:
        return self._key("clock-ahead-periods")

    def unbilled(self, period: str, level: str, item_id: str) -> str:
        """Matched clicks without a price at their time, of an ad (`ad`) or an advertiser (`adv`) in a period, per
        reason (`billing.catalog.Unbillable`)."""
        return self._key("unbilled", period, level, item_id)

    def unbilled_ads(self, period: str) -> str:
        return self._key("unbilled", period, "ads")

    def unbilled_periods(self) -> str:
        return self._key("unbilled-periods")

    def not_charged(self, period: str, level: str, item_id: str) -> str:
        """Priced clicks not charged of an advertiser (`adv`), campaign (`cmp`) or ad (`ad`) in a period: per reason,
        clicks (`REASON`) and micros (`REASON:micros`)."""
        return self._key("not-charged", period, level, item_id)

    def not_charged_periods(self) -> str:
        return self._key("not-charged-periods")

    def budget_day(self, day: str, campaign_id: str) -> str:
        """A campaign's charged and over-budget clicks and micros on a UTC day (`2026-11-25`)."""
        return self._key("budget-day", day, campaign_id)

    def budget_day_campaigns(self, day: str) -> str:
        return self._key("budget-day-campaigns", day)

    def budget_days(self) -> str:
        return self._key("budget-days")

    def quarantine(self, reason: str) -> str:
        """Quarantined records of one reason, per topic."""
        return self._key("quarantine", reason)

    def quarantined(self, advertiser_id: str) -> str:
        """Quarantined records on an advertiser's ads, per reason."""
        return self._key("quarantined", "adv", advertiser_id)

    def conflicts_applied(self) -> str:
        return self._key("conflicts", "applied")

    def released_applied(self) -> str:
        """The records reconciliation released from quarantine whose counts were applied (each once)."""
        return self._key("released", "applied")

    def last_reconciliation(self) -> str:
        return self._key("reconcile", "last")

    def last_audit(self) -> str:
        return self._key("audit", "last")

    def compaction(self, part: str) -> str:
        """The last pass of `part` (`closed`, `open`, `filters`: `billing.store.compaction`, the click filters)."""
        return self._key("compaction", part)

    def billing_patterns(self) -> list[str]:
        """`SCAN MATCH` patterns of every key of the billing figures (not the job's health records, not the web
        UI's sessions)."""
        return [
            self._key("totals", "*"),
            self._key("period", "*"),
            self.periods(),
            self.closed_periods(),
            self.applied("*"),
            self._key("late", "*"),
            self.late_periods(),
            self._key("clock-ahead", "*"),
            self.clock_ahead_periods(),
            self._key("unbilled", "*"),
            self.unbilled_periods(),
            self._key("not-charged", "*"),
            self.not_charged_periods(),
            self._key("budget-day", "*"),
            self._key("budget-day-campaigns", "*"),
            self.budget_days(),
            self._key("corrections", "*"),
            self.correction_list("*"),
            self.quarantine("*"),
            self._key("quarantined", "*"),
            self.conflicts_applied(),
            self.released_applied(),
            self.last_reconciliation(),
            self.last_audit(),
        ]

    # The job's health ------------------------------------------------------------------------------------------
    def health_query(self, query: str) -> str:
        """A streaming query's last progress record."""
        return self._key("health", "query", query)

    def health_history(self, query: str) -> str:
        """A streaming query's recent progress records, newest first."""
        return self._key("health", "history", query)

    def heartbeat(self, query: str) -> str:
        """When `query` last reported (epoch ms)."""
        return self._key("health", "heartbeat", query)

    def health_status(self, part: str) -> str:
        """What a part (`stream`, `reconcile`) is waiting for, while it waits (such as disk space)."""
        return self._key("health", "status", part)

    # The web UI ------------------------------------------------------------------------------------------------
    def web_session(self, digest: str) -> str:
        return self._key("web", "session", digest)

    def login_failures_of_account(self, digest: str) -> str:
        return self._key("web", "login-failures", "account", digest)

    def login_failures_of_address(self, network: str) -> str:
        return self._key("web", "login-failures", "address", network)

    def login_failures_of_client(self, digest: str, network: str) -> str:
        """Failed logins of one account name (`digest`) from one client network."""
        return self._key("web", "login-failures", "client", digest, network)
