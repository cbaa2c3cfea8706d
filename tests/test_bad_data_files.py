"""Bad data files through every command that reads them: one line, exit 1, files untouched.

Each bad `.npz` goes through `replay` (as evaluation and as calibration data), `profile`
and `run`, and — where the problem shows in the array headers — `static --data`. The
models are tiny: `gated_lm` (token ids into an 11-row embedding) and `float_gated` (float
inputs, for NaN/Inf). Then the values the data makes the model produce: a sequence longer
than a zoo model takes (ONNX Runtime's failure, worded), and NaN coefficients from a
controller that takes the Log of its input — reported, never averaged into the figures.
"""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest

from support.cli import FAST_PROFILE, FAST_REPLAY, FAST_RUN, accepted, refused
from support.models import float_data, float_gated, gated_lm, token_ids
from support.zoo import zoo_subset


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    onnx.save(gated_lm(), folder / "ids.onnx")
    onnx.save(float_gated(), folder / "float.onnx")
    np.savez(folder / "ids.npz", input_ids=token_ids(8, seed=1))
    np.savez(folder / "float.npz", x=float_data(8, seed=1))
    return folder


def _damaged_npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, input_ids=token_ids(6, seed=2))
    return buffer.getvalue()[:300]


IDS = token_ids(6, seed=2)
X = float_data(6, seed=2)
# name -> (model, content: arrays or raw bytes, what the line says, visible from the array headers alone)
BAD_DATA = {
    "not-an-npz": ("ids", b"input_ids,0,1,2\n" * 10, r"expected a NumPy \.npz archive .*not a zip archive", True),
    "damaged-npz": ("ids", _damaged_npz(), r"expected a (readable \.npz archive|NumPy \.npz archive)", True),
    "pickled-object-array": ("ids", {"input_ids": np.array([{"a": 1}, None], dtype=object)},
                             r"found (.* holding )?pickled Python objects; graphaudit never loads pickles", True),
    "missing-key": ("ids", {"tokens": IDS}, r"missing input_ids", True),
    "extra-key": ("ids", {"input_ids": IDS, "attention_mask": np.ones_like(IDS)},
                  r"found unexpected keys \['attention_mask'\]", True),
    "wrong-dtype": ("ids", {"input_ids": IDS.astype(np.float32)}, r"dtype int64, found float32", True),
    "wrong-rank": ("ids", {"input_ids": IDS[..., None]}, r"rank 2 .*found rank 3", True),
    "batch-sizes-disagree": ("ids", {"input_ids": IDS, "labels": IDS[:3]},
                             r"same number of examples on axis 0, found input_ids: 6, labels: 3", True),
    "empty-array": ("ids", {"input_ids": IDS[:0]}, r"expected 'input_ids' in .* to hold data, found an empty array",
                    True),
    "empty-sequence": ("ids", {"input_ids": IDS[:, :0]}, r"found an empty array of shape \(6, 0\)", True),
    "nan-in-inputs": ("float", {"x": np.where(X > 1.9, np.nan, X).astype(np.float32)},
                      r"expected finite values in 'x' in .*, found \d+ NaN/Inf values", False),
    "inf-in-inputs": ("float", {"x": np.where(X > 1.9, -np.inf, X).astype(np.float32)}, r"NaN/Inf values", False),
    "token-ids-past-the-embedding": ("ids", {"input_ids": IDS + 11},
                                     r"expected 'input_ids' in .* to hold indices 0\.\.10 \(rows of 'emb'", False),
    "negative-token-ids": ("ids", {"input_ids": IDS - 11}, r"indices 0\.\.10 .*found values from -11", False),
    "float-labels": ("ids", {"input_ids": IDS, "labels": IDS.astype(np.float32)},
                     r"expected integer labels in .*, found dtype float32", False),
}


def _write(folder, name, content):
    path = folder / f"{name}.npz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        np.savez(path, **content)
    return path


def _commands(model, good, bad, headers):
    commands = {
        "replay-data": ["replay", model, "--calib", good, "--data", bad, *FAST_REPLAY],
        "replay-calib": ["replay", model, "--calib", bad, "--data", good, *FAST_REPLAY],
        "profile": ["profile", model, "--data", bad, *FAST_PROFILE],
        "run": ["run", model, "--calib", good, "--data", bad, *FAST_RUN],
    }
    if headers:
        commands["static"] = ["static", model, "--data", bad]
    return commands


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_bad_data_file(models, tmp_path, capfd, case):
    kind, content, message, headers = BAD_DATA[case]
    model, good = models / f"{kind}.onnx", models / f"{kind}.npz"
    bad = _write(tmp_path, case, content)
    for command in _commands(model, good, bad, headers).values():
        refused(capfd, command, [model, good, bad], match=message)


def test_labels_outside_the_vocabulary_are_refused_where_they_are_scored(models, tmp_path, capfd):
    model, good = models / "ids.onnx", models / "ids.npz"
    bad = _write(tmp_path, "labels", {"input_ids": IDS, "labels": np.where(IDS > 5, 40, IDS)})
    message = (r"expected labels in 0\.\.10 \(the classes of the output 'logits', or -100 to leave a position out\), "
               r"found 40")
    refused(capfd, ["replay", model, "--calib", good, "--data", bad, *FAST_REPLAY], [model, good, bad], match=message)
    refused(capfd, ["run", model, "--calib", good, "--data", bad, *FAST_RUN], [model, good, bad], match=message)


def test_a_sequence_longer_than_the_model_takes(tmp_path, capfd):
    """The zoo's learned positions stop at 64 tokens; ONNX Runtime's failure comes back as one line."""
    paths = zoo_subset(tmp_path / "zoo", tokens=64)
    with np.load(paths["eval"]) as archive:
        ids = archive["input_ids"]
    long = _write(tmp_path, "long", {"input_ids": np.concatenate([ids, ids[:, :8]], axis=1)})
    files = [paths["model"], paths["calib"], long]
    message = r"expected inputs that .* can run on, found ONNX Runtime's error in node '[^']+' \(Add\): .*64 by 72"
    refused(capfd, ["profile", paths["model"], "--data", long, *FAST_PROFILE], files, match=message)
    refused(capfd, ["replay", paths["model"], "--calib", paths["calib"], "--data", long, *FAST_REPLAY], files,
            match=message)
    refused(capfd, ["run", paths["model"], "--calib", paths["calib"], "--data", long, *FAST_RUN], files, match=message)


@pytest.fixture()
def nan_controller(tmp_path):
    """A controller that takes the Log of its input: finite data with one negative entry gives NaN gates."""
    onnx.save(float_gated(log_in_controller=True), tmp_path / "log.onnx")
    good = float_data(8, seed=1)
    bad = good.copy()
    bad[5, 2, 1] = -0.5  # finite, so the data passes its own checks
    np.savez(tmp_path / "good.npz", x=good)
    np.savez(tmp_path / "bad.npz", x=bad)
    return tmp_path


def test_nan_coefficients_are_reported_not_replayed(nan_controller, capfd):
    model, good, bad = (nan_controller / n for n in ("log.onnx", "good.npz", "bad.npz"))
    files = [model, good, bad]
    message = (r"expected finite values in the coefficient 'gate\.0', found \d+ NaN/Inf values for {split} input 5 "
               r".*the controller produces them")
    refused(capfd, ["replay", model, "--calib", good, "--data", bad, *FAST_REPLAY], files,
            match=message.format(split="evaluation"))
    refused(capfd, ["replay", model, "--calib", bad, "--data", good, *FAST_REPLAY], files,
            match=message.format(split="calibration"))
    refused(capfd, ["run", model, "--calib", good, "--data", bad, *FAST_RUN], files,
            match=message.format(split="evaluation"))


def test_the_same_controller_on_clean_inputs_replays(nan_controller, capfd):
    """The control: without the negative entry the Log controller is finite and the replay runs."""
    model, good = nan_controller / "log.onnx", nan_controller / "good.npz"
    out = accepted(capfd, ["replay", model, "--calib", good, *FAST_REPLAY, "--format", "json"], [model, good])
    assert '"ok": true' in out
