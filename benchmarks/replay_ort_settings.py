"""Frozen replay at batch 16 under generic ONNX Runtime session settings, against PyTorch eager + hooks.

    python benchmarks/replay_ort_settings.py [--models featuregate,mudd] [--batch-size 16] [--threads 1]
                                             [--rounds 9]

For each zoo model, the frozen graph and the 12 condition feeds (2 batches × 6 conditions at
batch 16) exactly as `replay_fca.Setup` builds them, and forward runs only: one ORT `run` of
the frozen graph per feed, fetching the logits, with (1) the replay's own session
(`Setup.bare_session`: ORT_ENABLE_ALL less `slow_fusions()`); (2) ORT's defaults
(SkipLayerNormFusion back on); (3) ORT_ENABLE_BASIC / ORT_ENABLE_EXTENDED less `slow_fusions()`;
(4) the replay's settings with the batch and sequence dimensions of `input_ids` fixed
(`add_free_dimension_override_by_name`, full-shape batches only); (5) the replay's settings
with `session.intra_op.allow_spinning` = 0; (6) the replay's session through IO binding
(`bind_cpu_input`, logits into a preallocated OrtValue, `run_with_iobinding`; binding timed).
Against PyTorch eager: the trained model (`exporters.zoo.load_trained`), forward hooks on the
controller modules substituting the same coefficients (as `replay_fca.torch_replay`), forward
only under `torch.inference_mode()` on --threads threads, on the same feeds.
Every contender's logits are first checked against (1) on every feed (max abs diff ≤ 1e-4).
Timing: `time.perf_counter_ns` per pass over the feeds, one warm-up pass each discarded, all
contenders alternating within each of --rounds rounds; median ms per run (pass / 12) with
min–max, and PyTorch / ORT as the ratio of the medians. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replay_fca import FIXTURES, HOOKED_MODULES, Setup  # noqa: E402  (benchmarks/ is the script's own directory)

from exporters.zoo import load_trained  # noqa: E402
from graphaudit.load.model import load_model  # noqa: E402
from graphaudit.replay.surgery import Freeze  # noqa: E402
from graphaudit.runtime.sessions import create_session, slow_fusions  # noqa: E402

TOLERANCE = 1e-4
LEVELS = ort.GraphOptimizationLevel
REPLAY = "1. replay's session"
Run = Callable[[int], object]  # runs prepared feed i, returns its logits (array, OrtValue or tensor)


def ort_contenders(setup: Setup, threads: int, prepared: list[dict]) -> tuple[dict[str, Run], list[str]]:
    """The ORT variants, each a function of the feed index, and notes on variants left out."""
    frozen = Freeze(setup.coefs)(load_model(FIXTURES / setup.name / "model.onnx").model).model
    output = setup.task.output

    def plain(session: ort.InferenceSession) -> Run:
        return lambda i: session.run([output], prepared[i])[0]

    def variant(level=LEVELS.ORT_ENABLE_ALL, disabled=slow_fusions(), configure=lambda options: None) -> Run:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.graph_optimization_level = level
        configure(options)
        return plain(create_session(frozen, options=options, disabled_optimizers=disabled))

    contenders = {REPLAY: plain(setup.bare_session),
                  "2. ORT defaults (SkipLayerNormFusion on)": variant(disabled=()),
                  "3. ORT_ENABLE_BASIC": variant(LEVELS.ORT_ENABLE_BASIC),
                  "3. ORT_ENABLE_EXTENDED": variant(LEVELS.ORT_ENABLE_EXTENDED)}
    notes = []
    ids = next(i for i in frozen.graph.input if i.name == "input_ids")
    batch_dim, seq_dim = (d.dim_param for d in ids.type.tensor_type.shape.dim)
    shapes = {feed["input_ids"].shape for feed in prepared}
    if not (batch_dim and seq_dim):
        notes.append(f"4. free dimension override skipped: input_ids dims are not both symbolic ({batch_dim!r}, {seq_dim!r})")
    elif len(shapes) != 1 or next(iter(shapes))[0] != setup.batch_size:
        notes.append(f"4. free dimension override skipped: not every batch is full-shape ({sorted(shapes)})")
    else:
        (rows, length), = shapes

        def fix(options: ort.SessionOptions) -> None:
            options.add_free_dimension_override_by_name(batch_dim, rows)
            options.add_free_dimension_override_by_name(seq_dim, length)
        contenders[f"4. fixed dims ({batch_dim}={rows}, {seq_dim}={length})"] = variant(configure=fix)
    contenders["5. allow_spinning 0"] = variant(
        configure=lambda options: options.add_session_config_entry("session.intra_op.allow_spinning", "0"))
    contenders["6. IO binding, preallocated output"] = io_bound(setup.bare_session, output, prepared)
    return contenders, notes


def io_bound(session: ort.InferenceSession, output: str, prepared: list[dict]) -> Run:
    """Run through one IOBinding; the logits go into a buffer preallocated per input shape."""
    binding = session.io_binding()
    buffers: dict[tuple, ort.OrtValue] = {}
    for feed in prepared:
        if feed["input_ids"].shape not in buffers:
            logits = session.run([output], feed)[0]
            buffers[feed["input_ids"].shape] = ort.OrtValue.ortvalue_from_shape_and_type(logits.shape, logits.dtype)

    def run(i: int) -> ort.OrtValue:
        for name, array in prepared[i].items():
            binding.bind_cpu_input(name, array)
        buffer = buffers[prepared[i]["input_ids"].shape]
        binding.bind_ortvalue_output(output, buffer)
        session.run_with_iobinding(binding)
        return buffer
    return run


def torch_contender(setup: Setup, prepared: list[dict]) -> Run:
    """PyTorch eager forward; hooks on the controller modules return the feed's coefficients."""
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # static feeds are read-only
    model = load_trained(setup.name, FIXTURES)
    current: dict[str, torch.Tensor] = {}
    for c in setup.coefs:
        module = model.get_submodule(HOOKED_MODULES[c.family].format(layer=c.layer))
        module.register_forward_hook(lambda mod, args, out, key=c.tensor: current[key])
    tensors = [{name: torch.from_numpy(array) for name, array in feed.items()} for feed in prepared]

    @torch.inference_mode()
    def run(i: int) -> torch.Tensor:
        current.update({c.tensor: tensors[i][c.tensor] for c in setup.coefs})
        return model(tensors[i]["input_ids"])[0]
    return run


def as_array(logits) -> np.ndarray:
    return logits.numpy() if isinstance(logits, (ort.OrtValue, torch.Tensor)) else logits


def ms_per_run(run: Run, count: int) -> float:
    start = time.perf_counter_ns()
    for i in range(count):
        run(i)
    return (time.perf_counter_ns() - start) / 1e6 / count


def alternating(contenders: dict[str, Run], count: int, rounds: int) -> dict[str, list[float]]:
    """ms per run of each pass; one discarded warm-up pass each, then all contenders in turn each round."""
    for run in contenders.values():
        ms_per_run(run, count)
    times: dict[str, list[float]] = {label: [] for label in contenders}
    for _ in range(rounds):
        for label, run in contenders.items():
            times[label].append(ms_per_run(run, count))
    return times


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="featuregate,mudd")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, "
          f"torch {torch.__version__}, threads {args.threads}, batch {args.batch_size}, rounds {args.rounds}, "
          f"load average {os.getloadavg()[0]:.2f}")
    rows = []
    for name in (n for n in args.models.split(",") if (FIXTURES / n / "model.onnx").is_file()):
        setup = Setup(name, args.batch_size, args.threads)
        prepared = setup.prepared_feeds()
        contenders, notes = ort_contenders(setup, args.threads, prepared)
        contenders["PyTorch eager + hooks"] = torch_contender(setup, prepared)
        for note in notes:
            print(f"{name}: {note}")
        reference = [as_array(contenders[REPLAY](i)) for i in range(len(prepared))]
        diffs = {label: max(float(np.abs(as_array(run(i)) - reference[i]).max()) for i in range(len(prepared)))
                 for label, run in contenders.items()}
        for label, diff in diffs.items():
            print(f"{name}: {label}: max abs diff of the logits from the replay's session {diff:.1e} on {len(prepared)} feeds")
        if max(diffs.values()) > TOLERANCE:
            raise SystemExit(f"{name}: a contender's logits differ from the replay's session by more than {TOLERANCE}")
        times = alternating(contenders, len(prepared), args.rounds)
        torch_ms = times.pop("PyTorch eager + hooks")
        rows += [(name, label, ms, torch_ms, diffs[label]) for label, ms in times.items()]
    print("\n| model | variant | ORT ms per run (min–max) | PyTorch eager + hooks ms per run | PyTorch / ORT | "
          "max abs diff from the replay's session |")
    print("|---|---|---|---|---|---|")
    for name, label, ms, torch_ms, diff in rows:
        print(f"| {name} | {label} | {spread(ms)} | {spread(torch_ms)} | "
              f"{statistics.median(torch_ms) / statistics.median(ms):.2f}× | {diff:.1e} |")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
