"""adbill attribution."""
