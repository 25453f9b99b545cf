"""The monthly statement as a PDF, drawn with ReportLab: one A4 page or more, the figures as the page shows them."""

from __future__ import annotations

import io

from reportlab.lib import colors
from reportlab.lib.enums import TA_RIGHT
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.platypus import Flowable, Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

from web.display import money, period_label, plural, utc
from web.statements import PROVISIONAL, Statement


def statement_pdf(statement: Statement, generated_ms: int) -> bytes:
    """The PDF's bytes."""
    styles = getSampleStyleSheet()
    cur = statement.currency
    story = [
        Paragraph(f"Statement {statement.month}", styles["Title"]),
        Paragraph(
            f"Advertiser <b>{_escape(statement.advertiser_id)}</b> · currency {cur or 'unknown'}", styles["Normal"]
        ),
        Paragraph(
            f"Generated {utc(generated_ms)}. Closed periods are final, as in finance's exports; open periods are "
            "provisional, the stream's live figures, which reconciliation corrects when the period closes after its "
            "lateness horizon.",
            styles["Normal"],
        ),
        Spacer(1, 6 * mm),
    ]
    summary = [
        ["", "Amount"],
        ["Charges, closed periods", money(statement.closed_micros, cur)],
        ["Adjustments booked this month", _signed(statement.adjustments_micros, cur)],
        [f"Provisional, {plural(statement.open_periods, 'open period')}", money(statement.provisional_micros, cur)],
        ["Total" + (" (provisional)" if statement.provisional else ""), money(statement.total_micros, cur)],
    ]
    if statement.invalid_credits_micros:
        summary.insert(3, ["  of which invalid activity credits", _signed(statement.invalid_credits_micros, cur)])
    story.append(_table(summary, [110 * mm, 50 * mm], total_row=True))
    story.append(Spacer(1, 4 * mm))
    not_charged = [
        ["Not charged (never in the total)", "Clicks", "Would have cost"],
        ["Invalid clicks (not charged)", f"{statement.invalid.clicks:,}", money(statement.invalid.micros, cur)],
        ["  Invalid click rate", statement.invalid_rate, ""],
        ["Not charged: over budget", f"{statement.over_budget.clicks:,}", money(statement.over_budget.micros, cur)],
    ]
    story.append(_table(not_charged, [90 * mm, 25 * mm, 45 * mm], total_row=False))
    story.append(Spacer(1, 6 * mm))
    story.append(Paragraph("Per day", styles["Heading2"]))
    rows = [["Day", "Clicks", "Closed", "Adjustments", "Provisional", "Total"]]
    for d in statement.days:
        rows.append(
            [
                d.day + (" *" if d.provisional else ""),
                f"{d.clicks:,}",
                money(d.closed_micros, cur),
                _signed(d.adjustments_micros, cur),
                money(d.provisional_micros, cur),
                money(d.total_micros, cur),
            ]
        )
    rows.append(
        [
            "Month",
            f"{statement.clicks:,}",
            money(statement.closed_micros, cur),
            _signed(statement.adjustments_micros, cur),
            money(statement.provisional_micros, cur),
            money(statement.total_micros, cur),
        ]
    )
    story.append(_table(rows, [26 * mm, 18 * mm, 30 * mm, 30 * mm, 30 * mm, 30 * mm], total_row=True))
    if any(p.status == PROVISIONAL for p in statement.periods):
        story.append(Spacer(1, 3 * mm))
        story.append(Paragraph("* provisional: the day has an open period.", styles["Italic"]))
    story.append(Spacer(1, 6 * mm))
    story.append(Paragraph("Per period", styles["Heading2"]))
    story.append(_periods_table(statement, styles["BodyText"]))
    return a4_pdf(story, 18, f"adbill statement {statement.advertiser_id} {statement.month}", "adbill")


def a4_pdf(story: list[Flowable], margin_mm: float, title: str, author: str) -> bytes:
    """The PDF's bytes of `story` on A4 pages, its text streams left uncompressed: the figures can be searched for,
    as the tests do."""
    buffer = io.BytesIO()
    margins = {side: margin_mm * mm for side in ("leftMargin", "rightMargin", "topMargin", "bottomMargin")}
    SimpleDocTemplate(buffer, pagesize=A4, title=title, author=author, pageCompression=0, **margins).build(story)
    return buffer.getvalue()


PERIOD_HEADS = (
    "Period", "Status", "Clicks", "Charges", "Adjustments", "Total", "Invalid clicks (not charged)",
    "Not charged: over budget",
)  # fmt: skip
"""The per-period table's columns, as the statement page's and the CSV's rows (one per period, oldest first)."""


def _periods_table(statement: Statement, body: ParagraphStyle) -> Table:
    """Every period of the month: its status, clicks, charges, adjustments (how many), total, and what was not
    charged; the status and the headers wrap in their columns."""
    small = ParagraphStyle("cell", parent=body, fontName="Helvetica", fontSize=8, leading=9.5)
    head_left = ParagraphStyle("head-left", parent=small, fontName="Helvetica-Bold")
    head = ParagraphStyle("head", parent=head_left, alignment=TA_RIGHT)
    cur = statement.currency
    rows: list[list[object]] = [[Paragraph(h, head if n >= 2 else head_left) for n, h in enumerate(PERIOD_HEADS)]]
    for p in statement.periods:
        adjustments = _signed(p.adjustments_micros, cur) + (f" ({p.adjustments})" if p.adjustments else "")
        rows.append(
            [
                period_label(p.period),
                Paragraph(_escape(p.status), small),
                f"{p.clicks:,}",
                money(p.charges_micros, cur),
                adjustments,
                money(p.total_micros, cur),
                f"{p.not_charged.invalid.clicks:,}",
                f"{p.not_charged.over_budget.clicks:,}",
            ]
        )
    if len(rows) == 1:
        rows.append(["Nothing billed in this month.", "", "", "", "", "", "", ""])
    widths = [30 * mm, 22 * mm, 14 * mm, 24 * mm, 24 * mm, 24 * mm, 18 * mm, 18 * mm]
    table = _table(rows, widths, total_row=False)  # type: ignore[arg-type]
    table.setStyle(TableStyle([("FONT", (0, 1), (-1, -1), "Helvetica", 8), ("VALIGN", (0, 0), (-1, -1), "TOP")]))
    return table


def _table(rows: list[list[str]], widths: list[float], total_row: bool) -> Table:
    table = Table(rows, colWidths=widths, repeatRows=1)
    style = [
        ("FONT", (0, 0), (-1, 0), "Helvetica-Bold", 9),
        ("FONT", (0, 1), (-1, -1), "Helvetica", 9),
        ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#eef1f6")),
        ("ALIGN", (1, 0), (-1, -1), "RIGHT"),
        ("LINEBELOW", (0, 0), (-1, -1), 0.25, colors.HexColor("#d9dee7")),
        ("BOX", (0, 0), (-1, -1), 0.5, colors.HexColor("#d9dee7")),
    ]
    if total_row:
        style += [("FONT", (0, -1), (-1, -1), "Helvetica-Bold", 9), ("LINEABOVE", (0, -1), (-1, -1), 1, colors.black)]
    table.setStyle(TableStyle(style))
    return table


def _signed(micros: int, currency: str) -> str:
    return ("+" if micros > 0 else "") + money(micros, currency)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
