"""Simulated traffic small enough for a unit test and busy enough that every kind of trouble of the join and of
timing happens in it: few users for the rate, so several impressions of one (ad, user) fall in one window, and
generous fractions of impressions beyond the window and at its edge, out-of-order, late, duplicate and bad records.
Enough users that none makes a click flood (about 3 clicks a minute each): the invalid traffic rules are other tests'
subject (users this few still click one ad twice within 30 s often)."""

from __future__ import annotations

from producers.simulator import SimulationConfig

TROUBLED = SimulationConfig(
    advertisers=2,
    campaigns_per_advertiser=2,
    ads_per_campaign=2,
    users=600,
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
    bad_fraction=0.05,
    events=8_000,
)
