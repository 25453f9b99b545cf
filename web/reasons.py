"""Why a correction was written, said for the advertiser who reads it: one label and one sentence per reason.

Pure. The reasons are reconciliation's (`billing.corrections.CorrectionReason`); a unit test keeps every one of them
explained here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReasonText:
    label: str
    explanation: str


REASONS: dict[str, ReasonText] = {
    "late_click": ReasonText(
        "Late click",
        "Added: the click reached us after the live bill had moved past its time; the complete data shows it is "
        "billable, so it is charged now.",
    ),
    "late_impression": ReasonText(
        "Late impression",
        "Added: the impression that makes this click billable reached us late; the complete data shows the click is "
        "billable, so it is charged now.",
    ),
    "missed_match": ReasonText(
        "Missed match",
        "Added: neither the click nor its impression was late, but the live bill did not pair them (they arrived too "
        "far apart); the complete data does, so the click is charged now.",
    ),
    "billed_after_close": ReasonText(
        "Billed after close",
        "Added in the current period: the click was billed after its period had closed, so the closed period's "
        "statement lacks it; it is charged here, pointing at the period it belongs to.",
    ),
    "duplicate": ReasonText(
        "Duplicate",
        "Removed: the same click was charged more than once; every extra charge is taken back.",
    ),
    "id_conflict": ReasonText(
        "Conflicting copies",
        "Two different events arrived with the same id; the first one stands, and a charge made on the later copy "
        "is taken back (and, if the first copy is billable at another price, charged at that price).",
    ),
    "catalog_change": ReasonText(
        "Price change",
        "The ad's price at the click's time differs from what the live bill used (a new ad, a new price or a pause "
        "had not reached it yet): the click is charged at the price in force at its time, and a charge at any other "
        "price is taken back.",
    ),
    "known_bot": ReasonText(
        "Invalid: known bot",
        "Invalid activity: the click came from a known crawler or bot (its user agent is on the crawler list we "
        "filter by), so it is not charged; a charge made for it is taken back.",
    ),
    "excluded_ip": ReasonText(
        "Invalid: excluded network",
        "Invalid activity: the click came from an IP range on the exclusion list at the time of the click, so it is "
        "not charged; a charge made for it is taken back.",
    ),
    "click_flood": ReasonText(
        "Invalid: click flood",
        "Invalid activity: the same user clicked more than 20 times within 60 seconds; none of those clicks is "
        "charged, and a charge made for any of them is taken back.",
    ),
    "duplicate_click": ReasonText(
        "Invalid: double click",
        "Invalid activity: the same user clicked the same ad again within 30 seconds; only the first click of such a "
        "run is charged, and a charge made for a later one is taken back.",
    ),
    "over_budget": ReasonText(
        "Over budget",
        "The campaign's daily budget, taken in the order the clicks happened that UTC day: a charge past it is "
        "taken back, and a click that fits after all (one that happened earlier than clicks charged live) is "
        "charged.",
    ),
    "not_billable": ReasonText(
        "Not billable",
        "Removed: the complete data does not support the charge (for instance no impression of the same user on "
        "the same ad within 10 seconds before the click).",
    ),
}


def reason_label(reason: str) -> str:
    """`late_click` -> `Late click`; an unknown reason as written, underscores as spaces."""
    known = REASONS.get(str(reason))
    return known.label if known else str(reason).replace("_", " ")


def reason_explanation(reason: str) -> str:
    known = REASONS.get(str(reason))
    return known.explanation if known else "A correction by reconciliation."
