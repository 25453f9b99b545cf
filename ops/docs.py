"""The generated parts of the docs: the settings page, from the settings object, and the data-flow picture, drawn
from its Graphviz source by `dot`.

`python -m ops.docs` (`make docs-generate`) writes both again; `--check` only says which is out of date, as
`tests/unit/test_docs.py` (`make docs`, in `make test`) does.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ops.settings import CLUSTER_DEFAULTS, PROJECT_ROOT, TOOL_VARIABLES, Settings, env_name

DOCS = PROJECT_ROOT / "docs"
SETTINGS_PAGE = DOCS / "settings.md"
PICTURE_SOURCE = DOCS / "dataflow.dot"
PICTURE = DOCS / "dataflow.svg"

GENERATE = "make docs-generate"

_SETTINGS_INTRO = f"""\
# Settings

<!-- Generated from ops/settings.py by `{GENERATE}` (python -m ops.docs): edit the settings, not this page. -->

Every process reads one settings object (`ops/settings.py`) from `ADBILL_*` environment variables; an unknown
`ADBILL_*` name is refused, so that a typo is not silently ignored. `adbill settings` prints every setting with the
value in force. `HOME` below is `ADBILL_HOME`. With `ADBILL_CLUSTER=1` (`adbill up --cluster`, `make up-cluster`)
the defaults of the "cluster" column apply; a variable that is set still wins.

This page is generated from the settings object, so it lists every setting: `make docs` fails when it is missing one
or names one that is gone.
"""


def _shown(value: Any) -> str:
    """A default as a person would set it: paths inside the repository relative to it, nothing as empty."""
    if value is None or value == "":
        return ""
    if isinstance(value, Path) and value.is_absolute() and value.is_relative_to(PROJECT_ROOT):
        value = value.relative_to(PROJECT_ROOT)
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_page() -> str:
    """docs/settings.md: every setting of `Settings` in the order of its fields, then the tools' variables."""
    lines = [_SETTINGS_INTRO, "| variable | default | cluster | what it does |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(Settings):
        cluster = _shown(CLUSTER_DEFAULTS[f.name]) if f.name in CLUSTER_DEFAULTS else ""
        lines.append(f"| `{env_name(f)}` | {_shown(f.default)} | {cluster} | {_cell(f.metadata['doc'])} |")
    lines += [
        "",
        "## Variables of the tools",
        "",
        "Not settings of the pipeline, but read by the `adbill` command; any value turns them on.",
        "",
        "| variable | what it does |",
        "| --- | --- |",
    ]
    lines += [f"| `{name}` | {_cell(doc)} |" for name, doc in TOOL_VARIABLES.items()]
    return "\n".join(lines) + "\n"


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


_STAMP = re.compile(r"<!-- drawn from docs/dataflow\.dot, sha256 ([0-9a-f]{64}) -->")


def drawn_from(svg: str) -> str | None:
    """The SHA-256 of the source a picture was drawn from, as `draw_picture` stamped it, or None."""
    found = _STAMP.search(svg)
    return found.group(1) if found else None


def dot_binary() -> str | None:
    """Graphviz's `dot`, which `adbill deps` installs (Debian's `graphviz`), or None when it is missing."""
    return shutil.which("dot")


def draw_picture(source: str, dot: str) -> str:
    """The SVG that `dot` draws from `source`, stamped with the source's SHA-256 after its XML declaration."""
    svg = subprocess.run([dot, "-Tsvg"], input=source, capture_output=True, text=True, check=True).stdout
    stamp = f"<!-- drawn from docs/dataflow.dot, sha256 {source_digest(source)} -->"
    head, sep, rest = svg.partition("\n")
    return f"{head}\n{stamp}\n{rest}" if head.startswith("<?xml") else f"{stamp}\n{svg}"


def out_of_date() -> list[str]:
    """The generated files that differ from what their sources give (the picture by its stamp)."""
    stale = []
    if not SETTINGS_PAGE.exists() or SETTINGS_PAGE.read_text() != settings_page():
        stale.append(str(SETTINGS_PAGE.relative_to(PROJECT_ROOT)))
    if not PICTURE.exists() or drawn_from(PICTURE.read_text()) != source_digest(PICTURE_SOURCE.read_text()):
        stale.append(str(PICTURE.relative_to(PROJECT_ROOT)))
    return stale


def main(argv: list[str] | None = None) -> int:
    """Write the settings page and draw the picture again; with `--check`, only name what is out of date."""
    parser = argparse.ArgumentParser(prog="python -m ops.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 naming each generated file out of date")
    args = parser.parse_args(argv)
    if args.check:
        stale = out_of_date()
        for name in stale:
            print(f"{name} is out of date: run `{GENERATE}`", file=sys.stderr)
        return 1 if stale else 0
    SETTINGS_PAGE.write_text(settings_page())
    print(f"wrote {SETTINGS_PAGE.relative_to(PROJECT_ROOT)}")
    dot = dot_binary()
    if dot is None:
        print("dot is not installed (Debian's graphviz; `adbill deps` installs it): picture not drawn", file=sys.stderr)
        return 1
    PICTURE.write_text(draw_picture(PICTURE_SOURCE.read_text(), dot))
    print(f"wrote {PICTURE.relative_to(PROJECT_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
