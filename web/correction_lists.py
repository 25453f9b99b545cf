"""An advertiser's corrections as its pages list them, read from its list in Redis (newest first): a page of them,
those of one period, or one by its id. A line that cannot be read is not shown rather than failing the page."""

from __future__ import annotations

import json

import redis

from billing.corrections import Correction
from billing.store.redis_keys import RedisKeys
from web.model import CorrectionPage
from web.readers import CatalogView, is_id


class CorrectionLists:
    """Each advertiser's list of corrections (`RedisKeys.correction_list`), never another advertiser's line."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, catalog: CatalogView) -> None:
        self.client = client
        self.keys = keys
        self.catalog = catalog

    def page(self, advertiser_id: str, offset: int, limit: int) -> CorrectionPage:
        """One page of the advertiser's corrections, newest first."""
        key = self.keys.correction_list(advertiser_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.llen(key)
        pipe.lrange(key, offset, offset + limit - 1)
        total, raw = pipe.execute()
        items = [c for c in (_correction(text) for text in raw) if c and c.advertiser_id == advertiser_id]
        return CorrectionPage(advertiser_id, self.catalog.currency(advertiser_id), int(total), offset, limit, items)

    def of_period(
        self, advertiser_id: str, period_key: str, limit: int, scan: int = 5000, chunk: int = 1000
    ) -> CorrectionPage:
        """The advertiser's newest corrections (at most `limit`) that correct the period or are booked in it, from
        the newest `scan` of its list; `total` counts those found there."""
        key = self.keys.correction_list(advertiser_id)
        items: list[Correction] = []
        found = 0
        for start in range(0, scan, chunk):
            raw = self.client.lrange(key, start, start + chunk - 1)
            for text in raw:  # type: ignore[union-attr]
                c = _correction(str(text))
                if c and c.advertiser_id == advertiser_id and period_key in (c.corrects_period, c.booked_period):
                    found += 1
                    if len(items) < limit:
                        items.append(c)
            if len(raw) < chunk:  # type: ignore[arg-type]
                break
        return CorrectionPage(advertiser_id, self.catalog.currency(advertiser_id), found, 0, limit, items)

    def find(self, advertiser_id: str, correction_id: str, chunk: int = 1000) -> Correction | None:
        """The advertiser's correction of this id, or None (reading the list in chunks, newest first)."""
        if not is_id(correction_id):
            return None
        key = self.keys.correction_list(advertiser_id)
        start = 0
        while True:
            raw = self.client.lrange(key, start, start + chunk - 1)
            for text in raw:  # type: ignore[union-attr]
                found = _correction(str(text))
                if found and found.correction_id == correction_id and found.advertiser_id == advertiser_id:
                    return found
            if len(raw) < chunk:  # type: ignore[arg-type]
                return None
            start += chunk


def _correction(text: str) -> Correction | None:
    try:
        return Correction.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError):
        return None  # a line we cannot read is not shown rather than failing the page
