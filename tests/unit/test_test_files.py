"""The suite's own layout: test folders are not packages, so pytest imports each test file by its name alone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert len(names) > 100
    shared = sorted(name for name, count in names.items() if count > 1)
    assert not shared, f"test files that share a name (pytest imports only the first of each): {shared}"
