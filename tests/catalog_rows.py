"""Every row of the catalog's database, to prove that a refused change wrote nothing: what comparing the catalog
file's bytes before and after proved when the catalog was a file."""

from __future__ import annotations

import psycopg
from psycopg import sql


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
