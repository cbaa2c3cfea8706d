"""Progress on stderr for the steps of an audit that take more than a moment.

The library reports progress through a plain callable, `progress(stage, done, total)`, so
that Python users can pass their own (or none). `ProgressBar` is the CLI's: one line on
stderr, redrawn in place, finished with a newline when a stage completes; it stays silent
when stderr is not a terminal or when asked to be quiet, so logs and pipes stay clean.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TextIO, TypeVar

T = TypeVar("T")


class Progress(Protocol):
    def __call__(self, stage: str, done: int, total: int | None) -> None: ...


def silent(stage: str, done: int, total: int | None) -> None:
    """A progress callback that shows nothing."""


def track(items: Iterable[T], stage: str, progress: Progress | None, total: int | None = None) -> Iterator[T]:
    """Yield `items`, reporting each one done to `progress` under `stage`."""
    report = progress or silent
    if total is None:
        total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
    report(stage, 0, total)
    for done, item in enumerate(items, 1):
        yield item
        report(stage, done, total)


class ProgressBar:
    """Draws `stage [#####-----] done/total` on stderr; silent off a terminal or when quiet."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False, width: int = 28,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and _isatty(self.stream)
        self.width = width
        self.clock = clock
        self._stage: str | None = None
        self._started = 0.0
        self._open = False

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        if not self.enabled:
            return
        if stage != self._stage:
            self._finish_line()
            self._stage, self._started = stage, self.clock()
        elapsed = self.clock() - self._started
        if total:
            filled = min(self.width, round(self.width * done / total))
            bar = f"[{'#' * filled}{'-' * (self.width - filled)}] {done}/{total}"
        else:
            bar = f"{done}" if done else "…"
        self.stream.write(f"\r{stage:<30.30} {bar} {elapsed:5.1f}s\x1b[K")
        self._open = True
        if total and done >= total:
            self._finish_line()
        self.stream.flush()

    def close(self) -> None:
        """End the current line, if one is open."""
        if self.enabled:
            self._finish_line()
            self.stream.flush()

    def _finish_line(self) -> None:
        if self._open:
            self.stream.write("\n")
            self._open = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
