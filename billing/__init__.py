"""adbill billing."""
