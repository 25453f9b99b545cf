"""The examples of reading an export in docs/finance.md, run as they are written: pandas, DuckDB and Spark, each on
a real export written by `billing.store.export_files.write_export`, each printing every advertiser's net micros per
currency."""

from __future__ import annotations

import contextlib
import io
import re
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from billing.export import build_export
from billing.store.export_files import export_folder, export_table, write_export
from ops.settings import PROJECT_ROOT
from tests.unit.test_export import CLOSED_AT, END, PERIOD, START, scenario

pytestmark = pytest.mark.integration

PAGE = PROJECT_ROOT / "docs" / "finance.md"
PAGE_FOLDER = 'folder = "var/exports/20260101T0100Z"'


def page_examples() -> dict[str, str]:
    """The python blocks of the page's "Reading an export", by the library each imports first."""
    page = PAGE.read_text()
    section = page.split("\n## Reading an export\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    return {re.match(r"(?:import|from) (\w+)", block).group(1): block for block in blocks}  # type: ignore[union-attr]


def test_the_page_has_one_example_each_for_pandas_duckdb_and_spark() -> None:
    examples = page_examples()
    assert sorted(examples) == ["duckdb", "pandas", "pyspark"]
    assert all(PAGE_FOLDER in block for block in examples.values())


@pytest.mark.parametrize("library", ["pandas", "duckdb", "pyspark"])
def test_an_example_of_the_page_reads_the_export_and_prints_each_advertisers_net_micros(
    tmp_path: Path, spark: SparkSession, library: str
) -> None:
    """`spark` is the session's own: the Spark example's getOrCreate finds it instead of starting another JVM."""
    table = export_table(build_export(PERIOD, *scenario()))
    write_export(tmp_path, PERIOD, table, START, END, CLOSED_AT)
    expected: Counter[tuple[str, str]] = Counter()
    for row in table.to_pylist():
        expected[(row["advertiser_id"], row["currency"])] += row["net_micros"]
    assert len(expected) >= 2

    code = page_examples()[library].replace(PAGE_FOLDER, f'folder = "{export_folder(tmp_path, PERIOD)}"')
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"docs/finance.md ({library} example)", "exec"), {})  # noqa: S102 - the page's own code
    lines = printed.getvalue().splitlines()
    for (advertiser, currency), net in expected.items():
        row = [line for line in lines if advertiser in line and currency in line]
        assert len(row) == 1 and re.search(rf"(?<![\d-]){net}(?!\d)", row[0]), (advertiser, currency, net, lines)
