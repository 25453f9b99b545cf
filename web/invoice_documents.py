"""A monthly invoice as a CSV file and as a PDF (ReportLab, as the statement's), from the invoice as it was issued
(`billing.invoices.Invoice`): nothing is computed again, so a download today says what the invoice said the day it
was issued.

The CSV has one row per line, then the net, the amount, the tax and the total as rows of their own (`line_kind`),
money as integer micros with an exact decimal beside; no text cell starts a formula.
"""

from __future__ import annotations

import csv
import io

from reportlab.lib import colors
from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.platypus import KeepTogether, Paragraph, Spacer, Table, TableStyle

from billing.invoices import ADJUSTMENT, CHARGES, CORRECTION, Invoice, InvoiceLine
from billing.money import format_amount
from web.display import money, period_label, plural, signed_money
from web.statement_pdf import a4_pdf
from web.statements import safe_cell

CSV_COLUMNS = (
    "invoice",
    "month",
    "advertiser_id",
    "currency",
    "line_kind",
    "campaign_id",
    "campaign_name",
    "description",
    "reason",
    "corrects",
    "clicks",
    "amount_micros",
    "amount",
)

SECTIONS = (
    (CHARGES, "Charges per campaign"),
    (CORRECTION, "Corrections made before the periods closed"),
    (ADJUSTMENT, "Adjustments to periods closed earlier"),
)
"""The kinds of lines in the order an invoice shows them, with their headings."""


def corrects_label(line: InvoiceLine) -> str:
    """The periods a line corrects, for people: `2025-12-31 22:00 UTC`, or the first and last and how many."""
    if not line.corrects:
        return ""
    if len(line.corrects) == 1:
        return period_label(line.corrects[0])
    return f"{period_label(line.corrects[0])} to {period_label(line.corrects[-1])} ({len(line.corrects)} periods)"


def invoice_csv(invoice: Invoice) -> str:
    """The invoice's lines and totals as CSV text."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    head = [invoice.label, invoice.month, safe_cell(invoice.advertiser_id), invoice.currency]
    for line in invoice.lines:
        writer.writerow(
            [
                *head,
                line.kind,
                safe_cell(line.campaign_id),
                safe_cell(line.campaign_name),
                safe_cell(line.description),
                line.reason or "",
                " ".join(line.corrects),
                line.clicks,
                line.amount_micros,
                format_amount(line.amount_micros, invoice.currency),
            ]
        )
    t = invoice.totals
    tax = f"tax {invoice.tax_rate} %" if invoice.tax_rate is not None else "no tax: no billing profile"
    for kind, text, micros in (
        ("net", "net, the exact sum of the lines", t.net_micros),
        ("amount", "the net rounded once, half away from zero, to the currency's minor unit", t.amount_micros),
        ("tax", tax, t.tax_micros),
        ("total", invoice.payment_terms, t.total_micros),
    ):
        amount = format_amount(micros, invoice.currency)
        writer.writerow([*head, kind, "", "", safe_cell(text), "", "", "", micros, amount])
    return out.getvalue()


def invoice_pdf(invoice: Invoice) -> bytes:
    """The invoice's PDF bytes: A4, the issuer and number, bill-to, lines per section, totals, rounding and terms."""
    styles = getSampleStyleSheet()
    title = ParagraphStyle("invoice-title", parent=styles["Title"], alignment=0, fontSize=17, leading=21)
    small = ParagraphStyle("small", parent=styles["Normal"], fontSize=8, leading=10)
    cell = ParagraphStyle("cell", parent=styles["Normal"], fontSize=8.5, leading=10.5)
    cur = invoice.currency
    bill_to = invoice.bill_to
    to_lines = (
        [f"<b>{_escape(bill_to.name)}</b>", *(_escape(a) for a in bill_to.address_lines)]
        + ([f"Tax id {_escape(bill_to.tax_id)}"] if bill_to.tax_id else [])
        if bill_to
        else ["<i>No billing profile on file at the month's end: no tax charged.</i>"]
    )
    header = Table(
        [
            [
                Paragraph(f"{_escape(invoice.issuer)}<br/>Invoice {invoice.label}", title),
                Paragraph(
                    f"Invoice date {invoice.issued_date}<br/>Due {invoice.due_date}<br/>Month {invoice.month}<br/>"
                    f"Advertiser {_escape(invoice.advertiser_id)}<br/>Currency {cur}",
                    styles["Normal"],
                ),
            ]
        ],
        colWidths=[110 * mm, 68 * mm],
    )
    header.setStyle(TableStyle([("VALIGN", (0, 0), (-1, -1), "TOP")]))
    story: list[object] = [
        header,
        Spacer(1, 4 * mm),
        Paragraph("Bill to", styles["Heading4"]),
        Paragraph("<br/>".join(to_lines), styles["Normal"]),
        Spacer(1, 5 * mm),
    ]
    for kind, heading in SECTIONS:
        lines = invoice.lines_of(kind)
        if not lines:
            continue
        rows: list[list[object]] = [["Campaign", "Description", "Corrects", "Clicks", "Amount"]]
        for line in lines:
            rows.append(
                [
                    Paragraph(
                        f"{_escape(line.campaign_name)}<br/>{_escape(line.campaign_id)}"
                        if line.campaign_name
                        else _escape(line.campaign_id),
                        cell,
                    ),
                    Paragraph(_escape(line.description), cell),
                    Paragraph(_escape(corrects_label(line)), cell),
                    f"{line.clicks:,}",
                    signed_money(line.amount_micros, cur) if kind != CHARGES else money(line.amount_micros, cur),
                ]
            )
        story.append(Paragraph(heading, styles["Heading4"]))
        story.append(_table(rows, [40 * mm, 54 * mm, 38 * mm, 16 * mm, 30 * mm], total_row=False))
        story.append(Spacer(1, 3 * mm))
    if not invoice.lines:
        story.append(Paragraph("No charges this month.", styles["Normal"]))
    t = invoice.totals
    rate = f"Tax {invoice.tax_rate} %" if invoice.tax_rate is not None else "Tax (no billing profile)"
    totals: list[list[object]] = [
        ["Net, the exact sum of the lines", money(t.net_micros, cur)],
        ["Amount, the net rounded once", money(t.amount_micros, cur)],
        [rate, money(t.tax_micros, cur)],
        ["Total" + (" (a credit)" if t.total_micros < 0 else " to pay"), money(t.total_micros, cur)],
    ]
    story.append(KeepTogether([Spacer(1, 2 * mm), _table(totals, [126 * mm, 52 * mm], total_row=True, head=False)]))
    story.append(Spacer(1, 4 * mm))
    story.append(Paragraph(f"<b>Payment terms.</b> {_escape(invoice.payment_terms)}", styles["Normal"]))
    story.append(Paragraph(f"<b>Rounding.</b> {_escape(invoice.rounding_rule)}", small))
    span = f", {period_label(invoice.periods[0])} to {period_label(invoice.periods[-1])}" if invoice.periods else ""
    story.append(
        Paragraph(
            f"Covers the finance exports of {plural(len(invoice.periods), 'closed period')}{span}. An issued invoice "
            "never changes: an adjustment reaching this month is on a later invoice.",
            small,
        )
    )
    pdf_title = f"{invoice.issuer} invoice {invoice.label} {invoice.advertiser_id} {invoice.month}"
    return a4_pdf(story, 16, pdf_title, invoice.issuer)


def _table(rows: list[list[object]], widths: list[float], total_row: bool, head: bool = True) -> Table:
    table = Table(rows, colWidths=widths, repeatRows=1 if head else 0)
    style = [
        ("FONT", (0, 0), (-1, -1), "Helvetica", 8.5),
        ("ALIGN", (-2 if head else -1, 0), (-1, -1), "RIGHT"),
        ("VALIGN", (0, 0), (-1, -1), "TOP"),
        ("LINEBELOW", (0, 0), (-1, -1), 0.25, colors.HexColor("#d9dee7")),
        ("BOX", (0, 0), (-1, -1), 0.5, colors.HexColor("#d9dee7")),
    ]
    if head:
        style += [
            ("FONT", (0, 0), (-1, 0), "Helvetica-Bold", 8.5),
            ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#eef1f6")),
        ]
    if total_row:
        style += [("FONT", (0, -1), (-1, -1), "Helvetica-Bold", 10), ("LINEABOVE", (0, -1), (-1, -1), 1, colors.black)]
    table.setStyle(TableStyle(style))
    return table


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
