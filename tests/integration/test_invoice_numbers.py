"""Invoice numbers in PostgreSQL (`billing.store.invoice_db`), on the real server: gap-free and each issued once
across a crash at any step and two issuers at once in two processes, an issued invoice that never changes (the
database refuses it), its file written from the database, and a data folder of an earlier release taken in once."""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from billing.invoices import (
    CHARGES,
    CorrectionFigures,
    ExportFigures,
    Invoice,
    InvoiceError,
    Issuer,
    MonthPlan,
    PeriodClosing,
)
from billing.layout import DataLayout
from billing.periods import Periods
from billing.profiles import BillingProfile, BillingProfiles
from billing.reconcile_plan import PeriodState
from billing.store.invoice_db import InvoiceDatabase
from billing.store.invoice_files import InvoiceStoreError

pytestmark = pytest.mark.integration

FEB = 1_769_904_000_000  # 2026-02-01T00:00Z
HOUR = 3_600_000
HORIZON = 900_000
ADVERTISERS = [f"adv-{n}" for n in range(5)]


class FakeSource:
    """Exports of a few periods: every advertiser of `advertisers` has a click row in each."""

    def __init__(self, periods: Sequence[str], advertisers: Sequence[str]) -> None:
        self.periods, self.advertisers = list(periods), list(advertisers)

    def exported(self) -> list[str]:
        return sorted(self.periods)

    def figures(self, periods: Sequence[str]) -> list[ExportFigures]:
        return [
            ExportFigures(a, "cmp-" + a, "EUR", "click", "billed", None, p, p, 1, 1_000_000)
            for p in periods
            for a in self.advertisers
        ]

    def corrections(self, periods: Sequence[str]) -> list[CorrectionFigures]:
        return []


class Crash(Exception):
    pass


def closed(at: int = FEB + HORIZON) -> PeriodState:
    return PeriodState(version=1, closed_at_ms=at)


def files_of(root: Path) -> dict[int, tuple[str, str]]:
    """Number -> (month, advertiser) of every invoice file; no hidden (staging) file is left."""
    folder = root / "invoices"
    assert not [p for p in folder.rglob(".*") if p.is_file()], "no staging file is left"
    found = {}
    for path in folder.glob("*/*.json"):
        found[Invoice.from_json(path.read_text()).number] = (path.parent.name, path.stem)
    return found


@pytest.mark.parametrize(
    ("step", "at"),
    [
        ("plan", 1),  # before the month's plan
        ("invoice", 1),  # before the first invoice
        ("invoice", 3),  # before the third: two written, not committed
        ("issued", 1),  # every invoice written, the month not marked issued
        ("commit", 1),  # everything written, not committed
        ("file", 1),  # committed, before the first file's rename
        ("file", 3),  # committed, two files written
    ],
)
def test_a_crash_at_any_step_leaves_no_gap_and_no_duplicate(tmp_path: Path, database: str, step: str, at: int) -> None:
    """The issuer dies at the `at`-th time it reaches `step`; the next issuer issues the month (before the commit)
    or writes the files from the database (after it), and the numbers run 1..N, each invoice once, in the database
    and in the files alike."""
    layout = DataLayout(tmp_path)
    source = FakeSource(["20260105T1000Z", "20260120T0000Z"], ADVERTISERS)
    reached = {"n": 0}

    def crash(name: str) -> None:
        if name == step:
            reached["n"] += 1
            if reached["n"] == at:
                raise Crash(name)

    with pytest.raises(Crash):
        Issuer(InvoiceDatabase(database, layout, crash), source, BillingProfiles(), lambda: FEB + HOUR).issue_month(
            "2026-01"
        )
    book = InvoiceDatabase(database, layout)
    committed = step == "file"
    assert sorted(book.numbers()) == (list(range(1, len(ADVERTISERS) + 1)) if committed else [])
    assert len(files_of(tmp_path)) == (at - 1 if committed else 0), "a file only for a number committed"
    again = Issuer(book, source, BillingProfiles(), lambda: FEB + 2 * HOUR).issue_month("2026-01")
    assert len(again) == (0 if committed else len(ADVERTISERS))
    numbers = book.numbers()
    assert sorted(numbers) == list(range(1, len(ADVERTISERS) + 1))
    assert sorted(numbers.values()) == [("2026-01", a) for a in ADVERTISERS]
    assert files_of(tmp_path) == numbers, "every invoice's file, written from the database"
    assert book.issued_months() == ["2026-01"] and book.last_number() == len(ADVERTISERS)
    for invoice in book.invoices_in("2026-01"):
        path = tmp_path / "invoices" / "2026-01" / f"{invoice.advertiser_id}.json"
        assert path.read_text() == invoice.to_json()
    # February continues the sequence.
    source.periods.append("20260203T0000Z")
    Issuer(book, source, BillingProfiles(), lambda: FEB + 40 * 24 * HOUR).issue_month("2026-02")
    assert sorted(book.numbers()) == list(range(1, 2 * len(ADVERTISERS) + 1)) == sorted(files_of(tmp_path))


def _issue_in_process(url: str, root: str, start: int) -> int:
    source = FakeSource(["20260105T1000Z"], [f"adv-{n:03d}" for n in range(40)])
    book = InvoiceDatabase(url, DataLayout(Path(root)))
    return len(Issuer(book, source, BillingProfiles(), lambda: FEB + start).issue_month("2026-01"))


def test_two_issuers_at_once_issue_each_invoice_once_with_consecutive_numbers(tmp_path: Path, database: str) -> None:
    """Two processes, each with a data folder of its own (two hosts), issue the same month at once."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        made = pool.starmap(_issue_in_process, [(database, str(tmp_path / "a"), 1), (database, str(tmp_path / "b"), 2)])
    assert sorted(made) == [0, 40], "one issued them all, the other found them issued"
    numbers = InvoiceDatabase(database, DataLayout(tmp_path / "a")).numbers()
    assert sorted(numbers) == list(range(1, 41))
    assert sorted(a for _, a in numbers.values()) == [f"adv-{n:03d}" for n in range(40)]


def test_an_issued_invoice_never_changes(tmp_path: Path, database: str) -> None:
    layout = DataLayout(tmp_path)
    book = InvoiceDatabase(database, layout)
    source = FakeSource(["20260105T1000Z"], ["adv-1"])
    profiles = BillingProfiles([BillingProfile("adv-1", "Acme", "Paris", "FR1", "20", 0, 1)], 1)
    first = Issuer(book, source, profiles, lambda: FEB + HOUR).issue_month("2026-01")
    path = tmp_path / "invoices" / "2026-01" / "adv-1.json"
    kept = path.read_bytes()
    assert not os.access(path, os.W_OK) or os.geteuid() == 0, "the file is read-only"
    # New data for January's period, a new profile, an issue again: nothing is re-issued or rewritten.
    source.advertisers.append("adv-2")
    changed = BillingProfiles([BillingProfile("adv-1", "Other", "Rome", "IT1", "22", 0, 1)], 1)
    assert Issuer(book, source, changed, lambda: FEB + 5 * HOUR).issue_month("2026-01") == []
    assert path.read_bytes() == kept and book.invoice("2026-01", "adv-1") == first[0]
    assert book.invoice("2026-01", "adv-2") is None, "the month's plan is kept: a late advertiser is not added"
    with pytest.raises(InvoiceStoreError, match="issued once"):
        book.write(first[0])
    # The database refuses a change, a removal and a number that leaves a gap, whoever writes.
    with psycopg.connect(database, autocommit=True) as connection:
        for statement in (
            "UPDATE invoices SET document = '{}'",
            "DELETE FROM invoices",
            "INSERT INTO invoices VALUES (3, '2026-01', 'adv-2', '{}')",
        ):
            with pytest.raises(psycopg.errors.IntegrityError, match="never changes|no gap"):
                connection.execute(statement)
    # An invoice file removed by hand is written again from the database, as it was.
    os.chmod(path, 0o644)
    path.unlink()
    assert book.write_files() == ["2026-01/adv-1"] and path.read_bytes() == kept


def test_a_period_closed_after_its_month_was_invoiced_goes_on_the_next_invoice(tmp_path: Path, database: str) -> None:
    book = InvoiceDatabase(database, DataLayout(tmp_path))
    source = FakeSource(["20260105T1000Z"], ["adv-1"])
    Issuer(book, source, BillingProfiles(), lambda: FEB + HOUR).issue_month("2026-01")
    source.periods += ["20260110T0300Z", "20260201T0000Z"]  # a January hour that had no data closes late
    [february] = Issuer(book, source, BillingProfiles(), lambda: FEB + 40 * 24 * HOUR).issue_month("2026-02")
    assert february.periods == ("20260110T0300Z", "20260201T0000Z")
    late = [ln for ln in february.lines if ln.corrects == ("20260110T0300Z",)]
    assert late and late[0].kind == CHARGES and "closed after its month" in late[0].description
    # And it is on no other invoice: January's is unchanged.
    assert book.invoice("2026-01", "adv-1") is not None
    assert book.invoice("2026-01", "adv-1").periods == ("20260105T1000Z",)  # type: ignore[union-attr]


def test_issue_ready_issues_in_order_and_says_why_a_month_waits(tmp_path: Path, database: str) -> None:
    book = InvoiceDatabase(database, DataLayout(tmp_path))
    source = FakeSource(["20260105T1000Z"], ["adv-1"])
    states = {"20260105T1000Z": closed(), "20260203T0000Z": PeriodState(version=2)}
    versions = {"20260105T1000Z": 1, "20260203T0000Z": 2}
    closing = PeriodClosing(Periods(), HORIZON, versions, states)
    with pytest.raises(InvoiceError, match="2026-02 cannot be invoiced yet"):
        Issuer(book, source, BillingProfiles(), lambda: FEB + 40 * 24 * HOUR).issue_ready(closing, only="2026-02")
    done = Issuer(book, source, BillingProfiles(), lambda: FEB + HOUR).issue_ready(closing)
    assert done.months == ["2026-01"] and [i.number for i in done.invoices] == [1]
    assert any("2026-02" in line and "wait" in line for line in done.describe())
    again = Issuer(book, source, BillingProfiles(), lambda: FEB + HOUR).issue_ready(closing)
    assert again.invoices == [] and again.months == []


def write_earlier_release(root: Path) -> dict[str, bytes]:
    """`ROOT/invoices/` as the release before the database left it: January issued (two invoices), February stopped
    half-way (its plan names three advertisers, two are issued, the month not marked), the register, the lock file;
    the invoice files' bytes by MONTH/ADVERTISER."""
    folder = root / "invoices"
    source = FakeSource(["20260105T1000Z", "20260203T0000Z"], ["adv-a", "adv-b", "adv-c"])
    months = {
        "2026-01": (MonthPlan("2026-01", ("20260105T1000Z",), ("adv-a", "adv-b"), FEB + HOUR), ["adv-a", "adv-b"]),
        "2026-02": (
            MonthPlan("2026-02", ("20260203T0000Z",), ("adv-a", "adv-b", "adv-c"), FEB + 30 * 24 * HOUR),
            ["adv-a", "adv-b"],
        ),
    }
    register: dict[str, dict[str, str]] = {}
    written = {}
    number = 0
    for month, (plan, issued) in months.items():
        (folder / month).mkdir(parents=True)
        (folder / month / "plan.json").write_text(plan.to_json())
        rows = source.figures(plan.periods)
        for advertiser_id in issued:
            number += 1
            invoice = _invoice(number, month, advertiser_id, rows, plan)
            path = folder / month / f"{advertiser_id}.json"
            path.write_text(invoice.to_json())
            path.chmod(0o444)
            written[f"{month}/{advertiser_id}"] = path.read_bytes()
            register[str(number)] = {"month": month, "advertiser_id": advertiser_id}
        if month == "2026-01":
            (folder / month / "issued").write_text("")
    (folder / "register.json").write_text(json.dumps({"last": number, "numbers": register}, indent=1) + "\n")
    (folder / "lock").write_text("")
    return written


def _invoice(number: int, month: str, advertiser_id: str, rows: list[ExportFigures], plan: MonthPlan) -> Invoice:
    from billing.invoices import InvoiceTerms, build_invoice

    mine = [r for r in rows if r.advertiser_id == advertiser_id]
    return build_invoice(number, month, advertiser_id, mine, [], BillingProfiles(), plan.periods, FEB, InvoiceTerms())


def test_a_data_folder_of_an_earlier_release_is_taken_in_once(tmp_path: Path, database: str) -> None:
    written = write_earlier_release(tmp_path)
    folder = tmp_path / "invoices"
    # A file removed by hand: its number must never be issued again, so nothing is taken in until it is back.
    gone = folder / "2026-02" / "adv-b.json"
    gone.rename(tmp_path / "aside.json")
    with pytest.raises(InvoiceStoreError, match=r"\[4\].*files are gone"):
        InvoiceDatabase(database, DataLayout(tmp_path)).numbers()
    assert (folder / "register.json").exists()
    (tmp_path / "aside.json").rename(gone)

    book = InvoiceDatabase(database, DataLayout(tmp_path))
    assert book.numbers() == {
        1: ("2026-01", "adv-a"),
        2: ("2026-01", "adv-b"),
        3: ("2026-02", "adv-a"),
        4: ("2026-02", "adv-b"),
    }
    assert book.issued_months() == ["2026-01"] and book.plan("2026-02") is not None
    for name, document in written.items():
        month, advertiser_id = name.split("/")
        assert book.invoice(month, advertiser_id) == Invoice.from_json(document.decode())
        assert (folder / f"{name}.json").read_bytes() == document, "the files stay, as they were"
    assert not (folder / "register.json").exists() and (folder / "register.json.imported").exists()
    assert not (folder / "2026-02" / "plan.json").exists() and (folder / "2026-01" / "issued.imported").exists()
    assert not (folder / "lock").exists()
    # The next issuer completes February from its plan with the next number; March goes on from there.
    source = FakeSource(["20260105T1000Z", "20260203T0000Z", "20260302T0000Z"], ["adv-a", "adv-b", "adv-c", "adv-d"])
    [third] = Issuer(book, source, BillingProfiles(), lambda: FEB + 40 * 24 * HOUR).issue_month("2026-02")
    assert (third.number, third.advertiser_id) == (5, "adv-c")
    march = Issuer(book, source, BillingProfiles(), lambda: FEB + 70 * 24 * HOUR).issue_month("2026-03")
    assert [i.number for i in march] == [6, 7, 8, 9]
    assert book.issued_months() == ["2026-01", "2026-02", "2026-03"]
    assert sorted(files_of(tmp_path)) == list(range(1, 10))
    # Taken in once: another process opening the database takes nothing in again.
    assert InvoiceDatabase(database, DataLayout(tmp_path)).last_number() == 9
