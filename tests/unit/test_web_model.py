"""The web UI's values: corrected figures and consumer lag from the job's progress records."""

from __future__ import annotations

import json

from billing.corrections import Correction, CorrectionKind
from billing.store.export_files import Manifest
from web.model import Billed, Figures, consumer_lag


def test_corrected_is_provisional_plus_signed_corrections() -> None:
    billed = Billed(provisional=Figures(10, 5_000_000), corrections=Figures(-1, -500_000))
    assert billed.corrected == Figures(9, 4_500_000)
    assert not billed.is_zero
    assert Billed().is_zero and Billed().corrected == Figures(0, 0)
    # A period billed only by reconciliation (every click the stream missed).
    assert Billed(corrections=Figures(2, 300_000)).corrected == Figures(2, 300_000)


def _source(topic: str, end: dict[str, int], latest: dict[str, int] | None, as_text: bool = True) -> dict[str, object]:
    def encode(offsets: dict[str, int]) -> object:
        value = {topic: offsets}
        return json.dumps(value) if as_text else value

    source: dict[str, object] = {"description": f"KafkaV2[Subscribe[{topic}]]", "end_offset": encode(end)}
    if latest is not None:
        source["latest_offset"] = encode(latest)
    return source


def test_lag_is_latest_minus_end_summed_over_partitions_per_topic() -> None:
    sources = [
        _source("clicks", {"0": 100, "1": 50}, {"0": 130, "1": 50}),  # 30 + 0
        _source("impressions", {"0": 1000, "1": 7}, {"0": 1000, "1": 19}, as_text=False),  # 0 + 12
    ]
    assert consumer_lag(sources) == {"clicks": 30, "impressions": 12}


def test_lag_is_unknown_without_latest_offsets_never_zero() -> None:
    """Records written before the job reported `latest_offset`."""
    assert consumer_lag([_source("clicks", {"0": 100}, None)]) == {"clicks": None}
    assert consumer_lag([{"description": "x", "end_offset": None}]) == {}
    assert consumer_lag([{"description": "x", "end_offset": "not json", "latest_offset": "{}"}]) == {}


def test_lag_ignores_partitions_only_one_side_reports_and_never_goes_negative() -> None:
    sources = [_source("clicks", {"0": 100, "1": 70}, {"0": 90, "2": 500})]
    assert consumer_lag(sources) == {"clicks": 0}


def test_lag_of_a_topic_read_by_two_sources_adds_up() -> None:
    sources = [_source("clicks", {"0": 1}, {"0": 4}), _source("clicks", {"1": 1}, {"1": 3})]
    assert consumer_lag(sources) == {"clicks": 5}


def test_correction_from_the_contracts_json() -> None:
    """The web UI reads the advertiser's list as reconciliation wrote it: `Correction.to_dict()` as JSON."""
    correction = Correction.from_dict(
        {
            "correction_id": "c1",
            "kind": "retraction",
            "click_id": "k1",
            "impression_id": None,
            "ad_id": "a1",
            "campaign_id": "m1",
            "advertiser_id": "adv-0000",
            "amount_micros": -250_000,
            "currency": "EUR",
            "reason": "duplicate",
            "corrects_period": "20260101T0000Z",
            "booked_period": "20260101T0100Z",
            "created_at_ms": 1,
        }
    )
    assert correction.kind == CorrectionKind.RETRACTION
    assert correction.impression_id is None and correction.amount_micros == -250_000


def test_export_from_its_manifest() -> None:
    export = Manifest.from_json(
        json.dumps(
            {
                "period": "20260101T0000Z",
                "period_start_ms": 0,
                "period_end_ms": 3_600_000,
                "closed_at_ms": 7_200_000,
                "rows": 3,
                "total_micros": 750_000,
                "files": {
                    "billing.parquet": {"bytes": 10, "sha256": "ab"},
                    "billing.csv": {"bytes": 5, "sha256": "cd"},
                },
            }
        )
    )
    assert list(export.files) == ["billing.csv", "billing.parquet"]
    assert export.total_micros == 750_000
