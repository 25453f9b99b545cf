"""The data folder as the web UI offers it: each closed period's finished export (`EXPORTS/PERIOD/`, counted once
its manifest exists) and its files to download, and an advertiser's clicks not charged (a closed period's from its
export, an open one's as the stream decided). Reads only."""

from __future__ import annotations

from pathlib import Path

from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.export_files import (
    CSV_FILE,
    MANIFEST_FILE,
    NOT_CHARGED_FILE,
    PARQUET_FILE,
    SUMS_FILE,
    Manifest,
    read_manifest,
)
from billing.store.not_charged_clicks import NotChargedClick, not_charged_clicks
from web.readers import is_period_key

DOWNLOADABLE_FILES = (PARQUET_FILE, CSV_FILE, NOT_CHARGED_FILE, MANIFEST_FILE, SUMS_FILE)
"""The files of an export folder (`billing.store.export_files.write_export`), the only names a download may ask for;
`not_charged.parquet` is there when the period's clicks not charged were exported with it."""


class ExportFolder:
    """The exports of one data folder: `exports_dir` is its `exports` (`web.app.exports_dir`)."""

    def __init__(self, exports_dir: Path, period_length: Periods | None = None) -> None:
        self.exports_dir = exports_dir
        self.layout = DataLayout(exports_dir.parent)
        self.period_length = period_length or Periods()

    def finished(self) -> list[Manifest]:
        """Every finished export (its manifest written), newest period first."""
        if not self.exports_dir.is_dir():
            return []
        found = []
        for folder in sorted(self.exports_dir.iterdir(), reverse=True):
            manifest = folder / MANIFEST_FILE
            if not (is_period_key(folder.name) and manifest.is_file()):
                continue
            try:
                found.append(read_manifest(folder))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # not a manifest we can read: not offered for download
        return found

    def file(self, period_key: str, name: str) -> Path | None:
        """The file of a finished export, or None; only the known names of a period-named folder."""
        if not is_period_key(period_key) or name not in DOWNLOADABLE_FILES:
            return None
        folder = self.exports_dir / period_key
        path = folder / name
        return path if (folder / MANIFEST_FILE).is_file() and path.is_file() else None

    def not_charged_clicks(self, advertiser_id: str, start_ms: int, end_ms: int) -> list[NotChargedClick]:
        """The advertiser's billable clicks not charged in the periods starting in [start_ms, end_ms), newest first:
        a closed period's from its export, an open one's as the stream decided (`billing.store.not_charged_clicks`)."""
        return not_charged_clicks(self.layout, self.period_length, advertiser_id, start_ms, end_ms)
