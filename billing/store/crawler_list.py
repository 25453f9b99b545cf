"""The crawler list: the user-agent patterns of the `crawler-user-agents` project, shipped as the Python package of
that name at the version `requirements.lock` pins (docs/billing-rules.md, "Invalid traffic", rule `known_bot`).

A user agent matches when one of the patterns is found anywhere in it, case-sensitively: the package's own
`is_crawler` (its default). Every part of the product searches it here, with Python's `re` as the package does:
the stream's driver once per distinct user agent (`attribution.charging`), reconciliation's driver on the final
matches (`attribution.final_bills.final_charges`), the click's story, the simulator's ground truth. Not in the JVM:
Java's expressions differ from Python's on a few texts (`\\d` and a non-ASCII digit, `$` before a trailing
carriage return), and one list must give one verdict.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache, cached_property, lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

import crawleruseragents

from billing.store.durable import write_whole

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
        """Whether `user_agent` is a known crawler's (None: no user agent, no match). The search runs the one
        expression with the patterns' prefixes merged (`factored_regex`, the plain alternation's equal: about 50 us
        a text against a millisecond), and each text's answer is remembered: traffic repeats its user agents."""
        return user_agent is not None and _search(self.factored, user_agent)

    @cached_property
    def factored(self) -> str:
        """`regex` with the patterns' literal prefixes merged (`factored_regex`)."""
        return factored_regex(self.patterns)

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


# --- The versions closed periods were judged with ------------------------------------------------------------


def keep_list(folder: Path, crawlers: CrawlerList) -> Path:
    """Keep `crawlers`' patterns as `folder/<version>.json`, once per version (each closing run keeps the installed
    one before it writes an export that names it): a closed period is judged with its own version when reconciled
    again, whatever version is installed then (docs/billing-rules.md: a new version applies to periods not yet
    closed)."""
    target = folder / f"{_file_name(crawlers.version)}.json"
    if target.exists():
        return target
    write_whole(
        target, json.dumps({"package": PACKAGE, "version": crawlers.version, "patterns": list(crawlers.patterns)})
    )
    return target


def kept_list(folder: Path, version: str) -> CrawlerList | None:
    """The patterns of `version` as kept by `keep_list`; the installed list when it is that version; None when
    neither (an export written before the lists were kept)."""
    installed = crawler_list()
    if version == installed.version:
        return installed
    path = folder / f"{_file_name(version)}.json"
    if path in _KEPT:  # a kept version's file is written once and never changes
        return _KEPT[path]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    if data.get("version") != version or not isinstance(data.get("patterns"), list):
        raise ValueError(f"{path} does not hold version {version} of the crawler list")
    listed = _KEPT[path] = CrawlerList(version=version, patterns=tuple(str(p) for p in data["patterns"]))
    return listed


_KEPT: dict[Path, CrawlerList] = {}
"""The kept versions read so far (a click story or a run reads one again and again, with its merged expression)."""


def _file_name(version: str) -> str:
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.+_-]*", version):
        raise ValueError(f"not a version of the crawler list: {version!r}")
    return version


# --- One regular expression the JVM matches fast ---------------------------------------------------------------

_QUANTIFIERS = frozenset("?*+{")
_LITERAL_ESCAPES = frozenset("/.()+!-_ :;,=@#%&~'\"<>[]{}|^$*?\\")


def _literal_prefix(pattern: str) -> tuple[list[str], str]:
    """(the pattern's leading literal characters, the rest of it). A character followed by a quantifier is not part
    of the prefix; a pattern with a `|` outside any group has no prefix (its branches do not share one)."""
    if _top_level_alternation(pattern):
        return [], pattern
    chars: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\" and i + 1 < len(pattern) and pattern[i + 1] in _LITERAL_ESCAPES:
            char, width = pattern[i + 1], 2
        elif pattern[i].isalnum() or pattern[i] in " /-_:;,=@#%&~'\"<>!":
            char, width = pattern[i], 1
        else:
            break
        if i + width < len(pattern) and pattern[i + width] in _QUANTIFIERS:
            break
        chars.append(char)
        i += width
    return chars, pattern[i:]


def _top_level_alternation(pattern: str) -> bool:
    depth = 0
    escaped = False
    in_class = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            return True
    return False


def _escaped(char: str) -> str:
    return char if char.isalnum() else "\\" + char


def factored_regex(patterns: tuple[str, ...]) -> str:
    """The alternation of `patterns` with their literal prefixes merged into a trie (`Googlebot|Googlebot-Image|
    Google-Read` becomes `Google(?:bot|-Read)`): the same matches for a search anywhere in a text, but at each position
    a regular-expression engine without a trie of its own (Python's) tries the few branches whose first character fits
    instead of every pattern. A pattern that is a prefix of another makes the longer one redundant."""
    root: dict[str, Any] = {}
    others: list[str] = []
    end = "\0end"
    for pattern in patterns:
        chars, rest = _literal_prefix(pattern)
        if not chars:
            others.append(pattern)
            continue
        node = root
        for char in chars:
            node = node.setdefault(char, {})
        node.setdefault(end, set()).add(rest)

    def emit(node: dict[str, Any]) -> str:
        rests: set[str] = node.get(end, set())
        if "" in rests:
            return ""  # matched here: whatever follows cannot add a match
        branches = [f"(?:{rest})" for rest in sorted(rests)]
        branches += [_escaped(char) + emit(child) for char, child in sorted(node.items()) if char != end]
        if len(branches) == 1:
            return branches[0]
        return "(?:" + "|".join(branches) + ")"

    top = [_escaped(char) + emit(child) for char, child in sorted(root.items())]
    return "|".join([*top, *(f"(?:{p})" for p in others)])
