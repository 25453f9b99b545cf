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


def test_one_clock_serves_every_batch_and_watches_the_collector_once() -> None:
    """The sink's clock registers its watch of the collector when it is made; each batch restarts it, and the
    collector's callbacks do not grow from batch to batch."""
    collections = FullCollections()
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic pass: only the one the test makes falls in a batch
    try:
        clock = _PhaseClock(collections)
        registered = len(gc.callbacks)
        for batch in range(4):
            assert clock.restart() is clock and clock.laps == []
            if batch == 2:
                gc.collect()
            clock.lap("write")
            assert str(clock).startswith("write ") and str(clock).count(" s") == (2 if batch == 2 else 1)
            assert ("; 1 full collection(s) of Python's heap" in str(clock)) == (batch == 2), batch
            assert len(gc.callbacks) == registered, batch
        assert gc.callbacks.count(collections) == 1 and collections.count == 1
    finally:
        gc.callbacks.remove(collections)
        if was_enabled:
            gc.enable()
