"""Wall-clock latency of whole runs, timed with perf_counter_ns, warm-up rounds discarded.

A *round* runs every batch of the data once. Each input's latency is its median over
rounds; the latency reported is their spread across inputs (and their mean, the cost of
the whole workload per input). `time_rounds` times each batch of each round
for one or more sessions, interleaved batch by batch and in alternating order (A B, B A,
...), so that drift and bursts of load from other processes fall on both alike. On CUDA the inputs are copied
to the device once, outputs are bound on the device, and each run is synchronised before
the clock stops (I/O binding), so the time is the GPU's and not the launch's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

Runner = Callable[[int], None]  # runs batch i once


@dataclass(frozen=True)
class Spread:
    """Median, 10th / 90th percentiles and mean of a sample, and its size."""

    median: float
    p10: float
    p90: float
    n: int
    mean: float = float("nan")

    def to_json(self) -> dict:
        return {"median": self.median, "p10": self.p10, "p90": self.p90, "mean": self.mean, "n": self.n}


def spread(values: Sequence[float] | np.ndarray) -> Spread:
    """The Spread of `values` (NaN figures for an empty sample)."""
    a = np.asarray(values, dtype=np.float64).ravel()
    if a.size == 0:
        return Spread(float("nan"), float("nan"), float("nan"), 0)
    p10, median, p90 = np.percentile(a, [10, 50, 90])
    return Spread(float(median), float(p10), float(p90), int(a.size), float(a.mean()))


# ONNX Runtime's device name for the memory of each provider whose runs are timed through I/O binding
BOUND_DEVICES = {"CUDAExecutionProvider": "cuda"}


def make_runner(session: ort.InferenceSession, feeds: Sequence[Mapping[str, np.ndarray]]) -> Runner:
    """A Runner over `feeds`: plain `run` on the CPU, synchronised I/O binding on a GPU provider
    (BOUND_DEVICES), so that a run's time is the device's work, not copies to and from the host."""
    device = BOUND_DEVICES.get(session.get_providers()[0])
    if device is None:
        return lambda i: session.run(None, feeds[i])
    return BoundRunner(session, feeds, device)


class BoundRunner:
    """Inputs resident on `device`, outputs bound there, each run waited for (`synchronize_outputs`).
    On a GPU the copies happen once, before the timing; `device` "cpu" runs the same path on the
    CPU, as the tests do without a GPU."""

    def __init__(self, session: ort.InferenceSession, feeds: Sequence[Mapping[str, np.ndarray]], device: str):
        self.session = session
        self.values = []  # keeps the device copies alive as long as their bindings
        self.bindings = []
        outputs = [o.name for o in session.get_outputs()]
        for feed in feeds:
            binding = session.io_binding()
            values = {k: ort.OrtValue.ortvalue_from_numpy(v, device, 0) for k, v in feed.items()}
            for name, value in values.items():
                binding.bind_ortvalue_input(name, value)
            for name in outputs:
                binding.bind_output(name, device)
            self.values.append(values)
            self.bindings.append(binding)

    def __call__(self, i: int) -> None:
        self.session.run_with_iobinding(self.bindings[i])
        self.bindings[i].synchronize_outputs()


def time_rounds(runners: Sequence[Runner], batches: int, runs: int, warmup: int, first: int = 0,
                done: Callable[[], None] | None = None) -> np.ndarray:
    """Nanoseconds per batch, shape (runner, round, batch), warm-up rounds dropped.

    `first`: the number of the first round, where these continue rounds already run (the
    order of the runners alternates with it). `done`: called after each round, outside the timing."""
    samples = np.zeros((len(runners), warmup + runs, batches), dtype=np.int64)
    for r in range(warmup + runs):
        for b in range(batches):
            order = range(len(runners)) if (first + r + b) % 2 == 0 else reversed(range(len(runners)))
            for k in order:
                start = time.perf_counter_ns()
                runners[k](b)
                samples[k, r, b] = time.perf_counter_ns() - start
        if done is not None:
            done()
    return samples[:, warmup:, :]


def warm_up(runners: Sequence[Runner], batches: Sequence[int], runs: int) -> list[int]:
    """Run each runner `runs` times on each of `batches`, interleaved; the nanoseconds of each
    runner's last run (0 where none ran)."""
    last = [0] * len(runners)
    for b in batches:
        for _ in range(runs):
            for k, runner in enumerate(runners):
                start = time.perf_counter_ns()
                runner(b)
                last[k] = time.perf_counter_ns() - start
    return last


def first_of_each_shape(shapes: Sequence[object], seen: set | frozenset = frozenset()) -> list[int]:
    """The index of the first batch of each distinct input shape in `shapes`, past those `seen`:
    the batches a session warms up on (ONNX Runtime plans its memory per shape)."""
    found, firsts = set(seen), []
    for i, shape in enumerate(shapes):
        if shape not in found:
            found.add(shape)
            firsts.append(i)
    return firsts


def per_input_ms(samples: np.ndarray) -> np.ndarray:
    """Each input's latency in ms: its median over rounds, from (round, batch) nanoseconds.

    The median drops the rounds in which another process preempted the run."""
    return np.median(samples, axis=0) / 1e6


def batch_latency_ms(samples: np.ndarray) -> Spread:
    """The spread across inputs of their latencies (ms), from (round, batch) nanoseconds."""
    return spread(per_input_ms(samples))
