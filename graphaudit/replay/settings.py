"""The replay's settings: what a caller asks (`ReplaySettings`) and how the replay ran (`AppliedSettings`).

`ReplaySettings` is built once, by the CLI from its options or by `replay(**options)` from
keywords, and handed down whole. `AppliedSettings` is what the replay chose from it (the batch
size, the parity tolerance, the conditions that ran) and the notes on what it left out; its
`to_json()` is the report's `settings` object, built here only, in one fixed key order.

Importing this module stays light (no numpy, onnx or runtime): `graphaudit.audit` builds these.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from graphaudit.errors import GraphAuditError
from graphaudit.wording import CONFIDENCE

DEFAULT_TOLERANCE = 1e-4  # largest absolute output difference the parity check accepts, by default

if TYPE_CHECKING:
    from graphaudit.load.feeding import Feeding

# Most bootstrap resamples: each holds a float per input and quantity of every condition
MAX_RESAMPLES = 100_000


@dataclass(frozen=True)
class ReplaySettings:
    """What the frozen-controller replay is asked to do; None where the replay chooses.

    `coefficients`: names or globs, each maybe with its axes (`analyses.named_coefficients`);
    empty: those the model declares, else those detected. `conditions` None: every condition
    (`replay.conditions.REGISTRY`). `memory_limit` None: the capture's default. The others:
    see `replay.pipeline.replay`.
    """

    coefficients: Sequence[str] = ()
    conditions: Sequence[str] | None = None
    batch_size: int | None = None
    seed: int = 0
    cache_dir: str | os.PathLike | None = None
    tolerance: float | None = None
    memory_limit: int | None = None
    resamples: int = 1000
    confidence: float = CONFIDENCE
    provider: str = "cpu"
    threads: int | None = None
    flush_denormals: bool = True
    rewrite: bool = True
    output_kinds: Mapping[str, str] | None = None
    feeding: Feeding | None = None
    ray: str | None = None  # None: this process; "": an embedded local Ray; else a Ray cluster's address
    workers: int | None = None  # Ray workers (None: one per CPU core the cluster has)

    def __post_init__(self) -> None:
        # sequences as tuples, so that a caller's list cannot change the settings afterwards
        object.__setattr__(self, "coefficients", tuple(self.coefficients))
        if self.conditions is not None:
            object.__setattr__(self, "conditions", tuple(self.conditions))
        if not 1 <= self.resamples <= MAX_RESAMPLES:
            raise GraphAuditError(f"expected resamples in 1..{MAX_RESAMPLES}, found {self.resamples}", exit_code=2)
        tolerance = self.tolerance
        if tolerance is not None and (not math.isfinite(tolerance) or tolerance < 0):
            raise GraphAuditError(f"expected a parity tolerance that is a number of at least 0, found {tolerance}",
                                  exit_code=2)
        if self.ray is not None and self.cache_dir is not None:
            raise GraphAuditError("expected --cache-dir or --ray, found both: the workers hold their shards' "
                                  "coefficients in memory and keep no cache", exit_code=2)
        if self.workers is not None and self.ray is None:
            raise GraphAuditError(f"expected --workers with --ray, found --workers {self.workers} alone", exit_code=2)
        if self.workers is not None and self.workers < 1:
            raise GraphAuditError(f"expected at least 1 Ray worker, found {self.workers}", exit_code=2)

    @classmethod
    def of(cls, settings: ReplaySettings | None = None, **options: Any) -> ReplaySettings:
        """`settings` (default: the defaults) with the fields named in `options` replaced."""
        base = settings if settings is not None else cls()
        return replace(base, **options) if options else base


@dataclass(frozen=True)
class AppliedSettings(Mapping):
    """The replay's settings as it ran them, and its notes; read like the JSON `settings` object.

    The fields before `threads_note` are always in the report; the others only where the
    replay set them (None: absent), in the order of the fields below, which is the order the
    replay comes to them in.
    """

    batch_size: int | None
    resamples: int
    confidence: float
    tolerance: float
    conditions: tuple[str, ...]
    provider: str
    threads: int | None
    flush_denormals: bool
    rewrite: bool
    threads_note: str | None = None
    token_shuffle_note: str | None = None
    batch_size_note: str | None = None
    padding: str | None = None
    quantized_note: str | None = None
    live_decisions: tuple[str, ...] | None = None
    live_decisions_note: str | None = None
    rewrites: Mapping[str, int] | None = None
    tolerance_note: str | None = None
    rewrite_note: str | None = None
    failed_conditions: Mapping[str, str] | None = None
    failed_conditions_note: str | None = None
    no_nll: str | None = None
    cache: Mapping[str, object] | None = None
    cache_note: str | None = None
    distributed: Mapping[str, object] | None = None  # Ray: the address, workers, shards and retries
    distributed_note: str | None = None

    def to_json(self) -> dict:
        """The report's `settings` object: every field set, in field order."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) \
                else value
        return out

    def __getitem__(self, key: str) -> object:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())
