"""adbill web."""
