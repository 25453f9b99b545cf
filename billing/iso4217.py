"""ISO 4217's currencies and their minor units, as the standard's maintenance agency (SIX) publishes them.

`iso4217.csv` beside this module is ISO 4217's "list one" (the current currencies and funds, SIX's `list-one.xml`)
as published: one line per code with its `numeric` code, its `minor_units` (the decimals of its minor unit, or `N.A.`
where the list defines none: gold, silver, the SDR, the test code) and its `name`; the file's first line names the
list's published date. `billing.money` reads it, with the standard library only, for every minor unit the product
rounds, writes or shows money in.

To refresh it when SIX publishes a new list, take its `list-one.xml` (from SIX's ISO 4217 page, or the one the
`iso4217` package on PyPI bundles as `iso4217/table.xml`) and run

    python -m billing.iso4217 path/to/list-one.xml

which rewrites `billing/iso4217.csv` and says what changed; review the diff before committing it: a changed minor
unit changes how invoices round and how every page writes that currency.
"""

from __future__ import annotations

import csv
import io
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from pathlib import Path

TABLE_FILE = "iso4217.csv"
"""The table's file name in the `billing` package."""

NO_MINOR_UNIT = "N.A."
"""How list one writes a code without a minor unit (XAU, XDR, XTS, ...)."""

COLUMNS = ("code", "numeric", "minor_units", "name")

_PUBLISHED = re.compile(r"published it on (\d{4}-\d{2}-\d{2})")
_CODE = re.compile(r"[A-Z]{3}")


@dataclass(frozen=True, slots=True)
class Currency:
    """One code of ISO 4217's list one: `EUR`, `978`, 2, `Euro`; `minor_units` None where the list says N.A."""

    code: str
    numeric: str
    minor_units: int | None
    name: str


@dataclass(frozen=True, slots=True)
class CurrencyList:
    """ISO 4217's list one as published on `published` (`2026-01-01`): its currencies by code, in code order."""

    published: str
    currencies: Mapping[str, Currency]


def parse_list_one(xml: bytes) -> CurrencyList:
    """SIX's `list-one.xml` as a `CurrencyList`: each code once (the list repeats a code for every country that uses
    it), the entries without a currency (Antarctica's "No universal currency") left out. ValueError when the file is
    not list one, or lists one code twice with different figures."""
    root = ET.fromstring(xml)
    if root.tag != "ISO_4217":
        raise ValueError(f"not ISO 4217's list one, whose root element is ISO_4217 (this one's is {root.tag})")
    published = _published_date(root.get("Pblshd", ""))
    currencies: dict[str, Currency] = {}
    for entry in root.iter("CcyNtry"):
        code = (entry.findtext("Ccy") or "").strip()
        if not code:
            continue
        units = (entry.findtext("CcyMnrUnts") or "").strip()
        currency = Currency(
            code,
            (entry.findtext("CcyNbr") or "").strip(),
            None if units == NO_MINOR_UNIT else int(units),
            " ".join((entry.findtext("CcyNm") or "").split()),
        )
        if not _CODE.fullmatch(code) or not re.fullmatch(r"\d{3}", currency.numeric):
            raise ValueError(f"list one's entry {code!r} has no three-letter code and three-digit number")
        known = currencies.setdefault(code, currency)
        if (known.numeric, known.minor_units) != (currency.numeric, currency.minor_units):
            raise ValueError(f"list one gives {code} twice, differently: {known} and {currency}")
    if not currencies:
        raise ValueError("list one lists no currency")
    return CurrencyList(published, dict(sorted(currencies.items())))


def _published_date(text: str) -> str:
    """List one's published date as `2026-01-01`: the list writes it so, older lists as `June 1, 2018`."""
    for layout in ("%Y-%m-%d", "%B %d, %Y"):
        try:
            return datetime.strptime(text.strip(), layout).date().isoformat()
        except ValueError:
            continue
    raise ValueError(f"list one's published date (Pblshd) is {text!r}, not a date such as 2026-01-01")


def table_text(table: CurrencyList) -> str:
    """The table as `iso4217.csv` holds it: lines naming the list, its date and how to refresh it, then a header and a
    line a code."""
    out = io.StringIO()
    out.write(f"# ISO 4217 list one as SIX, its maintenance agency, published it on {table.published} (list-one.xml)\n")
    out.write("# To refresh it from a newer list-one.xml: python -m billing.iso4217 LIST_ONE_XML\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for c in table.currencies.values():
        writer.writerow([c.code, c.numeric, NO_MINOR_UNIT if c.minor_units is None else c.minor_units, c.name])
    return out.getvalue()


def read_table(text: str) -> CurrencyList:
    """The table from `iso4217.csv`'s text (`table_text`); ValueError when it is not that file."""
    lines = text.splitlines()
    published = _PUBLISHED.search(lines[0]) if lines and lines[0].startswith("#") else None
    if published is None:
        raise ValueError(f"{TABLE_FILE} starts with a line naming ISO 4217's list and its published date")
    rows = list(csv.reader(line for line in lines if not line.startswith("#")))
    if not rows or tuple(rows[0]) != COLUMNS:
        raise ValueError(f"{TABLE_FILE}'s columns are {', '.join(COLUMNS)}")
    currencies = {}
    for code, numeric, units, name in rows[1:]:
        currencies[code] = Currency(code, numeric, None if units == NO_MINOR_UNIT else int(units), name)
    return CurrencyList(published.group(1), currencies)


@cache
def published_table() -> CurrencyList:
    """The table the `billing` package ships (`iso4217.csv`), read once."""
    return read_table(resources.files("billing").joinpath(TABLE_FILE).read_text(encoding="utf-8"))


def changes(old: CurrencyList, new: CurrencyList) -> list[str]:
    """What a new list changes, in words, one line each: codes added, codes withdrawn, minor units changed."""
    out = [
        f"{code} added ({new.currencies[code].minor_units})" for code in new.currencies if code not in old.currencies
    ]
    out += [f"{code} withdrawn" for code in old.currencies if code not in new.currencies]
    for code, was in old.currencies.items():
        now = new.currencies.get(code)
        if now is not None and now.minor_units != was.minor_units:
            out.append(f"{code}: minor units {was.minor_units} -> {now.minor_units}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m billing.iso4217 LIST_ONE_XML [OUTPUT]`: rewrite the table (`billing/iso4217.csv` by default) from
    SIX's list one, and say what changed."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (1, 2):
        print("usage: python -m billing.iso4217 LIST_ONE_XML [OUTPUT_CSV]", file=sys.stderr)
        return 2
    source = Path(args[0])
    target = Path(args[1]) if len(args) == 2 else Path(__file__).with_name(TABLE_FILE)
    try:
        new = parse_list_one(source.read_bytes())
    except (OSError, ValueError, ET.ParseError) as exc:
        print(f"{source}: {exc}", file=sys.stderr)
        return 1
    try:
        old: CurrencyList | None = read_table(target.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = None  # no table yet, or not one this module wrote: nothing to compare with
    target.write_text(table_text(new), encoding="utf-8")
    was = f" (was {old.published})" if old else ""
    print(f"{target}: {len(new.currencies)} codes of ISO 4217's list one of {new.published}{was}")
    for line in changes(old, new) if old else []:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
