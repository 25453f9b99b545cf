"""The crawler list as the product searches it (`billing.store.crawler_list`): the pinned `crawler-user-agents`
package's patterns, one factored expression, the same verdict as the package's own `is_crawler` on every example the
project lists, on browsers, on near misses, and on the texts where Java's expressions would have differed."""

from __future__ import annotations

import random
import re

import crawleruseragents

from billing.store.crawler_list import crawler_list, factored_regex

BROWSERS = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (compatible; googlebot/2.1; +http://www.google.com/bot.html)",  # other letter case: no match
    "",
]

WHERE_JAVA_DIFFERS = [
    # Python's \d is any decimal digit, Java's only 0-9: a crawler to the package, not to Java.
    "BlogTraffic/\u0663.\u0664 Feed-Fetcher",
    # Java's $ also matches before a trailing \r\n, Python's only before a trailing \n: no crawler to the package.
    "x GoogleAssociationService\r\n",
    "x GoogleAssociationService\n",
    "x GoogleAssociationService\u2028",
]


def texts() -> list[str]:
    """The examples, browsers, the examples with a few characters changed (near misses), and the texts above."""
    examples = [ua for _, instances in crawler_list().examples for ua in instances]
    rng = random.Random(7)
    mutated = []
    for ua in examples:
        chars = list(ua)
        for _ in range(3):
            chars[rng.randrange(len(chars))] = rng.choice("abcXYZ/ .-_0")
        mutated.append("".join(chars))
    return [*examples, *BROWSERS, *mutated, *WHERE_JAVA_DIFFERS]


def test_each_pattern_matches_the_examples_the_project_lists_for_it() -> None:
    listed = crawler_list()
    assert len(listed.patterns) > 1_000 and listed.version
    pairs = [(pattern, ua) for pattern, instances in listed.examples for ua in instances]
    assert len(pairs) > 1_000
    assert [(p, ua) for p, ua in pairs if not re.search(p, ua)] == []
    assert not any(re.search(p, ua) for p in listed.patterns for ua in BROWSERS[:3])


def test_the_products_search_gives_the_packages_is_crawler_verdict() -> None:
    listed = crawler_list()
    uas = texts()
    found = {ua: listed.matches(ua) for ua in uas}
    assert [ua for ua in uas if found[ua] != crawleruseragents.is_crawler(ua)] == []
    assert listed.matches(None) is False
    assert sum(found.values()) > 1_000 and not any(found[ua] for ua in BROWSERS)
    assert found["BlogTraffic/\u0663.\u0664 Feed-Fetcher"] and not found["x GoogleAssociationService\r\n"]
    # The factored expression is the plain alternation's equal.
    plain, factored = re.compile(listed.regex), re.compile(factored_regex(listed.patterns))
    assert [bool(factored.search(ua)) for ua in uas] == [bool(plain.search(ua)) for ua in uas]
