"""Where the streaming job writes a batch's files, from the settings (`ADBILL_SINK_WRITERS`)."""

from __future__ import annotations

import pytest

from ops.settings import Settings


def test_auto_writes_on_the_driver_in_local_mode_and_on_the_executors_of_a_cluster() -> None:
    assert Settings.from_env({"ADBILL_SPARK_MASTER": "local[2]"}).writes_on_executors is False
    assert Settings.from_env({"ADBILL_SPARK_MASTER": "spark://10.0.0.5:7077"}).writes_on_executors is True


def test_a_chosen_place_holds_whatever_the_master() -> None:
    local = {"ADBILL_SPARK_MASTER": "local[2]"}
    assert Settings.from_env({**local, "ADBILL_SINK_WRITERS": "executors"}).writes_on_executors is True
    cluster = {"ADBILL_SPARK_MASTER": "spark://10.0.0.5:7077"}
    assert Settings.from_env({**cluster, "ADBILL_SINK_WRITERS": "driver"}).writes_on_executors is False


def test_an_unknown_place_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="auto, executors or driver"):
        Settings.from_env({"ADBILL_SINK_WRITERS": "workers"})
