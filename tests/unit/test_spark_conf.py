"""Further Spark settings an operator passes to every session (`ADBILL_SPARK_CONF`)."""

from __future__ import annotations

import pytest

from ops.settings import Settings, spark_conf_pairs


def test_pairs_are_split_on_spaces_and_on_the_first_equals_sign() -> None:
    text = " spark.a.b=1\tspark.sql.x=k=v\n"
    assert spark_conf_pairs(text) == {"spark.a.b": "1", "spark.sql.x": "k=v"}
    assert spark_conf_pairs("") == {}


@pytest.mark.parametrize("text", ["spark.a", "a.b=1", "spark.a=", "=1"])
def test_a_pair_that_is_not_a_spark_setting_is_refused_when_the_settings_are_read(text: str) -> None:
    with pytest.raises(ValueError, match="ADBILL_SPARK_CONF.*spark.NAME=VALUE"):
        Settings.from_env({"ADBILL_SPARK_CONF": text})
