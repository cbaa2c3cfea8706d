"""The cyclic garbage collector, paused while a large acyclic structure is built."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large, acyclic structure is built.

    Building a graph allocates a few objects per node and frees none; every collection
    the allocations trigger would walk all of them again, which makes the build
    quadratic-looking on large models (measured in benchmarks/static_bench.py).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
