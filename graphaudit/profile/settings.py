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
DEFAULT_BUDGET_S = 30.0  # seconds the profile's runs take at most, where the fewest allow it
DEFAULT_PRECISION = 0.02  # the latency interval's half-width, relative, at which timed rounds stop
# Faster than the baseline means a workload ratio (profile.baseline.workload_ratio) at or below this:
# the compute-savings verdict's threshold, which `run`'s timed rounds may also stop on (`decide_at`)
SAVINGS_RATIO_MAX = 0.95
INTERVAL_LEVEL = 0.95  # of the latency ratio's interval the verdict reads (profile.baseline.decision_interval)
# How much a profile runs where it chooses (profile/rounds.py); here, where the CLI's help reads them
FEWEST_RUNS = 3  # profiled runs of each node at least: a median that drops a run another process preempted
# Timed rounds at least where the precision decides. The latency's 95% interval is a bootstrap over
# the rounds of each input's median, and the median of n rounds lies between their extremes with
# probability 1 - 2^(1-n): from 3 rounds the interval held the true ratio in about 3 runs of 4,
# from 5 in 19 of 20 (simulated: tests/test_profile_rounds.py)
FEWEST_TIMED_ROUNDS = 5
MOST_CHOSEN_RUNS = 100  # timed rounds at most where the precision decides: past them the noise is the machine's
FEWEST_SAMPLE = 4  # inputs a chosen sample holds at least
# Inputs a chosen sample holds where every input does the same work (profile.baseline.same_work):
# their time is the rounds' to tell: the rounds' interval held the ratio in 93.8-94.1% of 2,000
# simulated workloads on 2 inputs, 94.4-94.9% on 4 (benchmarks/profile_rounds.py --alike), for half
# the time a round takes. Two, one from each half of the data, not one: time that depends on values
# alone (denormal numbers on a CPU) is not staked on a single input.
ALIKE_SAMPLE = 2
DEFAULT_WARMUP = 2  # ORT plans a shape's memory on its first run and allocates the plan on the second


@dataclass(frozen=True)
class ProfileSettings:
    """What the runtime profile is asked to do; None where the profile chooses.

    `sample`, `runs`, `profile_runs` None: chosen from measured times to fit `budget` seconds,
    the timed rounds stopping at `precision` (profile/rounds.py), or where `decide_at` is a ratio
    (the savings verdict's threshold, as `run` asks) once the answer on it is decided; `warmup`
    None: 2 runs of each input shape in each session. `batch_size` None: 1, or the model's own batch. `limit`:
    only the first N inputs. `trace`: a Chrome-trace file to write. `keep_profiles`: a folder
    for ONNX Runtime's profiler files. `block_pattern`: the blocks' regex (default: found from
    the graph). `feeding`: how the inputs are fed (graphaudit.load.feeding).
    """

    runs: int | None = None
    warmup: int | None = None
    profile_runs: int | None = None
    budget: float = DEFAULT_BUDGET_S
    precision: float = DEFAULT_PRECISION
    decide_at: float | None = None
    sample: int | None = None
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
