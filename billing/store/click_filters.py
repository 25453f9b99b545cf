"""The day filters of click ids: one small file a UTC day (`DataLayout.click_day_filter`,
`index/click-days/YYYYMMDD.bloom`) holding, for each closed period of the day, a split-block Bloom filter of every
click id its files name, so that a click's story reads only the periods that may hold it (docs/click-stories-at-
scale.md, "The figures": 1.5 bytes a click, 0.2 ms a period asked).

A period's part of the file names the files it **covers** (their path under the data folder, size and modification
time): every id of their id column (`click_files.ID_COLUMN`) is in the filter. The finder (`click_files.ClickFiles`)
lists a period's files as it always does and, where the filter says an id is not there, reads only the files the
part does not cover (a correction booked after the part was written, a file rewritten since): a filter can make a
lookup faster, never give another answer. A day with no file, or a period with no part, is read whole.

Written by reconciliation after its compaction of closed periods (`refresh_periods`, under the run lock) and again by
`adbill click-filters` (`rebuild_day`); each write replaces the day's file whole (staged, flushed, renamed), keeping
the other periods' parts as they were.

The hash is FNV-1a over the id's UTF-8 bytes, then splitmix64's finalizer, vectorized with numpy (stable: it is in the
files); the blocks are Parquet's split-block design (256-bit blocks, 8 bits set an id), `BITS_PER_ID` bits an id.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from billing.layout import DataLayout
from billing.store.durable import write_whole_bytes

_SALT = np.array(
    [0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31], dtype=np.uint32
)
BITS_PER_ID = 12
"""About 0.3 % of false positives for a split-block filter (Parquet's design: 256-bit blocks, 8 bits set per id)."""
MAGIC = b"ADBILLB2"
HASH = "fnv1a64+splitmix64"
BLOCK_BYTES = 32


def hash_ids(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """64-bit hashes of strings (nulls dropped): FNV-1a over their UTF-8 bytes, then splitmix64's finalizer."""
    ids = pc.drop_null(ids)
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    ids = ids.cast(pa.large_string())
    count = len(ids)
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int64)[ids.offset : ids.offset + count + 1]
    data = np.frombuffer(ids.buffers()[2], dtype=np.uint8) if count and ids.buffers()[2] else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    starts = offsets[:-1]
    hashes = np.full(count, 0xCBF29CE484222325, dtype=np.uint64)
    prime = np.uint64(0x100000001B3)
    with np.errstate(over="ignore"):
        for j in range(int(lengths.max(initial=0))):
            if (lengths > j).all():
                hashes = (hashes ^ data[starts + j].astype(np.uint64)) * prime
            else:
                live = lengths > j
                hashes[live] = (hashes[live] ^ data[starts[live] + j].astype(np.uint64)) * prime
        z = hashes + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        result: np.ndarray = z ^ (z >> np.uint64(31))
    return result


def block_and_masks(hashes: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Each hash's block of a filter of `blocks` blocks, and the eight 32-bit masks it sets there."""
    with np.errstate(over="ignore"):
        block = ((hashes >> np.uint64(32)) * np.uint64(blocks)) >> np.uint64(32)
        key = (hashes & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        bits = (key[:, None] * _SALT[None, :]) >> np.uint32(27)
    return block.astype(np.int64), np.left_shift(np.uint32(1), bits).astype(np.uint32)


def bloom_blocks(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The filter of `ids` (each distinct id once): (blocks, 8) 32-bit words, at least one block."""
    hashes = np.unique(hash_ids(ids))
    count = max(1, -(-len(hashes) * BITS_PER_ID // 256))
    words = np.zeros((count, 8), dtype=np.uint32)
    block, masks = block_and_masks(hashes, count)
    np.bitwise_or.at(words, block, masks)
    return words


def may_hold(words: bytes, blocks: int, click_id: str) -> bool:
    """Whether the filter whose block the id falls in is `words` (32 bytes) may hold `click_id`."""
    hashes = hash_ids(pa.array([click_id], pa.string()))
    _, masks = block_and_masks(hashes, blocks)
    found = np.frombuffer(words, dtype=np.uint32)
    return bool(((found & masks[0]) == masks[0]).all())


def block_of(blocks: int, click_id: str) -> int:
    """The block of a filter of `blocks` blocks that `click_id` falls in."""
    block, _ = block_and_masks(hash_ids(pa.array([click_id], pa.string())), blocks)
    return int(block[0])


Stamp = tuple[int, int]
"""A file's size and modification time (ns): what a part covers of it."""


def stamp(path: Path) -> Stamp | None:
    """`path`'s size and modification time, None when it is gone."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_size, info.st_mtime_ns


@dataclass(frozen=True)
class Part:
    """One period's filter in a day's file: where its blocks lie and the files it covers (path under the data
    folder -> `Stamp`)."""

    offset: int
    blocks: int
    covers: dict[str, Stamp]


class DayFilter:
    """A day's file, its header read once; `may_hold` reads one block of a part (module doc). The file stays open:
    a newer file renamed over it is never read with this one's header."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = open(path, "rb")  # noqa: SIM115 (kept open for the object's life)
        try:
            head = self._handle.read(len(MAGIC) + 4)
            if head[: len(MAGIC)] != MAGIC or len(head) < len(MAGIC) + 4:
                raise ValueError(f"{path} is not a file of click filters")
            length = struct.unpack("<I", head[len(MAGIC) :])[0]
            header = json.loads(self._handle.read(length))
        except BaseException:
            self._handle.close()
            raise
        if header.get("hash") != HASH or header.get("bits_per_id") != BITS_PER_ID:
            raise ValueError(f"{path}: filters of another hash ({header.get('hash')}, {header.get('bits_per_id')})")
        self.base = len(MAGIC) + 4 + length
        self.parts = {
            period: Part(int(part["offset"]), int(part["blocks"]), {k: (v[0], v[1]) for k, v in part["covers"].items()})
            for period, part in header["parts"].items()
        }

    def may_hold(self, period: str, click_id: str) -> bool:
        """Whether `period`'s covered files may name `click_id` (True when the day holds no part of it)."""
        part = self.parts.get(period)
        if part is None:
            return True
        block = block_of(part.blocks, click_id)
        words = os.pread(self._handle.fileno(), BLOCK_BYTES, self.base + part.offset + block * BLOCK_BYTES)
        if len(words) != BLOCK_BYTES:
            return True  # a file cut short: read the period whole
        return may_hold(words, part.blocks, click_id)

    def part_words(self, period: str) -> bytes:
        """The blocks of `period`'s part, as the file holds them."""
        part = self.parts[period]
        return os.pread(self._handle.fileno(), part.blocks * BLOCK_BYTES, self.base + part.offset)

    def close(self) -> None:
        self._handle.close()

    def __del__(self) -> None:
        self._handle.close()


class DayFilters:
    """The day files of one data folder, each read again when it changed (one per process, kept: the web's, the
    story command's)."""

    def __init__(self, layout: DataLayout) -> None:
        self.layout = layout
        self._held: dict[str, tuple[Stamp, DayFilter]] = {}

    def of(self, day: str) -> DayFilter | None:
        """The filter of `day` (`YYYYMMDD`), None when there is none (or it does not read: the day is read whole)."""
        path = self.layout.click_day_filter(day)
        now = stamp(path)
        if now is None:
            self._held.pop(day, None)
            return None
        held = self._held.get(day)
        if held is not None and held[0] == now:
            return held[1]
        try:
            day_filter = DayFilter(path)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self._held[day] = (now, day_filter)  # the one replaced is closed once no lookup holds it any more
        return day_filter

    def skippable(self, period: str, click_id: str) -> Callable[[Path], bool] | None:
        """For a lookup of `click_id` in `period`: which of its files need not be read (those the period's part
        covers, unchanged, when its filter says the id is not there); None when every file must be read."""
        day_filter = self.of(period[:8])
        if day_filter is None or period not in day_filter.parts or day_filter.may_hold(period, click_id):
            return None
        covers = day_filter.parts[period].covers
        root = self.layout.root

        def covered(path: Path) -> bool:
            key = _key(root, path)
            return key is not None and covers.get(key) == stamp(path)

        return covered


def ruled_out(chunk_filter: DayFilter, root: Path, path: Path, click_id: str) -> bool:
    """Whether a quarantine chunk's file `path` need not be read for `click_id`: its part (keyed by the file's path
    under the data folder) covers it as it is, and says the id is not there."""
    key = _key(root, path)
    part = chunk_filter.parts.get(key) if key is not None else None
    if key is None or part is None or part.covers.get(key) != stamp(path):
        return False
    return not chunk_filter.may_hold(key, click_id)


def _key(root: Path, path: Path) -> str | None:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return None


def period_ids(files: Iterable[tuple[Path, str]]) -> tuple[pa.Array, dict[Path, Stamp]]:
    """Every id of `files` (each with its id column), and each file's stamp as read; a file gone, or one that does not
    read, is left out (not covered)."""
    arrays: list[pa.Array] = []
    stamps: dict[Path, Stamp] = {}
    for path, column in files:
        before = stamp(path)
        if before is None:
            continue
        try:
            table = pq.read_table(path, columns=[column])
        except (OSError, pa.ArrowException, KeyError):
            continue  # gone, or it does not read (a broken file): not covered, so a lookup reads it as it is
        if stamp(path) != before:
            continue  # rewritten while read: not covered, so always read
        arrays.append(table.column(column).combine_chunks().cast(pa.string()))
        stamps[path] = before
    return (pa.concat_arrays(arrays) if arrays else pa.array([], pa.string())), stamps


def write_day(
    layout: DataLayout,
    day: str,
    new: dict[str, tuple[pa.Array, dict[Path, Stamp]]],
    keep: Callable[[str], bool] = lambda part: True,
) -> Path:
    """Write `day`'s file with the parts of `new` (period -> its ids and the files they come from) in place of those
    periods' parts, and every other part the file held that `keep` keeps as it was. The file's path."""
    path = layout.click_day_filter(day)
    kept: dict[str, tuple[bytes, int, dict[str, Stamp]]] = {}
    if path.exists():
        try:
            old = DayFilter(path)
            for period, part in old.parts.items():
                if period not in new and keep(period):
                    kept[period] = (old.part_words(period), part.blocks, part.covers)
            old.close()
        except (OSError, ValueError, KeyError, TypeError):
            kept = {}  # a file that does not read is written anew from what is given
    for period, (ids, stamps) in new.items():
        words = bloom_blocks(ids)
        covers = {_key(layout.root, p) or str(p): s for p, s in stamps.items()}
        kept[period] = (words.tobytes(), len(words), covers)
    header_parts: dict[str, Any] = {}
    offset = 0
    for period in sorted(kept):
        words_bytes, blocks, covers = kept[period]
        header_parts[period] = {"offset": offset, "blocks": blocks, "covers": {k: list(v) for k, v in covers.items()}}
        offset += len(words_bytes)
    header = json.dumps({"hash": HASH, "bits_per_id": BITS_PER_ID, "parts": header_parts}, sort_keys=True).encode()

    def write(out: IO[bytes]) -> None:
        out.write(MAGIC + struct.pack("<I", len(header)) + header)
        for period in sorted(kept):
            out.write(kept[period][0])

    write_whole_bytes(path, write)
    return path


def days_of(periods: Sequence[str]) -> dict[str, list[str]]:
    """`periods` by their UTC day (`YYYYMMDD`)."""
    out: dict[str, list[str]] = {}
    for period in periods:
        out.setdefault(period[:8], []).append(period)
    return out
