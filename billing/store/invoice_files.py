"""The monthly invoices as files: the documents finance reads, written from the database; the exports as invoices
read them; and a data folder's invoices written before the database, read once to be taken in.

```
ROOT/invoices/
  2026-01/ADVERTISER.json  one invoice (`billing.invoices.Invoice.to_json`), read-only, never rewritten
```

The invoices, their numbers and each month's plan are kept in the database (`billing.store.invoice_db`); an
invoice's file is written from its row once the row is committed (staged, flushed, renamed into place, the folder
flushed), and written again from the row when it is missing.

A data folder of an earlier release kept the numbers in files under a lock file: `register.json` (every number
issued), `2026-01/plan.json` (the exports a month covers, its advertisers) and `2026-01/issued` (the month's
invoices all written) beside the invoice files. `read_earlier` reads them for the one take-in; `taken_in` names
those renamed `NAME.imported` once the take-in committed (`billing.store.database.Tables`); the invoice files stay:
they are the documents.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pyarrow.compute as pc
import pyarrow.parquet as pq

from billing.invoices import CorrectionFigures, ExportFigures, Invoice, MonthPlan, parse_month
from billing.layout import DataLayout
from billing.store.durable import write_whole
from billing.store.export_files import MANIFEST_FILE, PARQUET_FILE

PLAN_FILE = "plan.json"
ISSUED_FILE = "issued"
REGISTER_FILE = "register.json"
LOCK_FILE = "lock"
_MONTH_DIR = re.compile(r"\d{4}-\d{2}", re.ASCII)
_FIGURE_KEYS = ("advertiser_id", "campaign_id", "currency", "record_type", "status", "reason", "corrects_period")


class InvoiceStoreError(RuntimeError):
    """The invoices cannot be kept or read as they are (an earlier release's files that disagree with their
    register, an invoice issued twice): nothing is issued."""


# --- The documents --------------------------------------------------------------------------------------------


def invoice_path(folder: Path, month: str, advertiser_id: str) -> Path:
    """`FOLDER/MONTH/ADVERTISER.json`; ValueError for an advertiser id that cannot name a file."""
    if "/" in advertiser_id or advertiser_id.startswith(".") or not advertiser_id:
        raise ValueError(f"{advertiser_id!r} cannot name an invoice file")
    return folder / parse_month(month) / f"{advertiser_id}.json"


def invoice_files_of(folder: Path, month: str) -> set[str]:
    """The advertisers of `month` with an invoice file."""
    found = folder / month
    if not found.is_dir():
        return set()
    return {p.stem for p in found.glob("*.json") if p.name != PLAN_FILE and not p.name.startswith(".")}


def write_invoice_file(
    folder: Path, month: str, advertiser_id: str, document: str, crash: Callable[[str], None] = lambda step: None
) -> None:
    """Write an invoice's document as its read-only file, whole or not at all (`billing.store.durable.write_whole`:
    staged in a hidden file, flushed, renamed into place, the folder flushed; `crash` is called once the document is
    staged, before the rename: tests stop there). A file already there is left alone (an issued invoice never
    changes)."""
    target = invoice_path(folder, month, advertiser_id)
    if target.exists():
        return

    def write(out: IO[str]) -> None:
        out.write(document)
        crash("file")

    write_whole(target, write, mode=0o444)


# --- An earlier release's files -------------------------------------------------------------------------------


@dataclass
class EarlierInvoices:
    """What an earlier release kept in `ROOT/invoices/`: each month's plan, the months all issued, and every invoice
    with its document as written (by number)."""

    plans: dict[str, MonthPlan] = field(default_factory=dict)
    issued: set[str] = field(default_factory=set)
    documents: dict[int, tuple[Invoice, str]] = field(default_factory=dict)


def read_earlier(folder: Path) -> EarlierInvoices | None:
    """The invoices an earlier release kept in `folder` (`ROOT/invoices`), or None when it kept none there;
    InvoiceStoreError when its files disagree with its register (a number issued twice, an invoice file removed by
    hand: its number must never be issued again, so nothing is taken in until it is put back)."""
    register_path = folder / REGISTER_FILE if (folder / REGISTER_FILE).exists() else None
    months = (
        sorted(p.name for p in folder.iterdir() if p.is_dir() and _MONTH_DIR.fullmatch(p.name))
        if (folder.is_dir())
        else []
    )
    if register_path is None and not months:
        return None
    found = EarlierInvoices()
    for month in months:
        plan = folder / month / PLAN_FILE
        if plan.exists():
            found.plans[month] = MonthPlan.from_json(plan.read_text(encoding="utf-8"))
        if (folder / month / ISSUED_FILE).exists():
            found.issued.add(month)
        for advertiser_id in sorted(invoice_files_of(folder, month)):
            path = folder / month / f"{advertiser_id}.json"
            document = path.read_text(encoding="utf-8")
            invoice = Invoice.from_json(document)
            if invoice.number in found.documents:
                raise InvoiceStoreError(
                    f"invoice number {invoice.number} appears twice: {found.documents[invoice.number][0].month}/"
                    f"{found.documents[invoice.number][0].advertiser_id} and {path}"
                )
            if month not in found.plans:
                raise InvoiceStoreError(f"{path} has no plan beside it ({folder / month / PLAN_FILE})")
            found.documents[invoice.number] = (invoice, document)
    register = json.loads(register_path.read_text(encoding="utf-8")) if register_path is not None else {}
    gone = sorted(int(n) for n in register.get("numbers", {}) if int(n) not in found.documents)
    if gone:
        raise InvoiceStoreError(
            f"invoice number(s) {gone} are in {register_path} but their files are gone; put them back (an issued "
            "invoice never changes) before the invoices are taken into the database"
        )
    return found


def taken_in(folder: Path) -> list[Path]:
    """An earlier release's register, plans and issued marks, set aside once they are taken in (its lock file is
    removed now: nothing takes it any more)."""
    paths = [folder / REGISTER_FILE]
    for month in (p for p in folder.iterdir() if p.is_dir() and _MONTH_DIR.fullmatch(p.name)):
        paths += [month / PLAN_FILE, month / ISSUED_FILE]
    (folder / LOCK_FILE).unlink(missing_ok=True)
    return [path for path in paths if path.exists()]


# --- What invoices are made of --------------------------------------------------------------------------------


class ExportInvoiceSource:
    """`billing.invoices.InvoiceSource` over the data folder: the exports and the corrections files, read with
    pyarrow and summed there (a month of clicks is never held as Python rows)."""

    def __init__(self, layout: DataLayout) -> None:
        self.layout = layout

    def exported(self) -> list[str]:
        root = self.layout.exports
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and (p / MANIFEST_FILE).exists())

    def figures(self, periods: Sequence[str]) -> list[ExportFigures]:
        out: list[ExportFigures] = []
        for period in periods:
            table = pq.read_table(
                self.layout.export(period) / PARQUET_FILE, columns=[*_FIGURE_KEYS, "booked_period", "net_micros"]
            )
            if not table.num_rows:
                continue
            table = table.set_column(
                table.schema.get_field_index("reason"), "reason", pc.fill_null(table["reason"], "")
            )
            grouped = table.group_by([*_FIGURE_KEYS, "booked_period"]).aggregate(
                [("net_micros", "sum"), ("net_micros", "count")]
            )
            for row in grouped.to_pylist():
                out.append(
                    ExportFigures(
                        advertiser_id=row["advertiser_id"],
                        campaign_id=row["campaign_id"],
                        currency=row["currency"],
                        record_type=row["record_type"],
                        status=row["status"],
                        reason=row["reason"] or None,
                        corrects_period=row["corrects_period"],
                        booked_period=row["booked_period"],
                        rows=int(row["net_micros_count"]),
                        net_micros=int(row["net_micros_sum"]),
                    )
                )
        return out

    def corrections(self, periods: Sequence[str]) -> list[CorrectionFigures]:
        sums: dict[tuple[str, str, str, str, str], list[int]] = {}
        for period in periods:
            folder = self.layout.corrections_of(period)
            files = sorted(p for p in folder.glob("*.parquet") if not p.name.startswith(".")) if folder.is_dir() else []
            seen: set[str] = set()
            for path in files:
                table = pq.read_table(path)
                mask = pc.and_(pc.equal(table["booked_period"], period), pc.equal(table["corrects_period"], period))
                kept = table.filter(mask).select(
                    ["correction_id", "advertiser_id", "campaign_id", "reason", "kind", "amount_micros"]
                )
                for row in kept.to_pylist():
                    if row["correction_id"] in seen:
                        continue  # read twice (a repeated run's file): counts once
                    seen.add(row["correction_id"])
                    key = (row["advertiser_id"], row["campaign_id"], row["reason"], row["kind"], period)
                    entry = sums.setdefault(key, [0, 0])
                    entry[0] += 1
                    entry[1] += int(row["amount_micros"])
        return [
            CorrectionFigures(adv, cmp, reason, kind, period, count, micros)
            for (adv, cmp, reason, kind, period), (count, micros) in sorted(sums.items())
        ]
