"""A batch's log line: the wall time of each step, and the full collections of Python's heap that fell in the batch
(the driver holds the whole catalog: a full pass walks all of it)."""

from __future__ import annotations

import gc

from attribution.job import FullCollections, _PhaseClock


def test_a_batchs_log_line_says_when_a_full_collection_fell_in_it() -> None:
    collections = FullCollections()
    try:
        quiet = _PhaseClock(collections)
        quiet.lap("write")
        assert str(quiet).startswith("write ") and "full collection" not in str(quiet)
        clock = _PhaseClock(collections)
        gc.collect()
        clock.lap("write")
        assert "; 1 full collection(s) of Python's heap" in str(clock)
        assert collections.count == 1 and collections.seconds >= 0
    finally:
        gc.callbacks.remove(collections)
