"""The ad catalog: which advertiser and campaign an ad belongs to, and what one click on it costs.

Money is integer micros (millionths of the currency unit), never a float.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Ad:
    """One ad of the catalog; `cpc_micros` is the price of one billable click."""

    ad_id: str
    campaign_id: str
    advertiser_id: str
    cpc_micros: int
    currency: str

    def __post_init__(self) -> None:
        if isinstance(self.cpc_micros, bool) or not isinstance(self.cpc_micros, int):
            raise TypeError(f"ad {self.ad_id}: cpc_micros must be an integer number of micros")
        if self.cpc_micros < 0:
            raise ValueError(f"ad {self.ad_id}: cpc_micros must not be negative")
        if not (len(self.currency) == 3 and self.currency.isalpha() and self.currency.isupper()):
            raise ValueError(f"ad {self.ad_id}: currency must be an ISO 4217 code such as EUR")


class Catalog:
    """Ads by id. Immutable once built; as JSON with `to_json`/`from_json` (the file: `billing.store.catalog_file`).

    An ad id names one ad, and a campaign id one advertiser's campaign: the live totals are kept per campaign id
    (`billing.store.redis_totals`), so two advertisers sharing one would see each other's figures added to their own. A
    catalog where they do is refused.
    """

    def __init__(self, ads: Iterable[Ad]) -> None:
        self._ads: dict[str, Ad] = {}
        owners: dict[str, str] = {}
        for ad in ads:
            if ad.ad_id in self._ads:
                raise ValueError(f"ad {ad.ad_id} appears twice in the catalog")
            owner = owners.setdefault(ad.campaign_id, ad.advertiser_id)
            if owner != ad.advertiser_id:
                raise ValueError(
                    f"campaign {ad.campaign_id} belongs to advertiser {owner} and to {ad.advertiser_id} (ad "
                    f"{ad.ad_id}); a campaign id must name one advertiser's campaign, so rename one of them"
                )
            self._ads[ad.ad_id] = ad

    def __len__(self) -> int:
        return len(self._ads)

    def __iter__(self) -> Iterator[Ad]:
        return iter(self._ads.values())

    def __contains__(self, ad_id: object) -> bool:
        return ad_id in self._ads

    def get(self, ad_id: str) -> Ad | None:
        return self._ads.get(ad_id)

    def __getitem__(self, ad_id: str) -> Ad:
        return self._ads[ad_id]

    @property
    def ad_ids(self) -> list[str]:
        return list(self._ads)

    @property
    def advertiser_ids(self) -> list[str]:
        return sorted({ad.advertiser_id for ad in self._ads.values()})

    def to_json(self) -> str:
        return json.dumps({"ads": [asdict(ad) for ad in self._ads.values()]}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Catalog:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("ads"), list):
            raise ValueError('a catalog file is a JSON object {"ads": [...]}')
        return cls(Ad(**ad) for ad in data["ads"])


def generate_catalog(
    advertisers: int,
    campaigns_per_advertiser: int,
    ads_per_campaign: int,
    seed: int,
    currency: str = "EUR",
) -> Catalog:
    """A deterministic catalog: the same arguments give the same ads and prices."""
    rng = random.Random(f"catalog-{seed}")
    ads = []
    for a in range(advertisers):
        advertiser_id = f"adv-{a:04d}"
        for c in range(campaigns_per_advertiser):
            campaign_id = f"{advertiser_id}-cmp-{c:03d}"
            for n in range(ads_per_campaign):
                # Prices from 0.05 to 2.50 in whole cents, expressed in micros.
                cpc_micros = rng.randint(5, 250) * 10_000
                ads.append(Ad(f"{campaign_id}-ad-{n:03d}", campaign_id, advertiser_id, cpc_micros, currency))
    return Catalog(ads)
