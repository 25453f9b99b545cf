"""The crawler list: the user-agent patterns of the `crawler-user-agents` project, shipped as the Python package of
that name at the version `requirements.lock` pins (DOMAIN.md, "Invalid traffic", rule `known_bot`).

A user agent matches when one of the patterns is found anywhere in it, case-sensitively: the package's own
`is_crawler` (its default). The patterns are written to be portable, and the product matches them in the JVM
(`attribution.invalid`, one regular expression for Spark's `rlike`, which is Java's `find`); Python's `re` here
serves the simulator's ground truth and the tests, which check that every pattern compiles in Java and matches the
package's example user agents there as it does in Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib.metadata import version

import crawleruseragents

PACKAGE = "crawler-user-agents"
"""The distribution that ships the list."""


@dataclass(frozen=True)
class CrawlerList:
    """The patterns of one version of the list."""

    version: str
    patterns: tuple[str, ...]
    examples: tuple[tuple[str, tuple[str, ...]], ...] = field(default=(), repr=False)
    """Each pattern with the example user agents the project lists for it."""

    @property
    def regex(self) -> str:
        """All patterns as one alternation, as the package joins them: what the JVM compiles."""
        return "|".join(self.patterns)

    def matches(self, user_agent: str | None) -> bool:
        """Whether `user_agent` is a known crawler's (None: no user agent, no match). A search through all patterns
        takes about a millisecond, so each text's answer is remembered (traffic repeats its user agents)."""
        return user_agent is not None and _search(self.regex, user_agent)

    def matching(self, user_agent: str) -> list[str]:
        """The patterns `user_agent` matches, for a person (the click's story)."""
        return [pattern for pattern in self.patterns if re.search(pattern, user_agent)]


@cache
def _compiled(regex: str) -> re.Pattern[str]:
    return re.compile(regex)


@lru_cache(maxsize=100_000)
def _search(regex: str, user_agent: str) -> bool:
    return _compiled(regex).search(user_agent) is not None


@cache
def crawler_list() -> CrawlerList:
    """The list the installed package holds."""
    data = crawleruseragents.CRAWLER_USER_AGENTS_DATA
    return CrawlerList(
        version=version(PACKAGE),
        patterns=tuple(entry["pattern"] for entry in data),
        examples=tuple((entry["pattern"], tuple(entry.get("instances", ()))) for entry in data),
    )
