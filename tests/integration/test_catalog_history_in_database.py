"""The catalog's history in its store, the database: a reader sees each change, and two writers changing one ad's
prices at once lose nothing (tests/unit/test_catalog_history.py has the history itself)."""

from __future__ import annotations

import threading

import pytest

from billing.catalog import Ad, AdChange, Catalog
from billing.store.catalog_db import CatalogDatabase

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
M = 60_000
NOW = T0 + 10 * M

BASE = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"), Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "USD")])


def test_the_store_sees_each_change_and_two_writers_lose_nothing(database: str) -> None:
    CatalogDatabase(database).start(BASE)
    reader = CatalogDatabase(database)
    assert reader.current().version == 0

    def raise_prices(offset: int) -> None:
        store = CatalogDatabase(database)
        for n in range(10):
            store.change(AdChange("ad-1", NOW + M + offset * 100 + n, n), lambda: NOW)

    writers = [threading.Thread(target=raise_prices, args=(k,)) for k in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert reader.current().version == 20
    assert len(reader.current()["ad-1"].prices) == 21
    assert [e.version for e in reader.changes()] == list(range(21))
