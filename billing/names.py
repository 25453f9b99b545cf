"""The names people give campaigns and ads: words beside the ids on the pages, the API documents and the invoices.

A name is for people only: it prices nothing and bills nothing, so it has no history and may change at any time
(an invoice keeps the campaign names it was issued with). An empty name removes one.

Pure: the store is `billing.store.names_db`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("campaign", "ad")
MAX_NAME = 120


class NamingError(ValueError):
    """A name that is refused: too long, or of something that is neither a campaign nor an ad."""


@dataclass(frozen=True)
class Names:
    """Campaign and ad names by id."""

    campaigns: dict[str, str] = field(default_factory=dict)
    ads: dict[str, str] = field(default_factory=dict)

    def of(self, kind: str, item_id: str) -> str:
        """The name of a campaign or an ad, or empty."""
        return (self.campaigns if kind == "campaign" else self.ads).get(item_id, "")


def checked_name(kind: str, name: str) -> str:
    """The name as it is kept (runs of white space made one space, trimmed; empty: none); NamingError when refused."""
    if kind not in KINDS:
        raise NamingError(f"a name is given to a campaign or an ad, not to a {kind!r}")
    kept = " ".join(name.split())
    if len(kept) > MAX_NAME:
        raise NamingError(f"a name is at most {MAX_NAME} characters; got {len(kept)}")
    return kept
