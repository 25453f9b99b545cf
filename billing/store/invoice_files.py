"""The monthly invoices' files, and the exports as invoices read them.

```
ROOT/invoices/
  lock                     flock: one issuer at a time (reconciliation's run, `adbill invoices issue`)
  register.json            every number issued: {"last": N, "numbers": {"1": {"month", "advertiser_id"}, ...}}
  2026-01/plan.json        the exports the month's invoices cover and the advertisers (written first, never again)
  2026-01/ADVERTISER.json  one invoice (`billing.invoices.Invoice.to_json`), read-only, never rewritten
  2026-01/issued           the month's invoices are all written
```

A number is issued when its invoice file is renamed into place (written to a hidden file, flushed, renamed, the
folder flushed): the file is the proof. The next number is one more than the highest of the files and the register,
read under the lock, so a crash before the rename leaves no number used (the next issuer takes it) and one after it
leaves the number used once (the register is brought up to date from the files at the next issue). Two issuers
wait for each other on the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from billing.invoices import CorrectionFigures, ExportFigures, Invoice, MonthPlan, parse_month
from billing.layout import DataLayout
from billing.store.durable import fsync_folder, make_folder
from billing.store.export_files import MANIFEST_FILE, PARQUET_FILE

PLAN_FILE = "plan.json"
ISSUED_FILE = "issued"
REGISTER_FILE = "register.json"
LOCK_FILE = "lock"
_MONTH_DIR = re.compile(r"\d{4}-\d{2}", re.ASCII)
_FIGURE_KEYS = ("advertiser_id", "campaign_id", "currency", "record_type", "status", "reason", "corrects_period")


class InvoiceStoreError(RuntimeError):
    """The invoice files disagree with the register (an invoice file removed by hand): nothing is issued."""


class InvoiceFiles:
    """`billing.invoices.InvoiceBook` over `ROOT/invoices/`; `crash` is called with a step's name before it (tests
    make a step fail there, as a crash would)."""

    def __init__(self, layout: DataLayout, crash: Any = None) -> None:
        self.folder = layout.invoices
        self._crash = crash or (lambda step: None)

    # Reading ---------------------------------------------------------------------------------------------------
    def months(self) -> list[str]:
        """Months with a plan or an invoice, oldest first."""
        if not self.folder.is_dir():
            return []
        return sorted(p.name for p in self.folder.iterdir() if p.is_dir() and _MONTH_DIR.fullmatch(p.name))

    def issued_months(self) -> list[str]:
        return [m for m in self.months() if (self.folder / m / ISSUED_FILE).exists()]

    def plan(self, month: str) -> MonthPlan | None:
        path = self.folder / parse_month(month) / PLAN_FILE
        return MonthPlan.from_json(path.read_text(encoding="utf-8")) if path.exists() else None

    def planned_periods(self) -> set[str]:
        found: set[str] = set()
        for month in self.months():
            plan = self.plan(month)
            if plan is not None:
                found.update(plan.periods)
        return found

    def has(self, month: str, advertiser_id: str) -> bool:
        return self._path(month, advertiser_id).exists()

    def invoice(self, month: str, advertiser_id: str) -> Invoice | None:
        """The advertiser's invoice of the month, or None."""
        path = self._path(month, advertiser_id)
        try:
            return Invoice.from_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def invoices_of(self, advertiser_id: str) -> list[Invoice]:
        """Every invoice of the advertiser, newest month first."""
        found = [self.invoice(m, advertiser_id) for m in reversed(self.months())]
        return [i for i in found if i is not None]

    def invoices_in(self, month: str) -> list[Invoice]:
        """Every invoice of the month, by number."""
        folder = self.folder / parse_month(month)
        if not folder.is_dir():
            return []
        found = [
            Invoice.from_json(p.read_text(encoding="utf-8"))
            for p in folder.glob("*.json")
            if p.name != PLAN_FILE and not p.name.startswith(".")
        ]
        return sorted(found, key=lambda i: i.number)

    def numbers(self) -> dict[int, tuple[str, str]]:
        """Number -> (month, advertiser) of every invoice file."""
        out: dict[int, tuple[str, str]] = {}
        for month in self.months():
            for path in (self.folder / month).glob("*.json"):
                if path.name == PLAN_FILE or path.name.startswith("."):
                    continue
                number = int(json.loads(path.read_text(encoding="utf-8"))["number"])
                if number in out:
                    raise InvoiceStoreError(f"invoice number {number} appears twice: {out[number]} and {path}")
                out[number] = (month, path.stem)
        return out

    # Issuing ---------------------------------------------------------------------------------------------------
    @contextmanager
    def lock(self) -> Iterator[None]:
        make_folder(self.folder)
        with (self.folder / LOCK_FILE).open("a+") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def last_number(self) -> int:
        """The highest number issued: the register, brought up to date from the files (a run that stopped after an
        invoice's rename and before the register's); InvoiceStoreError when the register names an invoice whose file
        is gone (its number must not be issued again)."""
        files = self.numbers()
        register = self._register()
        listed = {int(n): (v["month"], v["advertiser_id"]) for n, v in register.get("numbers", {}).items()}
        gone = sorted(n for n in listed if n not in files)
        if gone:
            raise InvoiceStoreError(
                f"invoice number(s) {gone} are in {self.folder / REGISTER_FILE} but their files are gone; put them "
                "back (an issued invoice never changes) before issuing more"
            )
        last = max([int(register.get("last", 0)), *files], default=0)
        if files != listed or last != register.get("last", 0):
            self._write_register(last, files)
        return last

    def write_plan(self, plan: MonthPlan) -> None:
        folder = self.folder / plan.month
        touched = make_folder(folder)
        self._place(folder / PLAN_FILE, plan.to_json(), "plan")
        for parent in touched:
            fsync_folder(parent)

    def write(self, invoice: Invoice) -> None:
        path = self._path(invoice.month, invoice.advertiser_id)
        if path.exists():
            raise FileExistsError(f"{path} exists: an invoice is issued once")
        make_folder(path.parent)
        self._place(path, invoice.to_json(), "invoice")
        self._crash("register")
        register = self._register()
        listed = {int(n): (v["month"], v["advertiser_id"]) for n, v in register.get("numbers", {}).items()}
        listed[invoice.number] = (invoice.month, invoice.advertiser_id)
        self._write_register(max(int(register.get("last", 0)), invoice.number), listed)

    def mark_issued(self, month: str) -> None:
        self._place(self.folder / parse_month(month) / ISSUED_FILE, "", "issued")

    # Pieces ----------------------------------------------------------------------------------------------------
    def _path(self, month: str, advertiser_id: str) -> Path:
        if "/" in advertiser_id or advertiser_id.startswith(".") or not advertiser_id:
            raise ValueError(f"{advertiser_id!r} cannot name an invoice file")
        return self.folder / parse_month(month) / f"{advertiser_id}.json"

    def _register(self) -> dict[str, Any]:
        path = self.folder / REGISTER_FILE
        if not path.exists():
            return {}
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data

    def _write_register(self, last: int, numbers: dict[int, tuple[str, str]]) -> None:
        data = {
            "last": last,
            "numbers": {str(n): {"month": m, "advertiser_id": a} for n, (m, a) in sorted(numbers.items())},
        }
        self._place(self.folder / REGISTER_FILE, json.dumps(data, indent=1) + "\n", "register-file", read_only=False)

    def _place(self, target: Path, text: str, step: str, read_only: bool = True) -> None:
        """Write `text` to a hidden file beside `target`, flush it, rename it into place and flush the folder."""
        fd, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            if read_only:
                os.chmod(staging, 0o444)
            self._crash(step)
            os.replace(staging, target)
        except BaseException:
            Path(staging).unlink(missing_ok=True)
            raise
        fsync_folder(target.parent)


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
