"""A capture's changes of the catalog (prices, budgets, the IP exclusion list) made in the catalog's database as
back-fills, each at its own time, through the door `adbill replay` uses (`producers.publisher.apply_to_store`);
a refused one writes nothing (tests/unit/test_capture.py reads the captures)."""

from __future__ import annotations

import pytest

from billing.catalog import Ad, AdChange, Catalog, CatalogError
from billing.store.catalog_db import CatalogDatabase
from producers.capture import BudgetLine, CatalogLine, ExclusionLine
from producers.publisher import apply_to_store
from tests.catalog_rows import catalog_rows

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def test_a_change_is_made_in_the_catalogs_store_as_a_back_fill(database: str) -> None:
    store = CatalogDatabase(database)
    store.start(Catalog([Ad("a1", "c1", "adv1", 100_000, "EUR")]))
    later = T0 + 86_400_000  # "now": every line below is in its past
    apply_to_store(store, BudgetLine("c1", T0, 5_000_000), later)
    apply_to_store(store, ExclusionLine("198.51.100.0/24", T0, True), later)
    catalog = apply_to_store(store, CatalogLine(AdChange("a1", T0 + 1, 200_000)), later)
    assert CatalogDatabase(database).current() == catalog
    assert catalog.budget_at("c1", T0) == 5_000_000 and catalog.budget_at("c1", T0 - 1) is None
    assert catalog.exclusions.excluding("198.51.100.9", T0) == "198.51.100.0/24"
    assert catalog.price("a1", T0 + 1)[1] == 200_000  # type: ignore[index]
    assert catalog.version == 3
    made = store.changes()[1:]
    assert [(e.kind, e.backfill, e.made_at) for e in made] == [
        ("set-budget", True, later),
        ("exclude-ip", True, later),
        ("set-price", True, later),
    ]
    before = catalog_rows(database)
    with pytest.raises(CatalogError, match="already excluded"):
        apply_to_store(store, ExclusionLine("198.51.100.0/24", T0 + 5, True), later)
    with pytest.raises(CatalogError, match="unknown campaign"):
        apply_to_store(store, BudgetLine("c9", T0, 1), later)
    assert CatalogDatabase(database).current() == catalog, "a refused change writes nothing"
    assert catalog_rows(database) == before
