"""`adbill catalog`: create an ad, set, pause and resume its price, show its history; each refusal is one line on
stderr and a non-zero exit, and changes nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from billing.catalog import Ad, Catalog, Unbillable
from billing.store.catalog_file import load_catalog, save_catalog
from ops.cli import main

BASE = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"), Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "USD")])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [k for k in __import__("os").environ if k.startswith("ADBILL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ADBILL_HOME", str(tmp_path))
    save_catalog(BASE, tmp_path / "catalog.json")
    return tmp_path


def test_the_commands_change_the_history_and_show_it(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    soon = int(time.time() * 1000) + 3_600_000
    assert main(["catalog", "create-ad", "ad-9", "--campaign", "cmp-1", "--advertiser", "adv-1", "--currency", "EUR",
                 "--cpc-micros", "70000"]) == 0  # fmt: skip
    assert main(["catalog", "set-price", "ad-1", "--cpc-micros", "1250000", "--at", str(soon)]) == 0
    assert main(["catalog", "pause", "ad-2"]) == 0
    assert main(["catalog", "resume", "ad-2", "--at", str(soon)]) == 0
    catalog = load_catalog(home / "catalog.json")
    assert catalog.version == 4
    assert catalog.price("ad-1", soon - 1)[1] == 250_000  # type: ignore[index]
    assert catalog.price("ad-1", soon)[1] == 1_250_000  # type: ignore[index]
    assert catalog.price("ad-2", soon - 1) == Unbillable.AD_PAUSED
    assert catalog.price("ad-2", soon)[1] == 1_000_000  # type: ignore[index]
    assert catalog.price("ad-9", soon)[1] == 70_000  # type: ignore[index]
    capsys.readouterr()
    assert main(["catalog", "history", "ad-1"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].split("\t") == ["ad-1", "campaign cmp-1", "advertiser adv-1", "EUR"]
    assert shown[1] == "from the beginning: 0.250000 EUR (version 0)"
    assert shown[2].endswith(": 1.250000 EUR (version 2)")
    assert main(["catalog", "show"]) == 0
    assert "ad-2\tcmp-2\tadv-2\tpaused" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["set-price", "ad-1", "--cpc-micros", "5", "--at", "2020-01-01T00:00Z"], "is in the past"),
        (["set-price", "ad-1", "--cpc-micros=-5"], "must not be negative"),
        (["set-price", "ad-1", "--cpc-micros", "0.25"], "whole number of micros"),
        (["set-price", "ad-1", "--cpc-micros", "5", "--advertiser", "adv-2"], "never change"),
        (["set-price", "ad-1", "--cpc-micros", "5", "--campaign", "cmp-2"], "never change"),
        (["set-price", "ad-1", "--cpc-micros", "5", "--currency", "USD"], "never change"),
        (["set-price", "ad-nope", "--cpc-micros", "5"], "unknown ad ad-nope"),
        (["pause", "ad-nope"], "unknown ad ad-nope"),
        (["history", "ad-nope"], "unknown ad ad-nope"),
        (["create-ad", "ad-9", "--campaign", "cmp-2", "--advertiser", "adv-1", "--currency", "EUR",
          "--cpc-micros", "5"], "campaign cmp-2 belongs to advertiser adv-2"),
        (["create-ad", "ad-1", "--campaign", "cmp-1", "--advertiser", "adv-1", "--currency", "EUR",
          "--cpc-micros", "5"], "exists already"),
        (["set-price"], "needs the ad's id"),
    ],
)  # fmt: skip
def test_refusals_are_one_line_and_change_nothing(
    home: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    before = (home / "catalog.json").read_bytes()
    assert main(["catalog", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("adbill catalog: error: ")
    assert (home / "catalog.json").read_bytes() == before
