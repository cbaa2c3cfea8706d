"""The zoo's table of models: build one by name, or load a trained one from fixtures/."""

from __future__ import annotations

from pathlib import Path

import torch

from exporters.backbone import Config, Dense, LanguageModel
from exporters.earlyexit import EarlyExit
from exporters.featuregate import FeatureGate
from exporters.moe import MoE
from exporters.mudd import MUDD

MODELS: dict[str, type[LanguageModel]] = {
    "dense": Dense,
    "featuregate": FeatureGate,
    "mudd": MUDD,
    "moe": MoE,
    "earlyexit": EarlyExit,
}


def build_model(name: str, **cfg) -> LanguageModel:
    """Return a fresh (untrained) zoo model; `cfg` overrides fields of Config."""
    if name not in MODELS:
        raise KeyError(f"expected a zoo model name ({', '.join(MODELS)}), found {name!r}")
    return MODELS[name](Config(**cfg))


def load_trained(name: str, fixtures_dir: str | Path, **cfg) -> LanguageModel:
    """Return the trained model `name` from `fixtures_dir/<name>/state_dict.pt`, in eval mode."""
    model = build_model(name, **cfg)
    state = torch.load(Path(fixtures_dir) / name / "state_dict.pt", weights_only=True)
    model.load_state_dict(state)
    return model.eval()
