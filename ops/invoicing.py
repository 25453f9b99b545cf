"""`adbill invoices` and `adbill profiles`: the monthly invoices issued by hand (reconciliation issues them too), read
back, and the advertisers' billing profiles kept with history."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from ops.settings import Settings

if TYPE_CHECKING:
    from billing.invoices import Invoice


def issue_invoices(settings: Settings, month: str | None) -> int:
    """Issue every month whose periods are all closed and that has no invoices yet, oldest first (or `month`, and
    the months before it); idempotent. 0 when done, 1 when `month` cannot be invoiced yet (the line says why), 69
    when the database that keeps the invoices cannot be reached."""
    from billing.invoices import InvoiceError
    from billing.periods import Periods
    from billing.reconcile_run import closed_by_exports
    from billing.store.data_versions import data_versions
    from billing.store.export_files import ExportFolders
    from billing.store.invoice_db import InvoiceDatabaseUnavailable
    from billing.store.invoice_files import InvoiceStoreError
    from billing.store.period_states import load_states
    from ops.reach import EXIT_UNREACHABLE
    from ops.reconcile import issue_invoices as issue
    from ops.reconcile import reconcile_config

    config = reconcile_config(settings)
    layout = config.layout
    versions = data_versions(layout, Periods(config.period_ms))
    states = closed_by_exports(ExportFolders(layout), load_states(layout.periods_file))
    try:
        lines = issue(config, versions, states, lambda: int(time.time() * 1000), month)
    except (InvoiceError, InvoiceStoreError) as exc:
        print(f"invoices: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE if isinstance(exc, InvoiceDatabaseUnavailable) else 1
    for line in lines or ["invoices: nothing to issue (every month whose periods are all closed is invoiced)"]:
        print(line if line.startswith("invoices") else f"invoices: {line}")
    return 0


def list_invoices(settings: Settings, month: str | None, advertiser: str | None) -> int:
    """One line per invoice: number, month, advertiser, total, due date."""
    from billing.money import format_micros

    book = settings.invoice_store()
    months = [month] if month else book.months()
    found = [i for m in months for i in book.invoices_in(m) if advertiser in (None, i.advertiser_id)]
    for i in found:
        print(
            f"{i.label}\t{i.month}\t{i.advertiser_id}\t{format_micros(i.totals.total_micros, i.currency)}\t"
            f"due {i.due_date}"
        )
    if not found:
        print("no invoice yet", file=sys.stderr)
    return 0


def show_invoice(settings: Settings, advertiser: str, month: str) -> int:
    """The invoice as text: who, lines, totals, the rounding rule and the terms."""
    invoice = settings.invoice_store().invoice(month, advertiser)
    if invoice is None:
        print(f"invoices: {advertiser} has no invoice for {month}", file=sys.stderr)
        return 1
    print(invoice_text(invoice))
    return 0


def invoice_text(invoice: Invoice) -> str:
    from billing.money import format_micros

    cur = invoice.currency
    bill_to = invoice.bill_to
    lines = [
        f"{invoice.label}  {invoice.issuer}  invoice of {invoice.month}, issued {invoice.issued_date}",
        f"bill to: {bill_to.name + ', ' + '; '.join(bill_to.address_lines) if bill_to else 'no billing profile'}"
        f"{f' (tax id {bill_to.tax_id})' if bill_to and bill_to.tax_id else ''}",
        f"advertiser {invoice.advertiser_id}, {cur}",
    ]
    for line in invoice.lines:
        corrects = f" [{line.corrects_text}]" if line.corrects else ""
        lines.append(
            f"  {line.campaign_id}\t{line.description}{corrects}\t{line.clicks:,}\t"
            f"{format_micros(line.amount_micros, cur)}"
        )
    t = invoice.totals
    lines += [
        f"net (exact)\t{format_micros(t.net_micros, cur)}",
        f"amount\t{format_micros(t.amount_micros, cur)}",
        f"tax {invoice.tax_rate or '0'} %\t{format_micros(t.tax_micros, cur)}",
        f"total\t{format_micros(t.total_micros, cur)}",
        invoice.rounding_rule,
        invoice.payment_terms,
    ]
    return "\n".join(lines)


def set_profile(
    settings: Settings,
    advertiser: str,
    name: str | None,
    address: str | None,
    tax_id: str | None,
    tax_rate: str | None,
    at: str | None,
) -> int:
    """`adbill profiles set`: a new entry of the advertiser's billing profile, from now or a later --at."""
    from billing.profiles import describe_profile, profile_change
    from billing.store.catalog_file import command_made_by
    from ops.times import parse_time

    at_ms = parse_time(at, "--at") if at else None
    maker = command_made_by()
    kept = settings.profile_store().change(
        lambda now: profile_change(
            advertiser,
            name,
            (address or "").replace("\\n", "\n"),
            tax_id,
            tax_rate,
            now if at_ms is None else at_ms,
            maker,
        )
    )
    print(f"profiles: {advertiser} {describe_profile(kept)} (version {kept.version})")
    return 0


def show_profiles(settings: Settings, advertiser: str | None) -> int:
    """Every advertiser's profile in force now, or one advertiser's whole history."""
    from billing.profiles import describe_profile

    profiles = settings.profile_store().current()
    now = int(time.time() * 1000)
    if advertiser:
        history = profiles.history(advertiser)
        for entry in history:
            print(describe_profile(entry))
        if not history:
            print(f"profiles: {advertiser} has no billing profile", file=sys.stderr)
        return 0
    for a in profiles.advertiser_ids:
        shown = profiles.in_force(a, now) or profiles.next_change(a, now)
        if shown is not None:
            print(f"{a}\t{describe_profile(shown)}")
    if not profiles.advertiser_ids:
        print("profiles: no billing profile yet", file=sys.stderr)
    return 0
