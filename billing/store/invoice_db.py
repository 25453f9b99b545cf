"""The monthly invoices in PostgreSQL: their numbers, documents and each month's plan, shared by reconciliation,
`adbill invoices` and the web UI on any host (`billing.invoices.InvoiceBook`).

Tables (docs/catalog-database.md, "Invoices"):
- `invoice_months`: a month's plan (`billing.invoices.MonthPlan`: the exports it covers and its advertisers), written
  before its first invoice and never changed, and whether its invoices are all issued;
- `invoices`: one row per invoice, its `number` the key, one per `(month, advertiser_id)`, with its document
  (`Invoice.to_json`, the text its file holds). The table's trigger refuses a number that does not follow one
  issued (numbers run 1, 2, 3, ... with no gap) and any change or removal of a row (an issued invoice never
  changes): the database checks both where the issue commits, whoever writes.

**Issuing.** `lock()` is one transaction that first takes the invoices' advisory lock (`pg_advisory_xact_lock`): one
issuer at a time on any host, the second waits for the first to commit and then finds the month issued. Under it
the issuer (`billing.invoices.Issuer.issue_month`) reads the highest number, writes the month's plan, each invoice with
the next number and the month's mark; all of it commits together when the block ends, or none of it.

**The files.** Finance reads each invoice as a file, `ROOT/invoices/MONTH/ADVERTISER.json` (read-only, as before).
A file is written from its row only once the row is committed, right after the commit; a missing file is written
again from its row by the next issuer (every reconciliation run, `adbill invoices issue`: `write_files`). So:
- a crash (or a lost connection) before the commit leaves no number used and no file: the next issuer issues the
  month with the same numbers;
- a crash after the commit and before the files leaves the numbers used once, in the database, and the files
  missing until the next issuer writes them from the rows; a commit whose answer was lost is either of the two;
- a file is never written for a number that is not committed, and never rewritten (one that is there is left).
The database is the record; the pages and `adbill invoices list/show` read it, not the files.

**A data folder written before the database** (`register.json`, a plan and an `issued` mark per month beside the
invoice files, `billing.store.invoice_files`) is taken in the first time the store opens a database that holds no
invoice: every plan, mark and invoice as written (its document byte for byte, its number kept), in one transaction;
then the register, plans and marks are renamed `NAME.imported` and the lock file removed. A month an earlier issuer
stopped half-way is completed by the next issuer from its plan, with the next numbers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from billing.invoices import Invoice, MonthPlan, parse_month
from billing.layout import DataLayout
from billing.store import database
from billing.store.database import CONNECT_TIMEOUT_S, constraint_message, integrity_errors, without_password
from billing.store.database_lock import lock_key
from billing.store.invoice_files import (
    InvoiceStoreError,
    invoice_files_of,
    invoice_path,
    read_earlier,
    taken_in,
    write_invoice_file,
)

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS invoice_months (
    month text PRIMARY KEY CHECK (month ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    plan jsonb NOT NULL,
    issued boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS invoices (
    number bigint PRIMARY KEY CHECK (number > 0),
    month text NOT NULL REFERENCES invoice_months,
    advertiser_id text NOT NULL CHECK (advertiser_id <> ''),
    document text NOT NULL,
    UNIQUE (month, advertiser_id)
);
CREATE OR REPLACE FUNCTION invoices_follow_and_never_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION USING ERRCODE = 'integrity_constraint_violation',
            MESSAGE = format('invoice %s is issued: an issued invoice never changes', OLD.number);
    END IF;
    IF NEW.number > 1 AND NOT EXISTS (SELECT 1 FROM invoices WHERE number = NEW.number - 1) THEN
        RAISE EXCEPTION USING ERRCODE = 'integrity_constraint_violation',
            MESSAGE = format('invoice number %s does not follow one issued: the numbers have no gap', NEW.number);
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER invoices_follow_and_never_change BEFORE INSERT OR UPDATE OR DELETE ON invoices
    FOR EACH ROW EXECUTE FUNCTION invoices_follow_and_never_change();
"""
"""The invoices' tables (made when missing, `billing.store.database.make_tables`)."""

INVOICES_LOCK = lock_key("invoices")
"""The advisory lock one issuer holds, on any host, for the time of its transaction."""


class InvoiceDatabaseUnavailable(database.DatabaseUnavailable, InvoiceStoreError):
    """The invoices' database cannot be reached: the message names it (without its password); nothing is issued."""


class InvoiceDatabase:
    """`billing.invoices.InvoiceBook` in the database at `url`, the documents written as files into
    `layout.invoices` (and an earlier release's files there taken in); `crash` is called with a step's name before
    it (`plan`, `invoice`, `issued`, `commit`, `file`: tests make a step fail there, as a crash would)."""

    def __init__(self, url: str, layout: DataLayout, crash: Callable[[str], None] | None = None) -> None:
        self.url = url
        self.folder = layout.invoices
        self._crash = crash or (lambda step: None)
        self._local = threading.local()
        """The issuer's transaction (`lock`), on the thread that holds it."""

    def __repr__(self) -> str:
        return f"InvoiceDatabase({without_password(self.url)!r})"

    # Reading ---------------------------------------------------------------------------------------------------
    def months(self) -> list[str]:
        """Months with a plan (and so, their invoices), oldest first."""
        return [row[0] for row in self._rows("SELECT month FROM invoice_months ORDER BY month")]

    def issued_months(self) -> list[str]:
        return [row[0] for row in self._rows("SELECT month FROM invoice_months WHERE issued ORDER BY month")]

    def plan(self, month: str) -> MonthPlan | None:
        rows = self._rows("SELECT plan::text FROM invoice_months WHERE month = %s", (parse_month(month),))
        return MonthPlan.from_json(rows[0][0]) if rows else None

    def planned_periods(self) -> set[str]:
        rows = self._rows("SELECT DISTINCT jsonb_array_elements_text(plan -> 'periods') FROM invoice_months")
        return {row[0] for row in rows}

    def has(self, month: str, advertiser_id: str) -> bool:
        query = "SELECT 1 FROM invoices WHERE month = %s AND advertiser_id = %s"
        return bool(self._rows(query, (parse_month(month), advertiser_id)))

    def invoice(self, month: str, advertiser_id: str) -> Invoice | None:
        """The advertiser's invoice of the month, or None."""
        query = "SELECT document FROM invoices WHERE month = %s AND advertiser_id = %s"
        rows = self._rows(query, (parse_month(month), advertiser_id))
        return Invoice.from_json(rows[0][0]) if rows else None

    def invoices_of(self, advertiser_id: str) -> list[Invoice]:
        """Every invoice of the advertiser, newest month first."""
        query = "SELECT document FROM invoices WHERE advertiser_id = %s ORDER BY month DESC"
        return [Invoice.from_json(row[0]) for row in self._rows(query, (advertiser_id,))]

    def invoices_in(self, month: str) -> list[Invoice]:
        """Every invoice of the month, by number."""
        query = "SELECT document FROM invoices WHERE month = %s ORDER BY number"
        return [Invoice.from_json(row[0]) for row in self._rows(query, (parse_month(month),))]

    def numbers(self) -> dict[int, tuple[str, str]]:
        """Number -> (month, advertiser) of every invoice issued."""
        rows = self._rows("SELECT number, month, advertiser_id FROM invoices ORDER BY number")
        return {int(number): (month, advertiser_id) for number, month, advertiser_id in rows}

    def last_number(self) -> int:
        """The highest number issued (0 before the first): the next issuer's is one more."""
        return int(self._rows("SELECT coalesce(max(number), 0) FROM invoices")[0][0])

    # Issuing ---------------------------------------------------------------------------------------------------
    @contextmanager
    def lock(self) -> Iterator[None]:
        """One issuer at a time on any host: a transaction that holds the invoices' advisory lock. What the block
        writes commits when it ends, or none of it; then the files of the invoices committed are written."""
        if getattr(self._local, "transaction", None) is not None:
            raise RuntimeError("the invoices' lock is held by this thread already")
        with self._connection() as connection:
            try:
                with connection.transaction():
                    connection.execute("SELECT pg_advisory_xact_lock(%s)", (INVOICES_LOCK,))
                    self._local.transaction = connection
                    try:
                        yield
                        self._crash("commit")
                    finally:
                        self._local.transaction = None
            except integrity_errors() as exc:
                raise InvoiceStoreError(f"the database refused the invoices: {constraint_message(exc)}") from None
        self.write_files()

    def write_plan(self, plan: MonthPlan) -> None:
        self._crash("plan")
        self._execute("INSERT INTO invoice_months (month, plan) VALUES (%s, %s::jsonb)", (plan.month, plan.to_json()))

    def write(self, invoice: Invoice) -> None:
        """Keep an invoice; its number is issued when the issuer's transaction commits (`lock`). InvoiceStoreError
        when its number or its month and advertiser are issued already."""
        invoice_path(self.folder, invoice.month, invoice.advertiser_id)  # an advertiser id that names a file
        self._crash("invoice")
        try:
            self._execute(
                "INSERT INTO invoices (number, month, advertiser_id, document) VALUES (%s, %s, %s, %s)",
                (invoice.number, invoice.month, invoice.advertiser_id, invoice.to_json()),
            )
        except integrity_errors() as exc:
            raise InvoiceStoreError(
                f"{invoice.label} of {invoice.month} for {invoice.advertiser_id} is refused: an invoice is issued "
                f"once ({constraint_message(exc)})"
            ) from None

    def mark_issued(self, month: str) -> None:
        self._crash("issued")
        self._execute("UPDATE invoice_months SET issued = true WHERE month = %s", (parse_month(month),))

    def write_files(self) -> list[str]:
        """Write the file of every invoice committed that has none (the issuer that committed it stopped before it
        wrote it, or the file was removed), from its row; the files written, as MONTH/ADVERTISER."""
        counts = self._rows("SELECT month, count(*) FROM invoices GROUP BY month ORDER BY month")
        written = []
        for month, count in counts:
            present = invoice_files_of(self.folder, month)
            if len(present) >= count:
                continue
            rows = self._rows("SELECT advertiser_id, document FROM invoices WHERE month = %s", (month,))
            for advertiser_id, document in rows:
                if advertiser_id not in present:
                    write_invoice_file(self.folder, month, advertiser_id, document, self._crash)
                    written.append(f"{month}/{advertiser_id}")
        return written

    # Pieces ----------------------------------------------------------------------------------------------------
    def _rows(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._connection() as connection:
            return connection.execute(query, params).fetchall()

    def _execute(self, query: str, params: tuple[Any, ...]) -> None:
        with self._connection() as connection:
            connection.execute(query, params)

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """The issuer's transaction on the thread that holds the lock; otherwise a connection from the process's
        pool, the tables made and a data folder's earlier files taken in first."""
        held = getattr(self._local, "transaction", None)
        if held is not None:
            yield held
            return
        tables = database.Tables(f"invoices:{self.folder}", SCHEMA, self._take_in)
        try:
            with database.connection(self.url, tables, "invoices' database", CONNECT_TIMEOUT_S) as connection:
                yield connection
        except database.DatabaseUnavailable as exc:
            raise InvoiceDatabaseUnavailable(str(exc)) from None

    def _take_in(self, connection: psycopg.Connection[Any]) -> list[Path]:
        """Take in the invoices an earlier release kept in the data folder, when the database holds none (once,
        under the lock of `database.make_tables`, which sets the register, plans and marks aside once this
        commits)."""
        if connection.execute("SELECT 1 FROM invoice_months LIMIT 1").fetchone() is not None:
            return []
        earlier = read_earlier(self.folder)
        if earlier is None:
            return []
        for month, plan in sorted(earlier.plans.items()):
            connection.execute(
                "INSERT INTO invoice_months (month, plan, issued) VALUES (%s, %s::jsonb, %s)",
                (month, plan.to_json(), month in earlier.issued),
            )
        try:
            for number, (invoice, document) in sorted(earlier.documents.items()):
                connection.execute(
                    "INSERT INTO invoices (number, month, advertiser_id, document) VALUES (%s, %s, %s, %s)",
                    (number, invoice.month, invoice.advertiser_id, document),
                )
        except integrity_errors() as exc:
            raise InvoiceStoreError(
                f"the invoices in {self.folder} cannot be taken into {without_password(self.url)}: "
                f"{constraint_message(exc)}"
            ) from None
        aside = taken_in(self.folder)
        log.warning(
            "took the invoices of %s (%d months, %d invoices, numbers 1 to %d) into %s; the register, plans and "
            "marks are set aside as NAME.imported",
            self.folder,
            len(earlier.plans),
            len(earlier.documents),
            max(earlier.documents, default=0),
            without_password(self.url),
        )
        return aside
