"""The README's tour, run as it is written: its `adbill catalog` commands change a price in the catalog's database
and show it (tests/unit/test_docs.py checks the rest of the docs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from billing.store.catalog_db import CatalogDatabase
from ops.cli import main
from tests.unit.test_docs import README, page_commands

pytestmark = pytest.mark.integration


def test_the_readmes_tour_changes_a_price_as_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], database: str
) -> None:
    for name in [k for k in os.environ if k.startswith("ADBILL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ADBILL_HOME", str(tmp_path))
    monkeypatch.setenv("ADBILL_DATABASE_URL", database)
    assert main(["catalog", "generate"]) == 0
    tour = [cmd[1:] for cmd in page_commands(README) if Path(cmd[0]).name == "adbill" and cmd[1] == "catalog"]
    assert [cmd[1] for cmd in tour] == ["set-price", "history"]
    capsys.readouterr()
    for args in tour:
        assert main(args) == 0, args
    assert "1.360000 EUR" in capsys.readouterr().out.splitlines()[-1]
    catalog = CatalogDatabase(database).current()
    assert catalog.version == 1 and catalog[tour[0][2]].prices[-1].cpc_micros == 1_360_000
