"""What a frozen-controller replay found: its report, each condition's figures, the data it used.

`replay.pipeline.replay` gives back a ReplayReport; `to_json()` is the form the JSON report and
the renderers (graphaudit.report) read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.metrics import ConditionStats, Estimate, Task, difference
from graphaudit.metrics.stats import estimate
from graphaudit.replay.parity import Parity


@dataclass(frozen=True)
class ConditionResult:
    """The figures of one condition, each with its bootstrap interval."""

    name: str
    nll: Estimate
    delta_nll: Estimate
    divergence: Estimate  # KL from `correct` (or squared difference for non-logit outputs)
    accuracy: Estimate
    mse: Estimate  # against the data's targets
    delta_mse: Estimate = Estimate(None, None)  # mse − mse(correct), paired

    def to_json(self, divergence: str = "kl") -> dict:
        out = {"nll": self.nll.value, "delta_nll": self.delta_nll.value, "ci": _ci(self.delta_nll),
               "nll_ci": _ci(self.nll), divergence: self.divergence.value, f"{divergence}_ci": _ci(self.divergence)}
        for key, e in (("accuracy", self.accuracy), ("mse", self.mse), ("delta_mse", self.delta_mse)):
            if e.value is not None:
                out[key], out[f"{key}_ci"] = e.value, _ci(e)
        return out


@dataclass(frozen=True)
class DataUse:
    """Which inputs calibrated the profiles and which were replayed."""

    calibration: str
    calibration_inputs: int
    evaluation: str
    evaluation_inputs: int
    split: bool  # True: no evaluation data was given, the calibration inputs were halved
    shared_inputs: int = 0  # evaluation inputs identical to some calibration input (given data only)

    def to_json(self) -> dict:
        return {"calibration": self.calibration, "calibration_inputs": self.calibration_inputs,
                "evaluation": self.evaluation, "evaluation_inputs": self.evaluation_inputs, "split": self.split,
                "method": "seeded random disjoint halves of the calibration inputs" if self.split else "given",
                "shared_inputs": self.shared_inputs}


# settings key -> what its note is about, in the order reports give them
_SETTING_NOTES = (("padding", "padding"), ("tolerance_note", "parity"), ("token_shuffle_note", "conditions"),
                  ("failed_conditions_note", "conditions"), ("live_decisions_note", "freezing"),
                  ("rewrite_note", "rewrites"), ("quantized_note", "quantization"), ("cache_note", "cache"),
                  ("threads_note", "threads"), ("distributed_note", "workers"))


@dataclass(frozen=True)
class ReplayReport:
    """Everything `graphaudit replay` found; `to_json()` is its JSON form."""

    model: str
    coefficients: tuple[Coefficient, ...]
    seed: int
    data: DataUse | None = None
    task: Task | None = None
    parity: Parity | None = None
    conditions: tuple[ConditionResult, ...] = ()
    retained_gap: tuple[tuple[str, Estimate], ...] = ()
    variance: tuple[tuple[str, Mapping[str, Estimate]], ...] = ()
    # per family: the layers, and for each tensor its mean over inputs and slots at each position
    coefficient_means: tuple[tuple[str, tuple[int, ...], tuple[np.ndarray, ...]], ...] = field(default=(), repr=False)
    settings: Mapping[str, object] = field(default_factory=dict)  # an AppliedSettings, from `replay`
    timing: Mapping[str, float] = field(default_factory=dict)
    # per family of routing coefficients: how often each expert was chosen (analyses.routing.routing_shares)
    routing: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def controller(self) -> bool:
        return bool(self.coefficients)

    def setting_notes(self) -> list[tuple[str, str]]:
        """(what it is about, the note) for each note the settings hold on how the replay ran:
        padding left out, the parity tolerance chosen, a condition left out."""
        return [(about, str(self.settings[key])) for key, about in _SETTING_NOTES if self.settings.get(key)]

    def condition(self, name: str) -> ConditionResult:
        return next(c for c in self.conditions if c.name == name)

    def to_json(self) -> dict:
        divergence = self.task.divergence if self.task else "kl"
        return {
            "model": self.model,
            "controller": self.controller,
            "coefficients": [c.to_json() for c in self.coefficients],
            "seed": self.seed,
            "data": self.data.to_json() if self.data else None,
            "task": self.task.to_json() if self.task else None,
            "parity": self.parity.to_json() if self.parity else None,
            "conditions": {c.name: c.to_json(divergence) for c in self.conditions},
            "retained_gap": {name: e.value for name, e in self.retained_gap},
            "retained_gap_ci": {name: _ci(e) for name, e in self.retained_gap},
            "variance": {family: {**{k: e.value for k, e in shares.items()},
                                  "ci": {k: _ci(e) for k, e in shares.items()}}
                         for family, shares in self.variance},
            "coefficient_means": {family: {"layers": list(layers), "values": [np.round(v, 6).tolist() for v in values]}
                                  for family, layers, values in self.coefficient_means},
            "settings": dict(self.settings),
            "timing": dict(self.timing),
            "routing": {family: dict(entry) for family, entry in self.routing.items()},
        }


def condition_result(name: str, s: ConditionStats, correct: ConditionStats, task: Task, level: float) -> ConditionResult:
    scored = task.labels == "labels" and (task.logits or task.bernoulli)  # accuracy only against given labels
    return ConditionResult(name, estimate(*s.figure("nll"), level), difference(s, correct, "nll", level),
                           estimate(*s.figure("divergence"), level),
                           estimate(*s.figure("accuracy"), level) if scored else Estimate(None, None),
                           estimate(*s.figure("mse"), level), difference(s, correct, "mse", level))


def _ci(e: Estimate) -> list[float] | None:
    return list(e.ci) if e.ci is not None else None
