"""adbill producers."""
