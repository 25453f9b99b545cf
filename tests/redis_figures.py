"""The tests' reads of the live figures in Redis: what the stream, reconciliation and closing wrote, key by key.

`RedisFigures` is the writer (`billing.store.redis_totals.RedisTotals`) plus the reads the tests check it with; the
product reads Redis through the web UI's reader (`web.readers`). Keys come from `billing.store.redis_keys`.
"""

from __future__ import annotations

from collections.abc import Iterable

from billing.store.redis_totals import RedisTotals, Totals


class RedisFigures(RedisTotals):
    """Reads and writes the live totals under one key prefix."""

    def corrections_of(self, period: str, level: str, item_id: str) -> Totals:
        """Signed sums of a period's corrections for an advertiser (`adv`), campaign (`cmp`) or ad (`ad`)."""
        return self._totals(self.keys.corrections(period, level, item_id))

    def periods(self) -> list[str]:
        return [_text(v) for v in self.client.zrange(self.keys.periods(), 0, -1)]  # type: ignore[union-attr]

    def advertisers(self, period: str) -> list[str]:
        return _texts(self.client.smembers(self.keys.period_advertisers(period)))  # type: ignore[arg-type]

    def advertiser(self, period: str, advertiser_id: str) -> Totals:
        return self._totals(self.keys.totals(period, "adv", advertiser_id))

    def campaign(self, period: str, campaign_id: str) -> Totals:
        return self._totals(self.keys.totals(period, "cmp", campaign_id))

    def ad(self, period: str, ad_id: str) -> Totals:
        return self._totals(self.keys.totals(period, "ad", ad_id))

    def ads(self, period: str, advertiser_id: str) -> list[str]:
        return _texts(self.client.smembers(self.keys.period_ads(period, advertiser_id)))  # type: ignore[arg-type]

    def campaigns(self, period: str, advertiser_id: str) -> list[str]:
        return _texts(self.client.smembers(self.keys.period_campaigns(period, advertiser_id)))  # type: ignore[arg-type]

    def late(self, period: str, level: str, item_id: str) -> dict[str, int]:
        """Late events of an ad (`level` `ad`) or an advertiser (`adv`) in a period: event type -> count."""
        values = self.client.hgetall(self.keys.late(period, level, item_id))
        return {_text(k).removesuffix("s"): int(v) for k, v in values.items()}  # type: ignore[union-attr]

    def clock_ahead(self, period: str, level: str, item_id: str) -> dict[str, int]:
        """Clock-ahead events of an ad (`level` `ad`) or an advertiser (`adv`) in a period: event type -> count."""
        values = self.client.hgetall(self.keys.clock_ahead(period, level, item_id))
        return {_text(k).removesuffix("s"): int(v) for k, v in values.items()}  # type: ignore[union-attr]

    def quarantined_for(self, advertiser_id: str) -> dict[str, int]:
        """Quarantined records on an advertiser's ads: reason -> count."""
        values = self.client.hgetall(self.keys.quarantined(advertiser_id))
        return {_text(k): int(v) for k, v in values.items()}  # type: ignore[union-attr]

    def quarantined(self) -> dict[str, dict[str, int]]:
        """Quarantined records: reason -> topic -> count."""
        out: dict[str, dict[str, int]] = {}
        for key in self.client.scan_iter(match=self.keys.quarantine("*")):
            reason = _text(key).rsplit(":", 1)[1]
            out[reason] = {_text(topic): int(n) for topic, n in self.client.hgetall(key).items()}  # type: ignore[union-attr]
        return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _texts(values: Iterable[bytes | str]) -> list[str]:
    return sorted(_text(v) for v in values)
