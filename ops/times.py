"""A moment given on the command line (`--at`, `--until`): epoch milliseconds or an ISO-8601 time. A module of its own
so that a command that takes a moment (`adbill catalog set-price --at`) does not import what reconciliation imports."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_time(text: str, option: str = "--until") -> int:
    """Epoch ms from `1767225600000` or an ISO-8601 time (UTC unless it says otherwise)."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise SystemExit(
            f"{option}: {text!r} is neither epoch ms nor an ISO-8601 time such as 2026-01-01T10:00Z"
        ) from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
