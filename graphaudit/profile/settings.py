"""The profile's settings: how many rounds, at what optimisation level, on which inputs.

`ProfileSettings` is built once, by the CLI from its options or by `profile_model(**options)`
from keywords, and handed down whole. Importing this module stays light (no numpy, onnx or
runtime): `graphaudit.audit` builds one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphaudit.load.feeding import Feeding

OPT_LEVEL_NAMES = ("disable", "basic", "extended", "layout", "all")  # --opt-level, ONNX Runtime's levels in order
DEFAULT_BUDGET_S = 30.0  # seconds the profile's rounds take at most, where the fewest allow it


@dataclass(frozen=True)
class ProfileSettings:
    """What the runtime profile is asked to do; None where the profile chooses.

    `runs`, `warmup`, `profile_runs` None: chosen from the first round's time to fit `budget`
    seconds (`rounds.choose_rounds`). `batch_size` None: 1, or the model's own batch. `limit`:
    only the first N inputs. `trace`: a Chrome-trace file to write. `keep_profiles`: a folder
    for ONNX Runtime's profiler files. `block_pattern`: the blocks' regex (default: found from
    the graph). `feeding`: how the inputs are fed (graphaudit.load.feeding).
    """

    runs: int | None = None
    warmup: int | None = None
    profile_runs: int | None = None
    budget: float = DEFAULT_BUDGET_S
    batch_size: int | None = None
    provider: str = "cpu"
    opt_level: str = "all"
    threads: int | None = None
    limit: int | None = None
    trace: str | os.PathLike | None = None
    keep_profiles: str | os.PathLike | None = None
    block_pattern: str | None = None
    feeding: Feeding | None = None

    @classmethod
    def of(cls, settings: ProfileSettings | None = None, **options: Any) -> ProfileSettings:
        """`settings` (default: the defaults) with the fields named in `options` replaced."""
        base = settings if settings is not None else cls()
        return replace(base, **options) if options else base
