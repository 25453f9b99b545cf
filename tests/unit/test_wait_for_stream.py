"""A reconciliation run waits, a bounded while, for a live streaming job that is a few seconds behind what a period
past its horizon waits for, so the period closes in this run instead of being held to the next behind a false
alarm; a job that is down or waiting is not waited for."""

from __future__ import annotations

from pathlib import Path

from billing.reconcile_plan import StreamPosition
from billing.store.period_states import load_states
from ops.reconcile import ReconcileConfig, wait_for_stream

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
P0 = "20260101T0000Z"
NOW = T0 + 3_600_000 + 900_000 + 5_000  # five seconds past P0's horizon
END = {"clicks": {0: 500}, "impressions": {0: 1_000}}


def config(tmp_path: Path, wait_ms: int = 60_000) -> ReconcileConfig:
    (tmp_path / "ledger" / f"period={P0}" / "batch_id=3").mkdir(parents=True, exist_ok=True)
    return ReconcileConfig(data_dir=tmp_path, redis_url="redis://unused", redis_prefix="t", catch_up_wait_ms=wait_ms)


def position(clicks: int, impressions: int, silent_ms: int | None = 500, waiting: str | None = None):
    return StreamPosition(
        committed={"clicks": {0: clicks}, "impressions": {0: impressions}},
        end=END,
        silent_for_ms=silent_ms,
        waiting=waiting,
    )


def test_a_live_job_a_few_records_behind_is_waited_for_and_the_target_is_kept(tmp_path: Path) -> None:
    answers = iter([position(400, 900), position(450, 990), position(500, 1_000)])
    said: list[str] = []
    slept: list[float] = []
    final = wait_for_stream(config(tmp_path), lambda: NOW, said.append, slept.append, lambda: next(answers))
    assert final.behind(END) == 0
    assert len(slept) == 2
    assert said == [
        f"waiting up to 60 s for the streaming job to read 200 record(s) of period(s) {P0}",
        "the streaming job has read what the periods past their horizon wait for",
    ]
    # The run that follows measures against the target found here, not against Kafka's end offsets by then.
    assert load_states(tmp_path / "reconcile" / "periods.json")[P0].target_offsets == END


def test_the_wait_is_bounded(tmp_path: Path) -> None:
    said: list[str] = []
    final = wait_for_stream(
        config(tmp_path, wait_ms=0), lambda: NOW, said.append, lambda s: None, lambda: position(1, 1)
    )
    assert final.behind(END) == 1498 and said == []


def test_a_job_that_is_down_or_waits_for_disk_space_is_not_waited_for(tmp_path: Path) -> None:
    for stalled in (position(1, 1, silent_ms=600_000), position(1, 1, waiting="waiting for disk space for 3 min")):
        said: list[str] = []
        wait_for_stream(config(tmp_path), lambda: NOW, said.append, lambda s: None, lambda s=stalled: s)
        assert said == []
