"""The traffic simulator: deterministic, bounded, shaped as configured, and right about its ground truth."""

from __future__ import annotations

import ipaddress
import json
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from billing.budgets import utc_day
from billing.events import Click, Impression
from billing.intake import Intake, QuarantineReason
from billing.store.crawler_list import crawler_list
from billing.store.schema_registry import open_registry
from producers.arrivals import ArrivalKind, Made, Timing
from producers.capture import read_capture
from producers.ground_truth import GroundTruth
from producers.simulator import (
    BROWSER_USER_AGENTS,
    EXCLUDED_RANGES,
    UNKNOWN_SCHEMA_ID_BASE,
    LiveSchedule,
    SimulationConfig,
    Simulator,
    crawler_agents,
    resolve_start_ms,
    simulate,
    write_capture,
    write_run,
)
from producers.wire import EventDeserializer, EventSerializer, UnknownSchemaError, WireFormatError, unframe
from tests.simulated_traffic import TROUBLED

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NOW_MS = int(NOW.timestamp()) * 1000


def clock() -> int:
    return NOW_MS


# Busy enough that the interesting cases all happen in a small run: few users for the rate, so several
# impressions of one (ad, user) fall in one window; generous fractions of every kind of trouble. Enough users that
# none makes a click flood (about 3 clicks a minute each): these tests are about the join and about timing, and
# they read every billable click, charged or not (users this few still click one ad twice within 30 s often).
BUSY = replace(TROUBLED, bad_fraction=0.03, seed=7, events=20_000)


def arrivals_of(config: SimulationConfig) -> list:
    return list(Simulator(config, clock).arrivals())


@pytest.fixture(scope="module")
def busy_arrivals():
    return arrivals_of(BUSY)


RUN_FILES = ("billable.jsonl", "not_charged.jsonl", "summary.json", "catalog.json")


def run_files(config: SimulationConfig, folder) -> dict[str, bytes]:
    for _ in simulate(config, folder, clock):
        pass
    return {name: (folder / name).read_bytes() for name in RUN_FILES}


def billable_rows(folder) -> list[dict]:
    """Every billable click of a run folder, charged (`billable.jsonl`) or not (`not_charged.jsonl`), by click_id."""
    rows = [
        json.loads(line)
        for name in ("billable.jsonl", "not_charged.jsonl")
        for line in (folder / name).read_text().splitlines()
    ]
    return sorted(rows, key=lambda row: row["click_id"])


# --- Determinism and bounds ----------------------------------------------------------------------------


def test_same_seed_same_arrivals_and_same_ground_truth_files(tmp_path, busy_arrivals):
    assert arrivals_of(BUSY) == busy_arrivals
    assert run_files(BUSY, tmp_path / "a") == run_files(BUSY, tmp_path / "b")


def test_same_seed_same_bytes_on_the_wire(tmp_path, busy_arrivals):
    serializer = EventSerializer(open_registry(str(tmp_path / "registry.json")))

    def wire(arrivals):
        return [a.raw.value if a.raw else serializer.serialize(a.event) for a in arrivals]

    assert wire(arrivals_of(BUSY)) == wire(busy_arrivals)


def test_a_different_seed_gives_different_traffic(tmp_path, busy_arrivals):
    other = replace(BUSY, seed=8)
    assert [a.item for a in arrivals_of(other)] != [a.item for a in busy_arrivals]
    assert run_files(other, tmp_path / "a")["billable.jsonl"] != run_files(BUSY, tmp_path / "b")["billable.jsonl"]


@pytest.mark.parametrize("events", [0, 1, 2, 3, 17, 5_000])
def test_the_event_count_is_exact(events):
    arrivals = arrivals_of(replace(BUSY, events=events))
    assert len(arrivals) == events
    assert [a.position for a in arrivals] == list(range(events))


def test_a_duration_bounds_the_event_time():
    config = replace(BUSY, events=None, duration_s=60.0, start_ms=NOW_MS)
    arrivals = arrivals_of(config)
    valid = [a.event for a in arrivals if a.kind != ArrivalKind.BAD]
    assert valid
    assert all(NOW_MS <= e.event_time < NOW_MS + 60_000 for e in valid)
    # Late events of the last minute are still sent: arrivals go beyond the end, event times do not.
    assert max(a.arrival_ms for a in arrivals) > NOW_MS + 60_000
    assert len(arrivals) == pytest.approx(config.expected_arrivals(), rel=0.1)


def test_config_needs_exactly_one_size():
    with pytest.raises(ValueError, match="exactly one size"):
        SimulationConfig()
    with pytest.raises(ValueError, match="exactly one size"):
        SimulationConfig(events=1, duration_s=1.0)


# --- Time ----------------------------------------------------------------------------------------------


def test_as_fast_as_possible_no_event_time_is_in_the_future(busy_arrivals):
    times = [a.event.event_time for a in busy_arrivals if a.event is not None]
    assert max(times) <= NOW_MS
    start = resolve_start_ms(BUSY, NOW_MS)
    assert min(t for t in times if t >= start) == start
    # The line ends near now, not hours before it.
    assert NOW_MS - max(times) < BUSY.expected_span_ms() * 0.2


def test_paced_at_or_below_the_natural_rate_the_line_starts_now():
    assert resolve_start_ms(BUSY, NOW_MS, rate_per_s=BUSY.expected_arrival_rate() / 2) == NOW_MS


def test_paced_faster_than_the_natural_rate_the_line_starts_earlier():
    fast = resolve_start_ms(BUSY, NOW_MS, rate_per_s=BUSY.expected_arrival_rate() * 10)
    assert resolve_start_ms(BUSY, NOW_MS) < fast < NOW_MS


def test_an_explicit_start_is_kept():
    assert resolve_start_ms(replace(BUSY, start_ms=NOW_MS - 5), NOW_MS) == NOW_MS - 5
    with pytest.raises(ValueError, match="2000"):
        replace(BUSY, start_ms=0)


# --- Live: sent on the clock ---------------------------------------------------------------------------


class FakeClock:
    """Epoch ms that move only when someone sleeps or the test says so; `sleep` is the one to inject."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self.slept_ms = 0

    def __call__(self) -> int:
        return self.now_ms

    def sleep(self, seconds: float) -> None:
        step = round(seconds * 1000)
        assert step > 0, "never asked to sleep for nothing"
        self.now_ms += step
        self.slept_ms += step


# A minute of live traffic with every kind of delay: late ones up to 2 minutes.
LIVE = replace(BUSY, events=None, duration_s=60.0)


def test_live_the_line_starts_now_unless_pinned():
    assert resolve_start_ms(LIVE, NOW_MS, live=True) == NOW_MS
    assert resolve_start_ms(BUSY, NOW_MS, live=True) == NOW_MS  # a count of events too: no span to fit
    assert resolve_start_ms(replace(LIVE, start_ms=NOW_MS - 5), NOW_MS, live=True) == NOW_MS - 5
    with pytest.raises(ValueError, match="live"):
        Simulator(LIVE, clock, rate_per_s=100.0, live=True)


def test_live_each_arrival_goes_out_when_the_clock_reaches_its_arrival_time():
    wall = FakeClock(NOW_MS)
    simulator = Simulator(LIVE, wall, live=True)
    assert simulator.start_ms == NOW_MS
    wall.now_ms += 250  # catalog, registry and producer set up before the first record
    schedule = LiveSchedule(wall, wall.sleep)
    sent = [(arrival, wall()) for arrival in schedule.run(simulator.arrivals())]

    first = sent[0][0]
    assert first.arrival_ms - NOW_MS < LIVE.max_disorder_ms
    # Anchored on the first arrival, the line then runs exactly as fast as the clock: each record goes out at
    # its arrival time plus one fixed offset, never earlier and (nothing being slow here) never later.
    assert schedule.offset_ms == NOW_MS + 250 - first.arrival_ms
    assert all(at == arrival.arrival_ms + schedule.offset_ms for arrival, at in sent)
    assert schedule.max_behind_ms == 0
    assert wall.slept_ms == sent[-1][1] - (NOW_MS + 250), "no idle time beyond what the schedule asks"
    # So an event's event time trails the clock by its simulated delay and nothing else: 0 for most, a
    # little for out-of-order ones, minutes for late ones; none is ahead of the clock.
    lag: dict[Timing, list[int]] = defaultdict(list)
    for arrival, at in sent:
        if arrival.kind == ArrivalKind.EVENT:
            lag[arrival.timing].append(at - schedule.offset_ms - arrival.event.event_time)
    assert set(lag[Timing.IN_ORDER]) == {0}
    assert min(lag[Timing.OUT_OF_ORDER]) >= 1
    assert max(lag[Timing.OUT_OF_ORDER]) <= LIVE.max_disorder_ms
    assert min(lag[Timing.LATE]) >= LIVE.late_min_ms and max(lag[Timing.LATE]) <= LIVE.late_max_ms
    # A minute of event time takes a minute of clock time (late ones of the last minute go out after it).
    on_time = [at for arrival, at in sent if arrival.kind == ArrivalKind.EVENT and arrival.timing == Timing.IN_ORDER]
    last_on_time = max(on_time)
    assert 59_000 < last_on_time - (NOW_MS + 250) < 60_000


def test_live_the_content_is_the_simulated_run():
    wall = FakeClock(NOW_MS)
    simulator = Simulator(LIVE, wall, live=True)
    live = list(LiveSchedule(wall, wall.sleep).run(simulator.arrivals()))
    assert live == list(Simulator(replace(LIVE, start_ms=simulator.start_ms), clock).arrivals())


def test_live_behind_schedule_records_go_out_at_once_until_on_time_again():
    wall = FakeClock(NOW_MS)
    schedule = LiveSchedule(wall, wall.sleep)
    went_out = []
    for arrival_ms in (0, 10, 20, 30, 40, 1_000, 1_010):  # simulated times, anchored at the first
        schedule.wait_for(arrival_ms)
        went_out.append(wall() - NOW_MS)
        wall.now_ms += 25  # sending one record takes 25 ms: slower than one every 10 ms
    # Behind, no sleep: each goes out as soon as the previous one is done (15, 30, 45 ms late), none is
    # dropped; a gap lets the sender catch up, and it is on time again.
    assert went_out == [0, 25, 50, 75, 100, 1_000, 1_025]
    assert schedule.max_behind_ms == 60
    assert wall.slept_ms == 1_000 - 125


def test_a_config_at_an_arrival_rate_offers_exactly_that_rate():
    config = SimulationConfig(duration_s=86_400, impression_rate=200 / 1.15)  # the stack's former guess
    assert config.expected_arrival_rate() == pytest.approx(193.7, abs=0.05)  # 3 % short of the 200/s offered
    at_200 = config.at_arrival_rate(200.0)
    assert at_200.expected_arrival_rate() == pytest.approx(200.0, rel=1e-12)
    assert replace(at_200, impression_rate=config.impression_rate) == config
    with pytest.raises(ValueError, match="positive"):
        config.at_arrival_rate(0)


def test_arrival_order_and_delays(busy_arrivals):
    assert [a.arrival_ms for a in busy_arrivals] == sorted(a.arrival_ms for a in busy_arrivals)
    for a in busy_arrivals:
        if a.kind == ArrivalKind.BAD:
            continue
        delay = a.arrival_ms - a.event.event_time
        if a.kind == ArrivalKind.EVENT and a.timing == Timing.IN_ORDER:
            assert delay == 0
        elif a.kind == ArrivalKind.EVENT and a.timing == Timing.OUT_OF_ORDER:
            assert 1 <= delay <= BUSY.max_disorder_ms
        elif a.kind == ArrivalKind.EVENT:
            assert BUSY.late_min_ms <= delay <= BUSY.late_max_ms
        else:  # a duplicate arrives after its original
            assert delay >= 0


def test_late_events_arrive_after_later_events(busy_arrivals):
    """A late event really is late: events with a much later event time were sent before it."""
    # At the end of a run nothing new overtakes them: count the late events sent before the last on-time one.
    last_in_order = max(a.arrival_ms for a in busy_arrivals if a.timing == Timing.IN_ORDER)
    late = 0
    max_seen = 0
    for a in busy_arrivals:
        if a.event is None:
            continue
        if a.kind == ArrivalKind.EVENT and a.timing == Timing.LATE and a.arrival_ms <= last_in_order:
            late += 1
            assert max_seen - a.event.event_time >= BUSY.late_min_ms - 100  # 100 ms: a few impression gaps
        max_seen = max(max_seen, a.event.event_time)
    assert late >= 100


# --- Shape ---------------------------------------------------------------------------------------------


def test_fractions_are_roughly_respected():
    config = replace(BUSY, events=60_000, users=1_000)
    arrivals = arrivals_of(config)
    primary = [a for a in arrivals if a.kind == ArrivalKind.EVENT]
    kinds = Counter(a.kind for a in arrivals)
    timing = Counter(a.timing for a in primary)
    types = Counter(a.event.type for a in primary)
    n = len(primary)
    assert kinds[ArrivalKind.DUPLICATE] / n == pytest.approx(config.duplicate_fraction, rel=0.15)
    assert kinds[ArrivalKind.BAD] / n == pytest.approx(config.bad_fraction, rel=0.15)
    assert timing[Timing.LATE] / n == pytest.approx(config.late_fraction, rel=0.15)
    assert timing[Timing.OUT_OF_ORDER] / n == pytest.approx(config.out_of_order_fraction, rel=0.1)
    # Edge pairs add an impression for a quarter of the edge clicks.
    impressions_from_rate = types["impression"] / (1 + config.click_through_rate * config.edge_fraction / 4)
    assert types["click"] / impressions_from_rate == pytest.approx(config.click_through_rate, rel=0.05)
    reasons = Counter(a.expected_reason for a in arrivals if a.kind == ArrivalKind.BAD)
    assert set(reasons) == {
        QuarantineReason.UNDECODABLE,
        QuarantineReason.UNKNOWN_SCHEMA,
        QuarantineReason.TIME_OUT_OF_RANGE,
        QuarantineReason.ID_CONFLICT,
    }
    assert all(count == pytest.approx(kinds[ArrivalKind.BAD] / 4, rel=0.3) for count in reasons.values())


def test_most_clicks_fall_inside_the_window(tmp_path):
    """Beyond-window clicks and two of the four edge cases are not billable on their own impression."""
    config = replace(BUSY, events=60_000, users=1_000)
    for _ in simulate(config, tmp_path, clock):
        pass
    summary = json.loads((tmp_path / "summary.json").read_text())
    share = (summary["billable"]["clicks"] + summary["not_charged"]["clicks"]) / summary["primary"]["click"]
    not_own = config.beyond_window_fraction + config.edge_fraction / 2
    # Some of those still find another impression of the same ad and user within 10 s.
    assert 1 - not_own - 0.01 <= share <= 1 - not_own / 2


def test_every_arrival_gets_the_verdict_it_was_made_for(busy_arrivals):
    """Valid events are accepted, duplicates are duplicates, bad events are quarantined for their reason."""
    intake = Intake()
    for a in busy_arrivals:
        if a.event is None:
            continue
        verdict = intake.admit(a.event, a.arrival_ms)
        if a.kind == ArrivalKind.EVENT:
            assert verdict.accepted, a
        elif a.kind == ArrivalKind.DUPLICATE:
            assert verdict.kind == "duplicate", a
        else:
            assert verdict.reason == a.expected_reason, a


def test_raw_records_fail_to_decode_as_announced(tmp_path, busy_arrivals):
    registry = open_registry(str(tmp_path / "registry.json"))
    EventSerializer(registry)
    deserializer = EventDeserializer(registry)
    raw = [a for a in busy_arrivals if a.raw is not None]
    assert {a.expected_reason for a in raw} == {QuarantineReason.UNDECODABLE, QuarantineReason.UNKNOWN_SCHEMA}
    for a in raw:
        assert a.raw.topic in ("impressions", "clicks")
        event_type = "click" if a.raw.topic == "clicks" else "impression"
        if a.expected_reason == QuarantineReason.UNKNOWN_SCHEMA:
            assert unframe(a.raw.value)[0] >= UNKNOWN_SCHEMA_ID_BASE
            with pytest.raises(UnknownSchemaError):
                deserializer.deserialize(event_type, a.raw.value)
        else:
            with pytest.raises(WireFormatError):
                unframe(a.raw.value)


def test_the_rule_edges_occur(tmp_path):
    for _ in simulate(BUSY, tmp_path, clock):
        pass
    gaps = Counter(row["click_time"] - row["impression_time"] for row in billable_rows(tmp_path))
    assert gaps[0] > 0  # a click at the very millisecond of its impression
    assert gaps[10_000] > 0  # a click exactly 10 s after it
    assert max(gaps) == 10_000


# --- Ground truth --------------------------------------------------------------------------------------


def brute_force_billable(arrivals, catalog) -> dict[str, tuple[str, int]]:
    """The docs/billing-rules.md rule, written plainly: click_id -> (impression_id, micros)."""
    accepted: dict[tuple[str, str], object] = {}
    for a in arrivals:  # in arrival order
        e = a.event
        if e is None:
            continue
        if e.ad_id not in catalog:
            continue  # unknown ad: quarantined
        if not 946_684_800_000 <= e.event_time <= a.arrival_ms + 3_600_000:
            continue  # before 2000, or more than an hour after it was received
        key = (type(e).__name__, e.event_id)
        if key not in accepted:
            accepted[key] = e  # the first copy stands; later copies are duplicates or conflicts
    impressions = defaultdict(list)
    for e in accepted.values():
        if isinstance(e, Impression):
            impressions[(e.ad_id, e.user_id)].append(e)
    billable = {}
    for c in accepted.values():
        if not isinstance(c, Click):
            continue
        qualifying = [
            i for i in impressions[(c.ad_id, c.user_id)] if i.event_time <= c.event_time <= i.event_time + 10_000
        ]
        if qualifying:
            latest = max(i.event_time for i in qualifying)
            chosen = min(i.impression_id for i in qualifying if i.event_time == latest)
            billable[c.click_id] = (chosen, catalog[c.ad_id].cpc_micros)
    return billable


def test_ground_truth_equals_a_brute_force_recomputation(tmp_path, busy_arrivals):
    """The attribution: every billable click, charged or not (the invalid traffic rules and budgets are held to the
    oracle in test_oracle.py)."""
    for _ in simulate(BUSY, tmp_path, clock):
        pass
    rows = billable_rows(tmp_path)
    expected = brute_force_billable(busy_arrivals, BUSY.catalog())
    assert [row["click_id"] for row in rows] == sorted(expected)
    assert {row["click_id"]: (row["impression_id"], row["amount_micros"]) for row in rows} == expected
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["billable"]["clicks"] + summary["not_charged"]["clicks"] == len(expected)
    catalog = BUSY.catalog()
    assert len({ad.currency for ad in catalog}) > 1, "the run's advertisers bill in several currencies"
    by_currency: Counter[str] = Counter()
    for row in rows:
        by_currency[catalog[row["ad_id"]].currency] += expected[row["click_id"]][1]
        assert row["currency"] == catalog[row["ad_id"]].currency
    charged_and_not: Counter[str] = Counter(summary["billable"]["total_micros_by_currency"])
    for entry in summary["not_charged"]["by_reason"].values():
        charged_and_not.update(entry["micros_by_currency"])
    assert dict(sorted(charged_and_not.items())) == dict(sorted(by_currency.items()))
    # No budgets, no invalid traffic made: what is not charged is what the ordinary traffic repeats within 30 s.
    reasons = {reason for reason, entry in summary["not_charged"]["by_reason"].items() if entry["clicks"]}
    assert reasons == {"duplicate_click"}
    # Ties and several qualifying impressions really happened, so the "latest" part of the rule was exercised.
    assert any(row["click_time"] - row["impression_time"] > 0 for row in rows)


def test_summary_counts(tmp_path, busy_arrivals):
    for _ in simulate(BUSY, tmp_path, clock):
        pass
    summary = json.loads((tmp_path / "summary.json").read_text())
    kinds = Counter(a.kind for a in busy_arrivals)
    assert summary["arrivals"] == len(busy_arrivals) == sum(summary["sent"].values())
    assert sum(summary["duplicates"].values()) == kinds[ArrivalKind.DUPLICATE]
    assert summary["bad"]["total"] == kinds[ArrivalKind.BAD]
    # What the intake decided agrees with what the simulator meant.
    for reason in QuarantineReason:
        assert summary["intake"][reason.value] == summary["bad"][reason.value]
    assert summary["intake"]["duplicate"] == kinds[ArrivalKind.DUPLICATE]
    assert summary["intake"]["accepted"] == kinds[ArrivalKind.EVENT]
    per_advertiser = summary["billable"]["by_advertiser"]
    for currency, total in summary["billable"]["total_micros_by_currency"].items():
        assert sum(e["micros"] for e in per_advertiser.values() if e["currency"] == currency) == total
    assert summary["config"]["seed"] == BUSY.seed
    assert summary["start_ms"] == resolve_start_ms(BUSY, NOW_MS)


def test_partitioned_ground_truth_matches_the_in_memory_one(tmp_path):
    simulator = Simulator(BUSY, clock)
    files = {}
    for partitions in (1, 5):
        truth = GroundTruth(simulator.catalog, partitions, tmp_path / f"work-{partitions}")
        for arrival in simulator.arrivals():
            truth.observe(arrival)
        folder = tmp_path / f"run-{partitions}"
        write_run(folder, BUSY, simulator.start_ms, truth, simulator.catalog)
        files[partitions] = [(folder / n).read_bytes() for n in ("billable.jsonl", "not_charged.jsonl", "summary.json")]
        assert not any((tmp_path / f"work-{partitions}").iterdir())  # the spill files are gone
    assert files[1] == files[5]


def test_capture_of_a_run_reads_back(tmp_path, busy_arrivals):
    path = tmp_path / "capture.jsonl"
    assert write_capture(busy_arrivals, path) == len(busy_arrivals)
    items = list(read_capture(path))
    # Raw records lose their key in a capture (the format has none); everything else is as sent.
    assert items == [a.item if a.raw is None else replace(a.raw, key=None) for a in busy_arrivals]


# --- Invalid traffic and budgets -----------------------------------------------------------------------

# Each kind of invalid traffic at a few percent of the clicks, and three campaigns' budgets. Enough users that the
# ordinary traffic makes no flood of its own.
INVALID = replace(
    BUSY,
    users=3_000,
    events=30_000,
    start_ms=NOW_MS,
    crawler_fraction=0.03,
    excluded_ip_fraction=0.03,
    flood_fraction=0.05,
    double_click_fraction=0.03,
    late_duplicate_fraction=0.03,
    budget_campaigns=3,
)


@pytest.fixture(scope="module")
def invalid_run(tmp_path_factory):
    """The arrivals of `INVALID`, its simulator and its ground truth."""
    folder = tmp_path_factory.mktemp("invalid")
    simulator = Simulator(INVALID, clock)
    truth = GroundTruth(simulator.catalog)
    arrivals = []
    for arrival in simulator.arrivals():
        truth.observe(arrival)
        arrivals.append(arrival)
    result = write_run(folder, INVALID, simulator.start_ms, truth, simulator.catalog)
    return arrivals, simulator, result


def made_clicks(arrivals, made: Made) -> list:
    return [a for a in arrivals if a.kind == ArrivalKind.EVENT and a.made == made and isinstance(a.event, Click)]


def before_the_end(arrivals) -> int:
    """An event time a minute and a half before the run's last: the run's size cuts what is made after it short (a
    flood whose last clicks were never sent, a late click whose later one was not)."""
    return max(a.event.event_time for a in arrivals if a.kind == ArrivalKind.EVENT) - 90_000


def test_every_event_carries_a_user_agent_and_an_ip_of_its_user(busy_arrivals):
    events = [a.event for a in busy_arrivals if a.kind == ArrivalKind.EVENT]
    profiles = {(e.user_id, e.user_agent, e.ip) for e in events}
    assert len(profiles) == len({e.user_id for e in events}), "one user agent and one address per user"
    assert {e.user_agent for e in events} == set(BROWSER_USER_AGENTS)
    assert not any(crawler_list().matches(agent) for agent in BROWSER_USER_AGENTS)
    addresses = [ipaddress.ip_address(e.ip) for e in events]
    assert all(str(address) == e.ip for address, e in zip(addresses, events, strict=True))
    users_v6 = {e.user_id for e, address in zip(events, addresses, strict=True) if address.version == 6}
    assert 0.1 < len(users_v6) / len({e.user_id for e in events}) < 0.3, "some users have IPv6 addresses"
    ranges = [ipaddress.ip_network(cidr) for cidr in EXCLUDED_RANGES]
    assert not any(
        address in network for address in addresses for network in ranges if address.version == network.version
    )
    assert all(a.made is None for a in busy_arrivals), "no invalid traffic unless asked for"
    assert not BUSY.catalog_lines(NOW_MS) and not Simulator(BUSY, clock).catalog.exclusions


def test_crawlers_clicks_are_known_bots(invalid_run):
    arrivals, _, result = invalid_run
    outcomes = result.outcomes()
    clicks = made_clicks(arrivals, Made.CRAWLER)
    assert len(clicks) > 50
    examples = set(crawler_agents(crawler_list()))
    assert all(a.event.user_agent in examples and crawler_list().matches(a.event.user_agent) for a in clicks)
    billable = [a.event.click_id for a in clicks if a.event.click_id in outcomes]
    assert len(billable) > 0.9 * len(clicks)
    assert {outcomes[click_id] for click_id in billable} == {"known_bot"}


def test_clicks_from_excluded_ranges_are_excluded_from_the_time_their_range_is(invalid_run):
    arrivals, simulator, result = invalid_run
    outcomes = result.outcomes()
    exclusions = simulator.catalog.exclusions
    halfway = INVALID.changes_at_ms(simulator.start_ms)
    assert exclusions.ranges_at(simulator.start_ms) == sorted(EXCLUDED_RANGES[:2])
    assert exclusions.ranges_at(halfway) == sorted(EXCLUDED_RANGES)
    excluded, before_their_range = 0, 0
    for a in made_clicks(arrivals, Made.EXCLUDED_IP):
        outcome = outcomes.get(a.event.click_id)
        if outcome is None:
            continue
        if exclusions.excluding(a.event.ip, a.event.event_time):
            assert outcome == "excluded_ip"
            excluded += 1
        else:
            assert a.event.ip.startswith("203.0.113.") and a.event.event_time < halfway
            assert outcome != "excluded_ip"
            before_their_range += 1
    assert excluded > 50 and before_their_range > 5


def test_flood_users_clicks_are_all_click_floods(invalid_run):
    arrivals, _, result = invalid_run
    outcomes = result.outcomes()
    clicks = made_clicks(arrivals, Made.FLOOD)
    by_user = defaultdict(list)
    for a in clicks:
        by_user[a.event.user_id].append(a.event)
    whole = {
        user_id for user_id, user_clicks in by_user.items() if user_clicks[0].event_time < before_the_end(arrivals)
    }
    assert len(whole) >= 5
    for user_id, user_clicks in by_user.items():
        times = [c.event_time for c in user_clicks]
        assert len(user_clicks) >= 25 or user_id not in whole
        assert max(times) - min(times) <= 60_000
        assert len({c.ad_id for c in user_clicks}) > 1, "across ads"
    in_whole = [a.event.click_id for a in clicks if a.event.user_id in whole]
    billable = [click_id for click_id in in_whole if click_id in outcomes]
    assert len(billable) == len(in_whole), "each after an impression of its ad"
    assert {outcomes[click_id] for click_id in billable} == {"click_flood"}


def test_double_clicks_are_duplicates_of_the_click_a_moment_before(invalid_run):
    arrivals, _, result = invalid_run
    outcomes = result.outcomes()
    clicks = [a.event for a in arrivals if a.kind == ArrivalKind.EVENT and isinstance(a.event, Click)]
    by_pair = defaultdict(list)
    for c in clicks:
        by_pair[(c.user_id, c.ad_id)].append(c)
    doubles = made_clicks(arrivals, Made.DOUBLE_CLICK)
    assert len(doubles) > 50
    for a in doubles:
        earlier = [c.event_time for c in by_pair[(a.event.user_id, a.event.ad_id)] if c.event_time < a.event.event_time]
        assert 100 <= a.event.event_time - max(earlier) <= 900
        assert outcomes[a.event.click_id] == "duplicate_click", "a double click is billable, and not charged"


def test_a_late_earlier_click_makes_a_click_already_sent_a_duplicate(invalid_run):
    arrivals, _, result = invalid_run
    outcomes = result.outcomes()
    position = {a.event.click_id: a for a in arrivals if a.kind == ArrivalKind.EVENT and isinstance(a.event, Click)}
    late = [a for a in made_clicks(arrivals, Made.LATE_EARLIER) if a.event.event_time < before_the_end(arrivals)]
    made_duplicate = made_clicks(arrivals, Made.MADE_DUPLICATE)
    assert len(late) > 50 and len(made_duplicate) >= len(late)
    pairs = 0
    for a in made_duplicate:
        earlier = [
            b
            for b in late
            if (b.event.user_id, b.event.ad_id) == (a.event.user_id, a.event.ad_id)
            and 0 < a.event.event_time - b.event.event_time <= 10_000
        ]
        if not earlier:
            continue  # the run's size ran out before its late click was made
        pairs += 1
        assert a.timing == Timing.IN_ORDER and a.arrival_ms == a.event.event_time
        assert all(b.timing == Timing.LATE and b.position > a.position for b in earlier), "it arrives later"
        assert outcomes[a.event.click_id] == "duplicate_click"
        assert all(position[b.event.click_id] is b for b in earlier)
    assert pairs >= len(late)


def test_the_mid_run_changes_come_when_asked_not_only_halfway():
    """`changes_at_s` places the budget and exclusion changes (a long live run can have them while it is watched),
    and the ground truth's history follows it; without it they come halfway."""
    start = INVALID.start_ms
    assert start is not None
    early = replace(INVALID, changes_at_s=42.5)
    assert early.changes_at_ms(start) == start + 42_500
    assert INVALID.changes_at_ms(start) == start + INVALID.expected_span_ms() // 2 != start + 42_500
    changed = {
        (type(line).__name__, line.effective_from)
        for line in early.catalog_lines(start)
        if line.effective_from != start and type(line).__name__ in ("BudgetLine", "ExclusionLine")
    }
    assert changed == {("BudgetLine", start + 42_500), ("ExclusionLine", start + 42_500)}
    history = early.catalog_history(start)
    assert history.exclusions.ranges_at(start + 42_499) == sorted(EXCLUDED_RANGES[:2])
    assert history.exclusions.ranges_at(start + 42_500) == sorted(EXCLUDED_RANGES)
    third = list(early.daily_budgets())[2]
    assert history.budget_at(third, start + 42_499) is not None
    assert history.budget_at(third, start + 42_500) is None
    with pytest.raises(ValueError, match="changes_at_s must not be negative"):
        replace(INVALID, changes_at_s=-1)


def test_budgets_are_exhausted_and_changed_halfway(invalid_run):
    arrivals, simulator, result = invalid_run
    budgets = INVALID.daily_budgets()
    # In whole cents, or whole units of a currency without a minor unit (JPY): a budget is in the minor unit.
    steps = INVALID.budget_steps()
    assert len(budgets) == 3 and all(micros % steps[c] == 0 for c, micros in budgets.items())
    assert {steps[c] for c in budgets} >= {1_000_000}, "a JPY campaign among them, its budget in whole yen"
    halfway = INVALID.changes_at_ms(simulator.start_ms)
    history = simulator.catalog
    first, second, third = budgets
    assert history.budget_at(first, halfway) == budgets[first] * 3 // 2 // steps[first] * steps[first]
    assert history.budget_at(second, halfway) == budgets[second] // 2 // steps[second] * steps[second]
    assert history.budget_at(third, halfway) is None
    assert all(history.budget_at(c, simulator.start_ms) == micros for c, micros in budgets.items())
    days = result.counts["budgets"]
    assert set(days) == set(budgets)
    day = utc_day(simulator.start_ms)
    for campaign, micros in budgets.items():
        figures = days[campaign][day]
        assert figures["over_budget_clicks"] > 0, (campaign, figures)
        assert [b["daily_budget_micros"] for b in figures["budgets"]] == [
            micros,
            history.budget_at(campaign, halfway),
        ]
    # Never past the budget: halved, nothing more is charged; raised, up to the new budget.
    assert days[second][day]["charged_micros"] <= budgets[second]
    assert days[first][day]["charged_micros"] <= history.budget_at(first, halfway)
    charged_after = [row for row in result.billable() if row["campaign_id"] == third and row["click_time"] >= halfway]
    assert charged_after, "made unlimited, the campaign is charged again"


def test_the_invalid_traffic_is_deterministic_and_counted(invalid_run, tmp_path):
    arrivals, simulator, result = invalid_run
    assert list(Simulator(INVALID, clock).arrivals()) == arrivals
    made = result.counts["made"]
    assert made == {m.value: len(made_clicks(arrivals, m)) for m in Made}
    assert made["flood"] / made["crawler"] == pytest.approx(INVALID.flood_fraction / INVALID.crawler_fraction, rel=0.4)
    assert result.counts["arrivals"] == INVALID.events
    # The expected rate counts the invalid traffic in: a duration run sends about what it says.
    timed = replace(INVALID, events=None, duration_s=60.0)
    assert len(arrivals_of(timed)) == pytest.approx(timed.expected_arrivals(), rel=0.1)


# --- Traffic that follows the catalog as it is (the local stack's) ---------------------------------------


def test_traffic_that_follows_the_catalog_goes_to_an_ad_an_admin_created() -> None:
    """An admin creates an ad while the run goes: from then on the ad gets impressions and clicks."""
    from billing.catalog import AdChange
    from producers.simulator import CatalogFollower

    config = replace(BUSY, events=6_000, bad_fraction=0.0)
    simulator = Simulator(config, clock)
    base = simulator.catalog
    ad = next(iter(base))
    with_new = base.with_change(
        AdChange("admin-ad", NOW_MS, 500_000, ad.campaign_id, ad.advertiser_id, ad.currency), NOW_MS
    )
    created_at = simulator.start_ms + 20_000
    asked: list[int] = []

    def current() -> object:
        asked.append(1)
        return with_new if current.now >= created_at else base  # type: ignore[attr-defined]

    follower = CatalogFollower(current)  # type: ignore[arg-type]

    def ads_at(event_time: int) -> list[str]:
        current.now = event_time  # type: ignore[attr-defined]
        return list(follower(event_time))

    arrivals = list(simulator.arrivals(ads_at))
    events = [a.event for a in arrivals if a.event is not None]
    on_new = [e for e in events if e.ad_id == "admin-ad"]
    assert on_new and all(e.event_time >= created_at for e in on_new if isinstance(e, Impression))
    assert any(isinstance(e, Click) for e in on_new)
    span_s = (events[-1].event_time - events[0].event_time) / 1000
    assert len(asked) <= span_s + 2, "the catalog is read at most once a second of event time"


def test_a_run_that_follows_the_catalog_leaves_alone_what_someone_else_changed() -> None:
    from billing.catalog import AdChange, MadeBy
    from producers.capture import BudgetLine, CatalogLine, ExclusionLine
    from producers.simulator import RunEdits

    catalog = Simulator(BUSY, clock).catalog
    ads = sorted(catalog.ad_ids)
    edits = RunEdits(catalog.version)
    # The run's own change: made; and after it the ad is still the run's to change.
    own = catalog.with_change(AdChange(ads[0], NOW_MS + 1, 1_000), NOW_MS)
    assert edits.leaves_alone(catalog, CatalogLine(AdChange(ads[0], NOW_MS + 1, 1_000))) is None
    edits.made(own)
    assert edits.leaves_alone(own, CatalogLine(AdChange(ads[0], NOW_MS + 2, 2_000))) is None
    # An admin re-prices another ad meanwhile: the run leaves that ad alone from then on.
    admin = own.with_change(AdChange(ads[1], NOW_MS + 5, 9_990_000), NOW_MS)
    assert "changed by someone else" in (edits.leaves_alone(admin, CatalogLine(AdChange(ads[1], NOW_MS + 9, 1))) or "")
    assert edits.leaves_alone(admin, CatalogLine(AdChange(ads[2], NOW_MS + 9, 1))) is None
    # A budget or a range whose entry says a person made it, whenever: left alone too.
    campaign = catalog[ads[0]].campaign_id
    budgeted = admin.with_budget(campaign, NOW_MS, 5_000_000, NOW_MS, made_by=MadeBy("ada", "page"))
    assert edits.leaves_alone(budgeted, BudgetLine(campaign, NOW_MS + 9, 1_000_000))
    excluded = budgeted.with_exclusion("198.51.100.0/24", NOW_MS, True, NOW_MS, made_by=MadeBy("ada", "command"))
    assert edits.leaves_alone(excluded, ExclusionLine("198.51.100.0/24", NOW_MS + 9, False))
    assert edits.leaves_alone(excluded, ExclusionLine("203.0.113.0/24", NOW_MS + 9, True)) is None
