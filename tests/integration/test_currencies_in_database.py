"""An advertiser bills in one currency (docs/billing-rules.md): a catalog file written before the database that breaks
the rule is not taken in; the command that opens the database says why in one line, naming the advertisers, and
leaves the file where it is and the database without a catalog (tests/unit/test_currencies.py has the rest)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ops.cli import main
from tests.catalog_rows import catalog_rows
from tests.unit.test_currencies import mixed_catalog_file

pytestmark = pytest.mark.integration


def test_a_catalog_file_that_breaks_the_rule_is_not_taken_in_and_the_command_names_the_advertisers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], database: str
) -> None:
    path = tmp_path / "catalog.json"
    mixed_catalog_file(path)
    written = path.read_bytes()
    for name in [k for k in os.environ if k.startswith("ADBILL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ADBILL_HOME", str(tmp_path))
    monkeypatch.setenv("ADBILL_DATABASE_URL", database)
    assert main(["catalog", "show"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("adbill catalog: error: ") and err.count("\n") == 1 and "adv-1 (EUR: ad-1; JPY: ad-9)" in err
    assert "an advertiser and a campaign of their own" in err  # the way out
    assert path.read_bytes() == written, "the file stays where it is, as it was"
    assert not (tmp_path / "catalog.json.imported").exists()
    assert all(rows == [] for rows in catalog_rows(database).values()), "the database holds no catalog"
