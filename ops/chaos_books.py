"""The chaos suite's books (`make chaos`, `ops.chaos`): what the ledger, the corrections and the exports bill per
click and per campaign-day, and what the budgets allowed: plain arithmetic on rows, tested without services
(tests/unit/test_chaos_books.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from billing.budgets import DAY_MS, day_start
from billing.catalog import Catalog
from billing.change_log import ChangeEntry
from billing.corrections import Correction
from billing.export import ExportStatus, RecordType


def budget_and_range_changes(entries: Iterable[ChangeEntry], after_ms: int) -> Counter[str]:
    """Changes of budgets and of the IP exclusion list made after `after_ms` (epoch ms), by kind (`set-budget`,
    `exclude-ip`, `include-ip`); entries without the time they were made are not counted."""
    kinds = ("set-budget", "exclude-ip", "include-ip")
    return Counter(
        entry.kind
        for entry in entries
        if entry.kind in kinds and entry.made_at is not None and entry.made_at > after_ms
    )


def charged_after_raises(
    changes: Iterable[ChangeEntry], catalog: Catalog, rows: Iterable[Mapping[str, Any]]
) -> dict[str, int]:
    """For each budget change of `changes` that raised a campaign's budget or made it unlimited: the clicks of the
    campaign that the stream charged (`rows`, the ledger) from the change's effective time to the end of its UTC
    day. A stream that did not see the change would charge none there once the old budget was spent."""
    raised: dict[tuple[str, int], int] = {}
    for entry in changes:
        if entry.kind != "set-budget" or entry.campaign_id is None or entry.effective_from is None:
            continue
        before = catalog.budget_at(entry.campaign_id, entry.effective_from - 1)
        after = entry.daily_budget_micros
        if before is not None and (after is None or after > before):
            raised[(entry.campaign_id, entry.effective_from)] = 0
    day_ends = {key: day_start(key[1]) + DAY_MS for key in raised}
    for row in rows:
        for campaign, effective_from in raised:
            if (
                row["campaign_id"] == campaign
                and effective_from <= row["click_time"] < day_ends[(campaign, effective_from)]
            ):
                raised[(campaign, effective_from)] += 1
    return {f"{campaign} from {effective_from}": count for (campaign, effective_from), count in raised.items()}


def final_ledger(rows: list[dict[str, Any]], corrections: Iterable[Correction]) -> dict[str, int]:
    """The provisional ledger's rows plus every correction, netted per click (`net_bills`)."""
    entries = [(row["click_id"], 1, row["amount_micros"]) for row in rows]
    entries += [(c.click_id, c.clicks, c.amount_micros) for c in corrections]
    return net_bills(entries)


def exported_books(rows: Iterable[dict[str, Any]], pending: Iterable[Correction] = ()) -> dict[str, int]:
    """The exports' rows netted per click (`net_bills`): a click row billed or added is one bill (a retracted one
    none), an adjustment added one more and an adjustment retracted one less; with `pending`, the adjustments for
    the exported periods booked in a period not closed yet (finance gets them when it closes), as the audit counts
    them (`attribution.audit`)."""
    retracted = ExportStatus.RETRACTED.value
    entries = [
        (
            row["click_id"],
            (0 if row["status"] == retracted else 1)
            if row["record_type"] == RecordType.CLICK.value
            else (-1 if row["status"] == retracted else 1),
            row["net_micros"],
        )
        for row in rows
    ]
    entries += [(c.click_id, c.clicks, c.amount_micros) for c in pending]
    return net_bills(entries)


def net_bills(entries: Iterable[tuple[str, int, int]]) -> dict[str, int]:
    """(click id, bills, micros) entries summed per click: click id -> net micros of the clicks that net to one bill.
    A click that nets to anything but none or one bill is kept with minus its count, so that it differs from any
    ground truth."""
    clicks: Counter[str] = Counter()
    micros: Counter[str] = Counter()
    for click, bills, amount in entries:
        clicks[click] += bills
        micros[click] += amount
    return {click: micros[click] if n == 1 else -n for click, n in clicks.items() if n != 0}


def past_budget(charged: Mapping[tuple[str, str], int], catalog: Catalog) -> list[str]:
    """Each (campaign, UTC day) of `charged` whose total passed every daily budget the campaign had (a campaign
    that was ever unlimited passes none)."""
    out = []
    for (campaign, day), total in sorted(charged.items()):
        limits = [b.daily_budget_micros for b in catalog.budgets.get(campaign, ())]
        bounded = [limit for limit in limits if limit is not None]
        if bounded and len(bounded) == len(limits) and total > max(bounded):
            out.append(f"{campaign} {day}: {total} > {max(bounded)}")
    return out
