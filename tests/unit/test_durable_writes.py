"""Every file the product writes whole goes through one writer (`billing.store.durable.write_whole`): a writer killed
between any two of its steps leaves the old file or the new one, whole, never half of one, and never a staging
file a reader takes for the file."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from billing.catalog import generate_catalog
from billing.events import Click
from billing.reconcile_plan import PeriodState
from billing.store import durable
from billing.store.catalog_file import load_catalog, save_catalog
from billing.store.conflict_files import _read_sent, _write_sent
from billing.store.crawler_list import CrawlerList, keep_list
from billing.store.invoice_files import write_invoice_file
from billing.store.period_states import load_states, save_record, save_states
from billing.store.schema_registry import FileSchemaRegistry
from producers.simulator import write_capture

Write = Callable[[Path, int], Path]
"""Writes generation `n` of a file under a folder; returns the file's path."""
Read = Callable[[Path], int]
"""The generation of the whole file at a path (raises when it is not whole)."""


def _catalog(folder: Path, n: int) -> Path:
    save_catalog(generate_catalog(3, 2, 2 + n, seed=n), folder / "catalog.json")
    return folder / "catalog.json"


def _record(folder: Path, n: int) -> Path:
    save_record(folder / "last-run.json", {"generation": n, "padding": "x" * 200_000})
    return folder / "last-run.json"


def _capture(folder: Path, n: int) -> Path:
    write_capture(
        [Click(f"c{n}-{i}", "ad-1", "u", 1_800_000_000_000 + i) for i in range(n * 500)], folder / "run.jsonl"
    )
    return folder / "run.jsonl"


def _kept_list(folder: Path, n: int) -> Path:
    return keep_list(folder / "lists", CrawlerList(f"1.{n}", tuple(f"bot{i}" for i in range(1000))))


def _registry(folder: Path, n: int) -> Path:
    """Version `n` of a subject registered in a registry file: a record of `n` fields, the later ones optional."""
    fields = [{"name": "f0", "type": "string"}]
    fields += [{"name": f"f{i}", "type": ["null", "string"], "default": None} for i in range(1, n)]
    FileSchemaRegistry(folder / "schemas.json").register(
        "s", json.dumps({"type": "record", "name": "R", "fields": fields})
    )
    return folder / "schemas.json"


def _invoice(folder: Path, n: int) -> Path:
    write_invoice_file(folder, "2026-01", "adv-1", json.dumps({"generation": n, "lines": ["x" * 100] * 2_000}))
    return folder / "2026-01" / "adv-1.json"


def _states(folder: Path, n: int) -> Path:
    save_states(folder / "periods.json", {f"2026010{n}T{h:02d}00Z": PeriodState(version=n) for h in range(24)})
    return folder / "periods.json"


def _conflicts_sent(folder: Path, n: int) -> Path:
    _write_sent(folder / "sent.json", {f"p{i}": {f"k{i}"} for i in range(n * 1_000)})
    return folder / "sent.json"


def _plain(folder: Path, n: int) -> Path:
    durable.write_whole(folder / "plain.txt", f"{n}\n" * 100_000)
    return folder / "plain.txt"


WRITERS: dict[str, tuple[Write, Read]] = {
    "catalog file": (_catalog, lambda p: len(load_catalog(p)) // 6 - 2),  # 3 advertisers x 2 campaigns x (2 + n) ads
    "reconciliation record": (_record, lambda p: int(json.loads(p.read_text())["generation"])),
    "capture": (_capture, lambda p: len(p.read_text().splitlines()) // 500),
    "kept crawler list": (_kept_list, lambda p: int(json.loads(p.read_text())["version"].split(".")[1])),
    "periods' states": (_states, lambda p: {s.version for s in load_states(p).values()}.pop()),
    "id conflicts sent": (_conflicts_sent, lambda p: len(_read_sent(p)) // 1_000),
    "any text": (_plain, lambda p: int(set(p.read_text().splitlines()).pop())),
    "invoice file": (_invoice, lambda p: int(json.loads(p.read_text())["generation"])),
    "schema registry file": (_registry, lambda p: len(FileSchemaRegistry(p).versions("s"))),
}


WRITTEN_ONCE = {"kept crawler list", "invoice file"}
"""Writers of a file that is never replaced (a kept list per version, an issued invoice): killed before its rename,
the file is not there at all."""


@pytest.mark.parametrize("step", durable.STEPS)
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_writer_killed_between_its_steps_leaves_the_old_file_or_the_new_one_whole(
    writer: str, step: str, tmp_path: Path
) -> None:
    write, read = WRITERS[writer]
    first = write(tmp_path, 1) if writer not in WRITTEN_ONCE else None
    if first is not None:
        assert read(first) == 1
    child = os.fork()
    if child == 0:  # pragma: no cover - the child is killed at `step`

        def kill(at: str, target: Path) -> None:
            if at == step:
                os.kill(os.getpid(), signal.SIGKILL)

        durable.step_hook = kill
        try:
            write(tmp_path, 2)
        finally:
            os._exit(3)
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, "the writer was killed at its step"
    # The file and, for the registry, its lock file (held while it writes, never read as the file).
    files = [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith(".") and p.suffix != ".lock"]
    expected = {"staged": 1, "flushed": 1, "renamed": 2}[step]
    if first is None and expected == 1:
        assert files == [], "a file written once, killed before its rename, is not there at all"
    else:
        assert len(files) == 1 and read(files[0]) == expected
    staging = [p for p in tmp_path.rglob(".*") if p.is_file()]
    assert len(staging) == (0 if step == "renamed" else 1), "a staging file is hidden (a dot-file) beside its target"


def test_a_writer_that_fails_leaves_no_staging_file(tmp_path: Path) -> None:
    def fail(out: object) -> None:
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        durable.write_whole(tmp_path / "a" / "b.json", fail)
    assert [p.name for p in (tmp_path / "a").iterdir()] == []
