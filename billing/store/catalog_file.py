"""The ad catalog's JSON file (`billing.catalog.Catalog.to_json`), saved atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from billing.catalog import Catalog


def save_catalog(catalog: Catalog, path: str | os.PathLike[str]) -> None:
    """Write atomically: readers see the old file or the new one, never half of one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".catalog-")
    with os.fdopen(fd, "w") as out:
        out.write(catalog.to_json())
    os.replace(tmp, target)


def load_catalog(path: str | os.PathLike[str]) -> Catalog:
    """The catalog in the JSON file `path`; ValueError, naming the file, when it does not read or is refused."""
    try:
        return Catalog.from_json(Path(path).read_text())
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"cannot read the ad catalog {path}: {exc}") from exc
