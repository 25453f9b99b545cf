"""Every row of the catalog's database, to prove that a refused change wrote nothing: what comparing the catalog
file's bytes before and after proved when the catalog was a file; and the commands' surroundings (`command_home`)."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from billing.catalog import Catalog
from billing.store.catalog_db import CatalogDatabase


def command_home(folder: Path, monkeypatch: pytest.MonkeyPatch, database: str, catalog: Catalog) -> Path:
    """`folder` as the data folder of the commands a test runs, with no other `ADBILL_*` setting, and their
    database (a test's own) holding `catalog`."""
    for name in [k for k in os.environ if k.startswith("ADBILL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ADBILL_HOME", str(folder))
    monkeypatch.setenv("ADBILL_DATABASE_URL", database)
    CatalogDatabase(database).start(catalog)
    return folder


def catalog_rows(url: str) -> dict[str, list[str]]:
    """Each table of the database at `url` with its rows (as JSON text, sorted)."""
    with psycopg.connect(url) as connection:
        tables = [
            row[0]
            for row in connection.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
        ]
        return {
            table: sorted(
                row[0]
                for row in connection.execute(
                    sql.SQL("SELECT row_to_json(t)::text FROM {} t").format(sql.Identifier(table))
                )
            )
            for table in tables
        }
