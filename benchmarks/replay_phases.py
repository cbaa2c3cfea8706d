"""Where `replay()` spends its time on a model whose weights are inline and large.

    python benchmarks/replay_phases.py [--width 768] [--vocab 32000] [--rounds 3] [--threads 1] [--model PATH]

An untrained FeatureGate at `--width` and `--vocab` (about 280 MB at the defaults, its weights
inline, exported to a temporary folder) is replayed `--rounds` times on the zoo's FeatureGate
data (32 calibration and 32 evaluation inputs, conditions `correct` and `cross_input`, 50
resamples), and `replay()`'s own timing of each phase is printed: the captures of both input
sets (sessions of the trace graph, runs, cache), the parity check (the frozen graph's session
and its first batch against the live one), the replay loop and the variance decomposition.
`--model` replays that file instead (a FeatureGate-shaped model whose metadata declares gates).
Only `replay()`'s public interface is used, so that the same script times older code too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphaudit.replay.pipeline import replay  # noqa: E402

FIXTURES = ROOT / "fixtures" / "featuregate"
PHASES = ("capture_s", "parity_s", "replay_s", "variance_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", type=Path, help="a model file to replay instead of exporting one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = args.model or _export(args.width, args.vocab, Path(folder))
        print(f"# {path.name}: {path.stat().st_size / 1e6:.0f} MB, {args.threads} intra-op thread(s)")
        rows = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            report = replay(path, FIXTURES / "calib.npz", FIXTURES / "eval.npz", conditions=("correct", "cross_input"),
                            resamples=50, threads=args.threads)
            rows.append({"total_s": time.perf_counter() - start, **{k: report.timing[k] for k in PHASES}})
        print("| phase | " + " | ".join(f"round {i + 1}" for i in range(len(rows))) + " | median |")
        print("|---|" + "---:|" * (len(rows) + 1))
        for key in ("total_s", *PHASES):
            values = [r[key] for r in rows]
            print(f"| {key.removesuffix('_s')} | " + " | ".join(f"{v:.2f} s" for v in values)
                  + f" | {statistics.median(values):.2f} s |")


def _export(width: int, vocab: int, folder: Path) -> Path:
    from exporters.export import export_live
    from exporters.zoo import build_model

    model = build_model("featuregate", d_model=width, d_ff=2 * width, n_heads=max(1, width // 16), vocab=vocab).eval()
    path = folder / f"featuregate_{width}_{vocab}.onnx"
    export_live(model, path)
    return path


if __name__ == "__main__":
    main()
