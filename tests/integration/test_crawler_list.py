"""The crawler list in the JVM: every pattern of the pinned `crawler-user-agents` package compiles in Java and
matches the project's example user agents there as it does in Python (its own `is_crawler`), one pattern at a time
and as the one expression the job matches (`attribution.invalid.known_bot`)."""

from __future__ import annotations

import random
import re

import crawleruseragents
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from attribution.invalid import known_bot
from billing.store.crawler_list import crawler_list, factored_regex

pytestmark = pytest.mark.integration

BROWSERS = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (compatible; googlebot/2.1; +http://www.google.com/bot.html)",  # other letter case: no match
    "",
]


def texts() -> list[str]:
    """The examples, browsers, and the examples with a few characters changed (near misses)."""
    examples = [ua for _, instances in crawler_list().examples for ua in instances]
    rng = random.Random(7)
    mutated = []
    for ua in examples:
        chars = list(ua)
        for _ in range(3):
            chars[rng.randrange(len(chars))] = rng.choice("abcXYZ/ .-_0")
        mutated.append("".join(chars))
    return [*examples, *BROWSERS, *mutated]


def test_every_pattern_compiles_in_java_and_matches_its_examples_as_in_python(spark: SparkSession) -> None:
    listed = crawler_list()
    assert len(listed.patterns) > 1_000 and listed.version
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    refused = []
    for pattern in listed.patterns:
        try:
            jvm.java.util.regex.Pattern.compile(pattern)
        except Exception as exc:  # noqa: BLE001 - a pattern Java refuses is the finding
            refused.append((pattern, str(exc)[:200]))
    assert refused == []
    pairs = [(pattern, ua) for pattern, instances in listed.examples for ua in instances]
    pairs += [(pattern, ua) for pattern in listed.patterns for ua in BROWSERS[:3]]
    frame = spark.createDataFrame(pairs, "pattern string, ua string")
    in_java = {
        (r["pattern"], r["ua"]): r["found"]
        for r in frame.select("*", F.expr("ua rlike pattern").alias("found")).collect()
    }
    differ = [(p, ua) for (p, ua), found in in_java.items() if found != (re.search(p, ua) is not None)]
    assert differ == []
    # The project's examples are its crawlers: each is found by its own pattern.
    assert all(in_java[(p, ua)] for p, instances in listed.examples for ua in instances)


def test_the_jobs_one_expression_matches_as_the_packages_is_crawler(spark: SparkSession) -> None:
    uas = texts()
    frame = spark.createDataFrame([(ua,) for ua in uas], "ua string").union(
        spark.createDataFrame([(None,)], "ua string")
    )
    found = {r["ua"]: r["bot"] for r in frame.select("ua", known_bot(F.col("ua")).alias("bot")).collect()}
    assert found[None] is False
    differ = [ua for ua in uas if found[ua] != crawleruseragents.is_crawler(ua)]
    assert differ == []
    assert sum(found[ua] for ua in uas) > 1_000 and not any(found[ua] for ua in BROWSERS)
    # The factored expression is the plain alternation's equal in Python too.
    listed = crawler_list()
    plain, factored = re.compile(listed.regex), re.compile(factored_regex(listed.patterns))
    assert [bool(factored.search(ua)) for ua in uas] == [bool(plain.search(ua)) for ua in uas]
