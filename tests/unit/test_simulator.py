"""The traffic simulator: deterministic, bounded, shaped as configured, and right about its ground truth."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from billing.events import Click, Impression
from billing.intake import Intake, QuarantineReason
from billing.store.schema_registry import open_registry
from producers.capture import read_capture
from producers.simulator import (
    UNKNOWN_SCHEMA_ID_BASE,
    ArrivalKind,
    GroundTruth,
    LiveSchedule,
    SimulationConfig,
    Simulator,
    Timing,
    resolve_start_ms,
    simulate,
    write_capture,
    write_run,
)
from producers.wire import EventDeserializer, EventSerializer, UnknownSchemaError, WireFormatError, unframe

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NOW_MS = int(NOW.timestamp()) * 1000


def clock() -> int:
    return NOW_MS


# Busy enough that the interesting cases all happen in a small run: few users, so several impressions of one
# (ad, user) fall in one window; generous fractions of every kind of trouble.
BUSY = SimulationConfig(
    advertisers=2,
    campaigns_per_advertiser=2,
    ads_per_campaign=2,
    users=40,
    impression_rate=100.0,
    click_through_rate=0.3,
    beyond_window_fraction=0.1,
    edge_fraction=0.1,
    out_of_order_fraction=0.1,
    max_disorder_ms=3_000,
    late_fraction=0.05,
    late_min_ms=30_000,
    late_max_ms=120_000,
    duplicate_fraction=0.05,
    bad_fraction=0.03,
    seed=7,
    events=20_000,
)


def arrivals_of(config: SimulationConfig) -> list:
    return list(Simulator(config, clock).arrivals())


@pytest.fixture(scope="module")
def busy_arrivals():
    return arrivals_of(BUSY)


def run_files(config: SimulationConfig, folder) -> dict[str, bytes]:
    for _ in simulate(config, folder, clock):
        pass
    return {name: (folder / name).read_bytes() for name in ("billable.jsonl", "summary.json", "catalog.json")}


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
    share = summary["billable"]["clicks"] / summary["primary"]["click"]
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
    gaps = Counter(
        row["click_time"] - row["impression_time"]
        for row in map(json.loads, (tmp_path / "billable.jsonl").read_text().splitlines())
    )
    assert gaps[0] > 0  # a click at the very millisecond of its impression
    assert gaps[10_000] > 0  # a click exactly 10 s after it
    assert max(gaps) == 10_000


# --- Ground truth --------------------------------------------------------------------------------------


def brute_force_billable(arrivals, catalog) -> dict[str, tuple[str, int]]:
    """The DOMAIN.md rule, written plainly: click_id -> (impression_id, micros)."""
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
    for _ in simulate(BUSY, tmp_path, clock):
        pass
    rows = [json.loads(line) for line in (tmp_path / "billable.jsonl").read_text().splitlines()]
    expected = brute_force_billable(busy_arrivals, BUSY.catalog())
    assert [row["click_id"] for row in rows] == sorted(expected)
    assert {row["click_id"]: (row["impression_id"], row["amount_micros"]) for row in rows} == expected
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["billable"]["clicks"] == len(expected)
    catalog = BUSY.catalog()
    assert len({ad.currency for ad in catalog}) > 1, "the run's advertisers bill in several currencies"
    by_currency: Counter[str] = Counter()
    for row in rows:
        by_currency[catalog[row["ad_id"]].currency] += expected[row["click_id"]][1]
        assert row["currency"] == catalog[row["ad_id"]].currency
    assert summary["billable"]["total_micros_by_currency"] == dict(sorted(by_currency.items()))
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
        files[partitions] = [(folder / n).read_bytes() for n in ("billable.jsonl", "summary.json")]
        assert not any((tmp_path / f"work-{partitions}").iterdir())  # the spill files are gone
    assert files[1] == files[5]


def test_capture_of_a_run_reads_back(tmp_path, busy_arrivals):
    path = tmp_path / "capture.jsonl"
    assert write_capture(busy_arrivals, path) == len(busy_arrivals)
    items = list(read_capture(path))
    # Raw records lose their key in a capture (the format has none); everything else is as sent.
    assert items == [a.item if a.raw is None else replace(a.raw, key=None) for a in busy_arrivals]
