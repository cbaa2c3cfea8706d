"""Frozen-controller replay on every trained zoo model: the tables of fixtures/README.md.

    python benchmarks/replay_zoo.py [--models featuregate,mudd,moe,earlyexit,earlyexit@1] [--batch-size 16]
                                    [--seed 0] [--resamples 1000] [--json out.json]

Runs `graphaudit.replay.pipeline.replay` on fixtures/<model>/model.onnx with calib.npz (profiles)
and eval.npz (replayed), every condition, and prints two Markdown tables: ΔNLL per
condition with 95% bootstrap intervals, and retained gap, KL and the variance split.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphaudit.replay.pipeline import replay  # noqa: E402

FIXTURES = ROOT / "fixtures"
# NAME@B replays NAME at batch size B: EarlyExit's If decides once per batch (every input
# must be confident), so at batch size 1 each input decides for itself.
MODELS = ("featuregate", "mudd", "moe", "earlyexit", "earlyexit@1")


def _delta(c: dict) -> str:
    lo, hi = c["ci"]
    return f"{c['delta_nll']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def _pct(value, ci=None) -> str:
    if value is None:
        return "—"
    text = f"{100 * value:.1f}%"
    return text if not ci else f"{text} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    docs = {}
    for name in args.models.split(","):
        model, _, batch = name.partition("@")
        folder = FIXTURES / model
        report = replay(folder / "model.onnx", folder / "calib.npz", folder / "eval.npz",
                        batch_size=int(batch or args.batch_size), seed=args.seed, resamples=args.resamples)
        docs[name] = report.to_json()
    conditions = ("cross_input", "token_shuffle", "static_layer", "static_position", "global_mean")
    print("| model | parity max abs Δ | NLL correct | " + " | ".join(f"ΔNLL {c}" for c in conditions) + " |")
    print("|---|---|---|" + "---|" * len(conditions))
    for name, doc in docs.items():
        cs = doc["conditions"]
        print(f"| {name} | {doc['parity']['max_abs_diff']:.1e} | {cs['correct']['nll']:.4f} | "
              + " | ".join(_delta(cs[c]) for c in conditions) + " |")
    print("\n| model | retained gap static_layer | retained gap static_position | KL cross_input | KL token_shuffle"
          " | η² layer | (layer, slot) | input | token |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, doc in docs.items():
        cs, gap, gci = doc["conditions"], doc["retained_gap"], doc["retained_gap_ci"]
        for family, v in doc["variance"].items():
            print(f"| {name} ({family}) | {_pct(gap.get('static_layer'), gci.get('static_layer'))} | "
                  f"{_pct(gap.get('static_position'), gci.get('static_position'))} | "
                  f"{cs['cross_input']['kl']:.4f} | {cs['token_shuffle']['kl']:.4f} | "
                  + " | ".join(_pct(v[k], v["ci"][k]) for k in ("eta2_layer", "layer_slot_share", "input_share",
                                                               "token_share")) + " |")
    if args.json:
        args.json.write_text(json.dumps(docs, indent=1))


if __name__ == "__main__":
    main()
