"""PostgreSQL as the project starts it (`ops.postgres_service`, Debian's server on a loopback port): what the shared
records will rely on holds on the real server: a transaction is all or nothing, one constraint refuses a second
writer's conflicting row, an advisory lock is held by one session at a time, and a committed row survives a restart,
however the server was stopped."""

from __future__ import annotations

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from ops.postgres_service import LocalPostgres

pytestmark = pytest.mark.integration


def test_a_transaction_is_all_or_nothing_and_a_constraint_refuses_a_second_writer(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as setup:
        setup.execute("CREATE TABLE invoice_numbers (year int, number int, PRIMARY KEY (year, number))")
    with pytest.raises(psycopg.errors.UniqueViolation), psycopg.connect(database) as one, one.transaction():
        one.execute("INSERT INTO invoice_numbers VALUES (2026, 1)")
        one.execute("INSERT INTO invoice_numbers VALUES (2026, 1)")  # the same number twice: nothing stands
    with psycopg.connect(database) as read:
        assert read.execute("SELECT count(*) FROM invoice_numbers").fetchone() == (0,)


def test_an_advisory_lock_is_held_by_one_session_at_a_time_and_freed_when_it_ends(database: str) -> None:
    """The database's own lock, as two hosts' jobs would take it: the second is refused while the first holds it."""
    with (
        ConnectionPool(database, min_size=2, max_size=2, open=True) as pool,
        pool.connection() as first,
        pool.connection() as second,
    ):
        assert first.execute("SELECT pg_try_advisory_lock(42)").fetchone() == (True,)
        assert second.execute("SELECT pg_try_advisory_lock(42)").fetchone() == (False,)
        first.execute("SELECT pg_advisory_unlock(42)")
        assert second.execute("SELECT pg_try_advisory_lock(42)").fetchone() == (True,)


@pytest.mark.parametrize("immediate", [False, True], ids=["fast-shutdown", "immediate-shutdown"])
def test_a_committed_row_survives_a_restart(postgres_server: LocalPostgres, database: str, immediate: bool) -> None:
    """After a fast shutdown (the product's stop), and after an immediate one (no shutdown checkpoint: the tests'
    session ends so), from which the next start recovers the row from the WAL."""
    with psycopg.connect(database, autocommit=True) as connection:
        connection.execute("CREATE TABLE kept (id int PRIMARY KEY)")
        connection.execute("INSERT INTO kept VALUES (7)")
    postgres_server.stop(immediate=immediate)
    assert not postgres_server.ready()
    assert postgres_server.start() is True  # the same cluster folder: no new initdb
    with psycopg.connect(database) as connection:
        assert connection.execute("SELECT id FROM kept").fetchall() == [(7,)]
