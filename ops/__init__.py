"""adbill ops."""
