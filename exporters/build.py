"""Regenerate fixtures/: train every zoo model briefly, export it, write data and a README.

    python -m exporters.build --out fixtures

Seeded and deterministic on one machine (one thread; no wall times are recorded, so a re-run
writes the same files). Writes, per model,
`fixtures/<model>/{model.onnx, model.frozen.onnx (not dense), calib.npz, eval.npz,
state_dict.pt}`, then `fixtures/zoo.json` (corpus facts, configs, curves, eval NLL) and
`fixtures/README.md` (the same, for people).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from exporters.backbone import LanguageModel
from exporters.corpus import Corpus, load_corpus, unigram_entropy, windows_from_files
from exporters.earlyexit import EarlyExit
from exporters.export import export_frozen, export_live
from exporters.readme import measured_sections, render_readme
from exporters.train import Schedule, eval_nll, train
from exporters.zoo import MODELS, build_model

N_CALIB = 32
N_EVAL = 32
COMMAND = "python -m exporters.build --out fixtures"


def build(out: Path, models: list[str], seed: int, schedule: Schedule) -> dict:
    """Train, export and write every model in `models` under `out`; return zoo.json's content."""
    # One thread: these ops are tiny, and on a shared machine a second thread mostly waits
    # (10x slower under load); the results then do not depend on the core count either.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    corpus = load_corpus(seed)
    length = build_model("dense").cfg.context
    calib = windows_from_files(corpus.root, corpus.calib.files, N_CALIB, length, seed + 1)
    eval_ = windows_from_files(corpus.root, corpus.eval.files, N_EVAL, length, seed + 2)
    zoo = {
        "command": COMMAND,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "seed": seed,
        "corpus": _corpus_facts(corpus),
        "data": {"calib": list(calib.shape), "eval": list(eval_.shape)},
        "schedule": asdict(schedule),
        "models": {},
    }
    for name in models:
        started = time.perf_counter()
        torch.manual_seed(seed)
        model = build_model(name)
        curve = train(model, corpus.train.data, torch.from_numpy(eval_), schedule, seed=seed)
        entry = _finish_training(model, calib, eval_)
        entry["curve"] = curve
        _write_model(model, out / name, calib, eval_)
        zoo["models"][name] = entry
        seconds = time.perf_counter() - started
        print(f"{name}: eval NLL {entry['eval_nll']} nats ({seconds:.0f} s)", flush=True)
    zoo["models"] = _merged(out / "zoo.json", zoo)
    (out / "zoo.json").write_text(json.dumps(zoo, indent=1) + "\n")
    readme = out / "README.md"
    kept = measured_sections(readme.read_text()) if readme.is_file() else ""
    readme.write_text(render_readme(zoo) + kept)
    if kept:
        print(f"kept the measured sections of {readme}: re-measure them for the new fixtures")
    return zoo


def _corpus_facts(corpus: Corpus) -> dict:
    return {
        "source": "Python standard library .py files (sysconfig stdlib), byte-level",
        "files": {
            "train": len(corpus.train.files),
            "calib": len(corpus.calib.files),
            "eval": len(corpus.eval.files),
        },
        "train_bytes": len(corpus.train.data),
        "unigram_entropy_nats": round(unigram_entropy(corpus.train.data), 4),
        "eval_unigram_entropy_nats": round(unigram_entropy(corpus.eval.data), 4),
    }


def _finish_training(model: LanguageModel, calib: np.ndarray, eval_: np.ndarray) -> dict:
    """Calibrate what needs calibrating, put the model in eval mode; return its facts."""
    entry: dict = {}
    eval_ids = torch.from_numpy(eval_)
    if isinstance(model, EarlyExit):
        calib_conf = model.calibrate_threshold(torch.from_numpy(calib))
        with torch.no_grad():
            eval_conf = model.confidence(model.trunk(eval_ids)).mean(-1)
        entry["exit_after"] = model.exit_after
        entry["threshold"] = model.threshold.item()
        entry["calib_exits"] = int((calib_conf > model.threshold).sum())
        entry["eval_exits"] = int((eval_conf > model.threshold).sum())
    model.eval()
    entry["config"] = model.cfg.to_json()
    entry["parameters"] = sum(p.numel() for p in model.parameters())
    entry["coefficients"] = [c.to_json() for c in model.coefficients()]
    # EarlyExit decides per batch: one input per batch lets each take its own branch.
    one_by_one = isinstance(model, EarlyExit)
    entry["eval_nll"] = round(eval_nll(model, eval_ids, one_by_one=one_by_one), 4)
    return entry


def _write_model(model: LanguageModel, folder: Path, calib: np.ndarray, eval_: np.ndarray):
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / "state_dict.pt")
    export_live(model, folder / "model.onnx")
    if model.coefficients():
        export_frozen(model, folder / "model.frozen.onnx")
    np.savez(folder / "calib.npz", input_ids=calib)
    np.savez(folder / "eval.npz", input_ids=eval_)


def _merged(path: Path, zoo: dict) -> dict:
    """Return the models of `zoo` plus those of an earlier zoo.json built the same way.

    Lets `--models` rebuild a few models without dropping the others' records.
    """
    models = dict(zoo["models"])
    if path.is_file():
        old = json.loads(path.read_text())
        keys = ("python", "torch", "seed", "corpus", "data", "schedule")
        if all(old.get(k) == zoo[k] for k in keys):
            models = {**old["models"], **models}
    return {name: models[name] for name in MODELS if name in models}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("fixtures"))
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=Schedule.steps)
    args = parser.parse_args(argv)
    build(args.out, args.models, args.seed, Schedule(steps=args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
