"""Pausing Python's cyclic garbage collector around work that builds many long-lived objects."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block (restored after, if it was on).

    Parsing, passes and scheduling build O(instructions) linked, long-lived objects and drop few: each time
    their count grows by a quarter of the heap the collector walks the whole heap for nothing (a third of
    the scheduler's time on 100k-instruction modules). Reference counting still frees what the block drops;
    its few cycles wait for the next collection after it. What the block made joins the oldest generation
    (`gc.freeze`/`gc.unfreeze`) instead of the youngest: re-enabling the collector would otherwise start by
    walking every object the block made, nearly all still alive (0.3-0.5 s after a pipeline on a
    13k-instruction module); its garbage cycles wait for the next full collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()
