"""How many timed rounds the profile needs before its latency interval can be trusted, and how
soon it knows: the stopping rule of `graphaudit.profile.rounds.TimedRounds`, simulated and measured.

    python benchmarks/profile_rounds.py [--simulate 400] [--pair MODEL,BASELINE,DATA ...]
                                        [--sample 4] [--rounds 30] [--answers 200] [--alike 400]

1. **simulated**: a model 1.1 times as slow as its baseline over 4 inputs (each input its own
   ratio, 0.99-1.21), every call off by seeded noise of its own and each round by a load both
   share, in four settings (quiet; noisy calls; a load that drifts from round to round; calls
   preempted now and then, up to twice as long). For each, `--simulate` seeded profiles are
   stopped by the profile's rule at ±2% (`TimedRounds`' checkpoints, a 95% bootstrap over the
   rounds as `profile.baseline.ratio_interval` draws it) with at least 3 and at least 5 rounds,
   each reading one of two statistics of the workload ratio: the ratio of medians (each input's
   median latency summed, model over baseline; what the profile read until the paired one) and
   the paired one the profile reads (`profile.baseline.workload_ratio`: each input's median over
   rounds of its model run over the baseline run beside it, weighted by the baseline's median).
   Each row: how often the interval at the stop holds the true ratio (95% is what it claims)
   and the mean rounds run.
2. **measured**: for each `--pair` (an ONNX model, its baseline, an .npz of their inputs), the
   two are timed in alternation exactly as the profile times them (its session options, threads
   blocking between runs, `latency.time_rounds`) for `--rounds` rounds on `--sample` inputs
   spread over the data; then, at each of the rule's checkpoints, the half-width each statistic
   reaches, and the round at which each would have stopped at ±2% with at least 5 rounds, read
   from every start of the recorded rounds (each start a profile begun at another moment).

3. **answers** (`--answers N`): N seeded profiles of the simulated model scaled to each of a few
   true ratios around the compute-savings threshold (0.95), in two noisy settings, stopped by
   the profile's rule at ±2% or at most 40 rounds, once timing on to the precision (`graphaudit
   profile`, `run --profile-until precision`) and once also stopping when the answer is decided
   (`run`'s default, `decide_at`); each row: the verdict's answers (`savings_answer` on
   `decision_interval`), the wrong ones (a yes where the true ratio is past 0.95, a no where it is
   not), and the mean rounds run.

4. **alike** (`--alike N`): N seeded workloads of 32 inputs that do the same work (one true
   ratio, 0.8-1.2, for all of them), per setting and per sample of 4, 2 and 1 inputs, timed for
   the fewest rounds; the rounds' interval as the profile reads it where every input does the same
   work (`profile.baseline.compare(..., alike=True)`, not widened for the inputs left out): how
   often it holds the ratio, and its mean half-width. The sample a profile chooses for such inputs
   (`ALIKE_SAMPLE`) rests on it.

Prints Markdown tables for benchmarks/NOTES.md. Nothing is asserted about time.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphaudit.load.data import input_specs, load_data  # noqa: E402
from graphaudit.load.model import load_for_runtime  # noqa: E402
from graphaudit.profile.baseline import (  # noqa: E402
    INTERVAL_LEVEL,
    RESAMPLES,
    compare,
    decision_interval,
    over_rounds,
    workload_latency,
    workload_ratio,
)
from graphaudit.profile.latency import make_runner, time_rounds, warm_up  # noqa: E402
from graphaudit.profile.rounds import CHECKPOINTS, TimedRounds, sample_rows  # noqa: E402
from graphaudit.profile.session import open_session, runnable_model, session_options  # noqa: E402
from graphaudit.profile.settings import (  # noqa: E402
    ALIKE_SAMPLE,
    DEFAULT_PRECISION,
    DEFAULT_WARMUP,
    FEWEST_TIMED_ROUNDS,
    SAVINGS_RATIO_MAX,
)
from graphaudit.verdict.compute_savings import savings_answer  # noqa: E402

INPUTS = 4
SETTINGS = {  # name: (each call's own noise, the round's shared load, share of calls preempted)
    "quiet": (0.01, 0.01, 0.0),
    "noisy calls (3%)": (0.03, 0.01, 0.0),
    "load drifting (10% a round)": (0.02, 0.10, 0.0),
    "calls preempted (8%, up to 2x)": (0.03, 0.05, 0.08),
}


def ratio_of_medians(model: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """The workload ratio per resample: each input's median summed, model over baseline."""
    return workload_latency(model) / workload_latency(baseline)


STATISTICS = {"ratio of medians": ratio_of_medians, "paired": workload_ratio}


def halfwidth(statistic, model: np.ndarray, baseline: np.ndarray) -> float:
    """The 95% interval's half-width, relative to the estimate, from (round, input) times."""
    interval = over_rounds(statistic, (model, baseline), INTERVAL_LEVEL, RESAMPLES, 0)
    estimate = float(statistic(model[None], baseline[None])[0])
    return (interval.high - interval.low) / 2 / estimate


def stop(statistic, model: np.ndarray, baseline: np.ndarray, fewest: int) -> int | None:
    """The round at which the profile's rule (`TimedRounds`, at least `fewest` rounds) stops at
    DEFAULT_PRECISION, reading `statistic`'s interval; None where the recorded rounds end first."""
    rule = TimedRounds(None, DEFAULT_PRECISION, math.inf, lambda m, b: halfwidth(statistic, m, b), fewest=fewest)
    done = next((k for k in range(1, len(model) + 1) if not rule.more(model[:k], baseline[:k], 0.0)), None)
    return done if rule.stop == "precision" else None


def simulated(rng: np.random.Generator, noise: float, load: float, preempted: float, rounds: int = 60,
              scale: float = 1.1):
    """(model, baseline, true ratio): (round, input) times of the setting's model and baseline,
    the model's inputs 0.9-1.1 times `scale` as slow as the baseline's."""
    base = np.linspace(0.5e6, 1.5e6, INPUTS)[None, :]
    ratio = np.linspace(0.9, 1.1, INPUTS)[None, :] * scale
    shared = rng.lognormal(0.0, load, (rounds, 1))

    def calls() -> np.ndarray:
        slow = 1 + (rng.random((rounds, INPUTS)) < preempted) * rng.random((rounds, INPUTS))
        return rng.lognormal(0.0, noise, (rounds, INPUTS)) * slow

    return base * ratio * shared * calls(), base * shared * calls(), float((base * ratio).sum() / base.sum())


def simulate(count: int) -> None:
    print(f"### Simulated: {count} seeded profiles per setting, stopped at ±{DEFAULT_PRECISION:.0%}\n")
    rules = [(name, statistic, fewest) for name, statistic in STATISTICS.items() for fewest in (3, FEWEST_TIMED_ROUNDS)]
    print("| setting | " + " | ".join(f"{name}, at least {fewest}" for name, _, fewest in rules) + " |")
    print("|---|" + "---|" * len(rules))
    for setting, (noise, load, preempted) in SETTINGS.items():
        cells = []
        for _, statistic, fewest in rules:
            held, runs = 0, []
            for seed in range(count):
                model, baseline, truth = simulated(np.random.default_rng(seed), noise, load, preempted)
                done = stop(statistic, model, baseline, fewest) or len(model)
                interval = over_rounds(statistic, (model[:done], baseline[:done]), INTERVAL_LEVEL, RESAMPLES, 0)
                held += interval.low <= truth <= interval.high
                runs.append(done)
            cells.append(f"holds {held / count:.0%}, {np.mean(runs):.1f} rounds")
        print(f"| {setting} | " + " | ".join(cells) + " |")
    print()


ANSWER_SETTINGS = ("calls preempted (8%, up to 2x)", "noisy calls (10%)")
ANSWER_RATIOS = (0.90, 0.945, 0.951, 0.955, 1.09)
ANSWER_ROUNDS = 40


def answered(model: np.ndarray, baseline: np.ndarray, decide_at: float | None) -> tuple[str, int]:
    """(the verdict's answer, rounds run) once the profile's rule stops the rounds: at the
    precision, ANSWER_ROUNDS (as a budget would) or, given `decide_at`, once it is decided."""
    rule = TimedRounds(None, DEFAULT_PRECISION, ANSWER_ROUNDS, decide_at=decide_at, inputs=INPUTS)
    done = next(k for k in range(1, ANSWER_ROUNDS + 1) if not rule.more(model[:k], baseline[:k], float(k)))
    interval = decision_interval(model[:done], baseline[:done], INPUTS)
    return savings_answer(interval.low, interval.high), done


def answers(count: int) -> None:
    print(f"### The answers, timed to ±{DEFAULT_PRECISION:.0%} or also stopped once decided: {count} seeded profiles "
          f"each, at most {ANSWER_ROUNDS} rounds\n")
    print("| setting | true ratio | to the precision: yes / no / inconclusive, wrong, rounds | "
          "stopped once decided: the same |")
    print("|---|---:|---|---|")
    settings = {**SETTINGS, "noisy calls (10%)": (0.10, 0.05, 0.0)}
    unit = simulated(np.random.default_rng(0), 0.0, 0.0, 0.0, 1, 1.0)[2]  # the true ratio at scale 1
    for setting in ANSWER_SETTINGS:
        noise, load, preempted = settings[setting]
        for target in ANSWER_RATIOS:
            cells = []
            for decide_at in (None, SAVINGS_RATIO_MAX):
                said, runs, truth = [], [], 0.0
                for seed in range(count):
                    model, baseline, truth = simulated(np.random.default_rng(seed), noise, load, preempted,
                                                       ANSWER_ROUNDS, target / unit)
                    answer, done = answered(model, baseline, decide_at)
                    said.append(answer)
                    runs.append(done)
                wrong = said.count("yes" if truth > SAVINGS_RATIO_MAX else "no")
                cells.append(f"{said.count('yes')} / {said.count('no')} / {said.count('inconclusive')}, "
                             f"**{wrong} wrong**, {np.mean(runs):.1f} rounds")
            print(f"| {setting} | {truth:.3f} | " + " | ".join(cells) + " |")
    print()


ALIKE_SETTINGS = {  # name: (each run's own noise, the round's shared load, share of runs preempted, up to 2x)
    "quiet runs, a busy machine (1%, 20% a round)": (0.01, 0.20, 0.0),
    "noisy calls (3%)": (0.03, 0.01, 0.0),
    "load drifting (10% a round)": (0.02, 0.10, 0.0),
    "calls preempted (8%, up to 2x)": (0.03, 0.05, 0.08),
}
ALIKE_INPUTS = 32
ALIKE_SAMPLES = (4, ALIKE_SAMPLE, 1)


def alike(count: int) -> None:
    print(f"### Inputs that do the same work: {count} seeded workloads of {ALIKE_INPUTS} inputs per setting, "
          f"{FEWEST_TIMED_ROUNDS} rounds on a sample of each size\n")
    print("| setting | " + " | ".join(f"on {n} input{'s' if n > 1 else ''}: holds, half-width" for n in ALIKE_SAMPLES)
          + " |")
    print("|---|" + "---|" * len(ALIKE_SAMPLES))
    for setting, (noise, load, preempted) in ALIKE_SETTINGS.items():
        cells = []
        for sample in ALIKE_SAMPLES:
            held, widths = 0, []
            for seed in range(count):
                rng = np.random.default_rng(seed)
                ratio = rng.uniform(0.8, 1.2)
                shared = rng.lognormal(0.0, load, (FEWEST_TIMED_ROUNDS, 1))
                times = []
                for scale in (ratio, 1.0):  # the model's runs, then the baseline's
                    runs = 1e6 * scale * shared * rng.lognormal(0.0, noise, (FEWEST_TIMED_ROUNDS, sample))
                    hit = rng.random(runs.shape) < preempted
                    runs[hit] *= rng.uniform(1.0, 2.0, int(hit.sum()))
                    times.append(runs)
                interval = compare("baseline", times[0], times[1], inputs=ALIKE_INPUTS, alike=True).ratio_interval
                held += interval.low <= ratio <= interval.high
                widths.append((interval.high - interval.low) / 2 / ratio)
            cells.append(f"{held} / {count}, ±{np.mean(widths):.2%}")
        print(f"| {setting} | " + " | ".join(cells) + " |")
    print()


def measure(pair: str, sample: int, rounds: int) -> None:
    model_path, baseline_path, data_path = pair.split(",")
    loaded = [load_for_runtime(model_path), load_for_runtime(baseline_path)]
    data = load_data(data_path, input_specs(loaded[0].model))
    batches = list(data.batches(1))
    chosen = sample_rows(len(batches), sample)
    feeds = [batches[i][1] for i in chosen]
    sessions = [open_session(runnable_model(m), ["CPUExecutionProvider"],
                             session_options("all", None, None, None, spinning=False)) for m in loaded]
    runners = [make_runner(s, feeds) for s in sessions]
    warm_up(runners, [0], DEFAULT_WARMUP)
    times = np.concatenate([time_rounds(runners, len(feeds), 1, 0, first=r) for r in range(rounds)], axis=1)
    model, baseline = times.astype(float)
    per_run = np.median(model) / 1e6, np.median(baseline) / 1e6
    print(f"### {_named(model_path)} against {_named(baseline_path)}: {rounds} rounds of {len(feeds)} inputs "
          f"(a run {per_run[0]:.1f} / {per_run[1]:.1f} ms)\n")
    ratios = {name: float(statistic(model[None], baseline[None])[0]) for name, statistic in STATISTICS.items()}
    print("estimates over all rounds: " + ", ".join(f"{name} {value:.4f}" for name, value in ratios.items()) + "\n")
    print("| rounds | " + " | ".join(f"{name} half-width" for name in STATISTICS) + " |")
    print("|---:|" + "---:|" * len(STATISTICS))
    for done in sorted(k for k in {FEWEST_TIMED_ROUNDS, *CHECKPOINTS, rounds} if FEWEST_TIMED_ROUNDS <= k <= rounds):
        print(f"| {done} | " + " | ".join(f"±{halfwidth(s, model[:done], baseline[:done]):.2%}"
                                         for s in STATISTICS.values()) + " |")
    print("\n| first round | " + " | ".join(f"{name}: stops after" for name in STATISTICS) + " |")
    print("|---:|" + "---:|" * len(STATISTICS))
    for start in range(0, max(1, rounds - FEWEST_TIMED_ROUNDS), max(1, rounds // 8)):
        stops = [stop(s, model[start:], baseline[start:], FEWEST_TIMED_ROUNDS) for s in STATISTICS.values()]
        print(f"| {start} | " + " | ".join("not within the rounds" if s is None else str(s) for s in stops) + " |")
    print()


def _named(path: str) -> str:
    return f"{Path(path).parent.name}/{Path(path).name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulate", type=int, default=400, help="Seeded profiles per setting (0: none).")
    parser.add_argument("--pair", action="append", default=[], help="MODEL,BASELINE,DATA to time (repeatable).")
    parser.add_argument("--sample", type=int, default=4, help="Inputs timed in each round.")
    parser.add_argument("--rounds", type=int, default=30, help="Rounds timed for each pair.")
    parser.add_argument("--answers", type=int, default=0,
                        help="Seeded profiles per setting and true ratio whose answers are counted (0: none).")
    parser.add_argument("--alike", type=int, default=0,
                        help="Seeded workloads of alike inputs per setting and sample size (0: none).")
    args = parser.parse_args()
    if args.rounds < FEWEST_TIMED_ROUNDS or args.sample < 1:
        parser.error(f"expected --rounds of at least {FEWEST_TIMED_ROUNDS} and --sample of at least 1")
    print(f"{platform.machine()}, {platform.python_version()}; the interval: {INTERVAL_LEVEL:.0%}, "
          f"{RESAMPLES} resamples over rounds, seed 0\n")
    if args.simulate:
        simulate(args.simulate)
    if args.answers:
        answers(args.answers)
    if args.alike:
        alike(args.alike)
    for pair in args.pair:
        measure(pair, args.sample, args.rounds)


if __name__ == "__main__":
    main()
