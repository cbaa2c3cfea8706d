"""Regenerate fixtures/: train every zoo model briefly, export it, write data and a README.

    python -m exporters.build --out fixtures

Seeded and deterministic on one machine (2 threads). Writes, per model,
`fixtures/<model>/{model.onnx, model.frozen.onnx (not dense), calib.npz, eval.npz,
state_dict.pt}`, then `fixtures/zoo.json` (corpus facts, configs, curves, eval NLL) and
`fixtures/README.md` (the same, for people).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from exporters.corpus import load_corpus, unigram_entropy, windows_from_files
from exporters.earlyexit import EarlyExit
from exporters.export import export_frozen, export_live
from exporters.readme import render_readme
from exporters.train import Schedule, eval_nll, train
from exporters.zoo import MODELS, build_model

N_CALIB = 32
N_EVAL = 32
COMMAND = "python -m exporters.build --out fixtures"


def build(out: Path, models: list[str], seed: int, schedule: Schedule) -> dict:
    """Train, export and write every model in `models` under `out`; return zoo.json's content."""
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    started = time.perf_counter()
    corpus = load_corpus(seed)
    length = build_model("dense").cfg.context
    calib = windows_from_files(corpus.root, corpus.calib.files, N_CALIB, length, seed + 1)
    eval_ = windows_from_files(corpus.root, corpus.eval.files, N_EVAL, length, seed + 2)
    eval_ids = torch.from_numpy(eval_)
    zoo = {
        "command": COMMAND,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "seed": seed,
        "corpus": {
            "source": "Python standard library .py files (sysconfig stdlib), byte-level",
            "files": {
                "train": len(corpus.train.files),
                "calib": len(corpus.calib.files),
                "eval": len(corpus.eval.files),
            },
            "train_bytes": int(len(corpus.train.data)),
            "unigram_entropy_nats": round(unigram_entropy(corpus.train.data), 4),
            "eval_unigram_entropy_nats": round(unigram_entropy(corpus.eval.data), 4),
        },
        "data": {"calib": list(calib.shape), "eval": list(eval_.shape)},
        "schedule": schedule.__dict__,
        "models": {},
    }
    for name in models:
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        model = build_model(name)
        curve = train(model, corpus.train.data, eval_ids, schedule, seed=seed)
        entry: dict = {}
        if isinstance(model, EarlyExit):
            calib_conf = model.calibrate_threshold(torch.from_numpy(calib))
            entry["exit_after"] = model.exit_after
            entry["threshold"] = model.threshold.item()
            entry["calib_exits"] = int((calib_conf > model.threshold).sum())
            with torch.no_grad():
                conf = model.confidence(model.trunk(eval_ids)).mean(-1)
            entry["eval_exits"] = int((conf > model.threshold).sum())
        model.eval()
        entry.update(
            {
                "config": model.cfg.to_json(),
                "parameters": sum(p.numel() for p in model.parameters()),
                "coefficients": [c.to_json() for c in model.coefficients()],
                # EarlyExit decides per batch: one input per batch gives each its own branch.
                "eval_nll": round(eval_nll(model, eval_ids, one_by_one=name == "earlyexit"), 4),
                "curve": curve,
            }
        )
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), folder / "state_dict.pt")
        export_live(model, folder / "model.onnx")
        if model.coefficients():
            export_frozen(model, folder / "model.frozen.onnx")
        np.savez(folder / "calib.npz", input_ids=calib)
        np.savez(folder / "eval.npz", input_ids=eval_)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        zoo["models"][name] = entry
        print(f"{name}: eval NLL {entry['eval_nll']} nats ({entry['seconds']} s)", flush=True)
    zoo["seconds"] = round(time.perf_counter() - started, 1)
    (out / "zoo.json").write_text(json.dumps(zoo, indent=1) + "\n")
    (out / "README.md").write_text(render_readme(zoo))
    return zoo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("fixtures"))
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=Schedule.steps)
    args = parser.parse_args(argv)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    build(args.out, args.models, args.seed, Schedule(steps=args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
