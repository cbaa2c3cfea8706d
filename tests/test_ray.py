"""The replay sharded over Ray workers (`--ray`): the same JSON as one process, retries, refusals.

Most tests share one Ray instance started in this process (the `ray_here` fixture: the replay
uses a Ray it finds running, as it would a user's own); one runs the command line in a process
of its own, which starts and removes an embedded Ray. They run in one xdist worker (the
`ray` group: scripts/test.sh passes --dist loadgroup), so the machine holds one Ray at a time.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import ray  # the [ray] extra: scripts/env.sh installs it, so CI runs these tests

from graphaudit.errors import GraphAuditError
from graphaudit.load.model import load_for_runtime
from graphaudit.replay.cluster import CRASH_VARIABLE, RAY_MISSING
from graphaudit.replay.pipeline import replay
from graphaudit.replay.shards import ModelFiles, plan_shards
from graphaudit.report.jsondoc import command_json

from support.cli import FAST_REPLAY, refused
from support.json_schema import undescribed, validate
from support.models import float_data, float_gated
from support.zoo import FIXTURES, ZOO

pytestmark = pytest.mark.xdist_group("ray")

RESAMPLES = 50
# what differs by design between one process and the workers: how it ran, not what it found
HOW_IT_RAN = {"distributed", "distributed_note", "threads", "threads_note", "cache"}


@pytest.fixture(scope="module")
def ray_here(tmp_path_factory):
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"ga-ray-{os.getpid()}"  # short: Ray's socket paths
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             _temp_dir=str(folder))
    yield ray
    ray.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


def _zoo(name: str) -> tuple[Path, Path, Path]:
    folder = FIXTURES / name
    return folder / "model.onnx", folder / "calib.npz", folder / "eval.npz"


def _what_it_found(doc: dict) -> dict:
    doc = {k: v for k, v in doc.items() if k != "timing"}
    doc["settings"] = {k: v for k, v in doc["settings"].items() if k not in HOW_IT_RAN}
    return doc


def _assert_same(one: dict, other: dict, path: str = "$", rel: float = 1e-9) -> None:
    """Equal JSON, floats within `rel` of each other (sums added in another order)."""
    if isinstance(one, dict):
        assert isinstance(other, dict) and one.keys() == other.keys(), f"{path}: {sorted(one)} != {sorted(other)}"
        for key in one:
            _assert_same(one[key], other[key], f"{path}.{key}", rel)
    elif isinstance(one, list):
        assert isinstance(other, list) and len(one) == len(other), path
        for i, (a, b) in enumerate(zip(one, other)):
            _assert_same(a, b, f"{path}[{i}]", rel)
    elif isinstance(one, float) and isinstance(other, float):
        assert math.isclose(one, other, rel_tol=rel, abs_tol=1e-12) or (math.isnan(one) and math.isnan(other)), \
            f"{path}: {one} != {other}"
    else:
        assert one == other, f"{path}: {one!r} != {other!r}"


@pytest.mark.parametrize("name", ZOO)
def test_two_workers_give_the_json_of_one_process(ray_here, name):
    model, calib, data = _zoo(name)
    alone = replay(model, calib, data, resamples=RESAMPLES, batch_size=4).to_json()
    sharded = replay(model, calib, data, resamples=RESAMPLES, batch_size=4, ray="", workers=2).to_json()
    _assert_same(_what_it_found(alone), _what_it_found(sharded))
    ran = sharded["settings"]["distributed"]
    assert ran["workers"] == 2 and ran["retries"] == 0 and ran["shards"][0][0] == 0
    assert ran["shards"][-1][1] == alone["data"]["evaluation_inputs"]
    assert "2 workers" in sharded["settings"]["distributed_note"]
    doc = json.loads(command_json(sharded))  # as `graphaudit replay --format json` writes it
    validate(doc, "replay")
    assert undescribed(doc, "replay") == []


def test_a_worker_killed_mid_replay_is_replaced_and_the_result_is_the_same(ray_here, monkeypatch):
    model, calib, data = _zoo("mudd")
    alone = replay(model, calib, data, resamples=RESAMPLES, batch_size=4).to_json()
    monkeypatch.setenv(CRASH_VARIABLE, "1:1")  # shard 1's first worker: SIGKILL after its first batch
    sharded = replay(model, calib, data, resamples=RESAMPLES, batch_size=4, ray="", workers=2).to_json()
    assert sharded["settings"]["distributed"]["retries"] == 1
    assert "1 shard done again" in sharded["settings"]["distributed_note"]
    _assert_same(_what_it_found(alone), _what_it_found(sharded))


def test_a_shard_that_fails_twice_fails_the_audit_naming_its_inputs(ray_here, monkeypatch):
    model, calib, data = _zoo("featuregate")
    monkeypatch.setenv(CRASH_VARIABLE, "1:1:2")  # its first two workers die
    with pytest.raises(GraphAuditError, match=r"expected shard 1 \(evaluation inputs 16\.\.31, calibration "
                                              r"inputs 16\.\.31\) to replay on a Ray worker, found that it failed "
                                              r"2 times"):
        replay(model, calib, data, resamples=RESAMPLES, batch_size=4, ray="", workers=2)


def test_a_refusal_on_a_later_shard_fails_the_audit_with_the_inputs_numbered_as_in_the_data(ray_here, tmp_path):
    onnx.save(float_gated(log_in_controller=True), tmp_path / "m.onnx")
    calib, data = float_data(8, seed=1), float_data(8, seed=2)
    data[6, 0, 0] = -1.0  # Log of it: NaN in the gate of evaluation input 6, in shard 1
    np.savez(tmp_path / "calib.npz", x=calib)
    np.savez(tmp_path / "eval.npz", x=data)
    with pytest.raises(GraphAuditError, match=r"NaN/Inf values for evaluation input 6 "):
        replay(tmp_path / "m.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz", resamples=RESAMPLES,
               batch_size=2, ray="", workers=2)


def test_progress_counts_the_inputs_done_on_every_worker(ray_here):
    model, calib, data = _zoo("featuregate")
    seen: list[tuple[str, int, int | None]] = []
    replay(model, calib, data, resamples=RESAMPLES, batch_size=4, ray="", workers=2,
           progress=lambda stage, done, total: seen.append((stage, done, total)))
    replayed = [(done, total) for stage, done, total in seen if stage == "replay"]
    assert replayed[-1] == (32, 32)
    assert all(total == 32 and 0 <= done <= 32 for done, total in replayed)
    assert [d for d, _ in replayed] == sorted(d for d, _ in replayed)  # nothing died: it only grows


def test_a_cluster_gets_the_model_through_the_object_store_with_its_external_weights(ray_here, tmp_path):
    # an address: the workers are not taken to share this disk (the Ray running here is used)
    folder = tmp_path / "external"
    folder.mkdir()
    model, calib, data = _zoo("featuregate")
    onnx.save_model(onnx.load(str(model)), str(folder / "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin")
    shipped = ModelFiles.of(load_for_runtime(folder / "model.onnx"))
    assert sorted(shipped.files) == ["model.onnx", "weights.bin"]
    alone = replay(folder / "model.onnx", calib, data, resamples=RESAMPLES, batch_size=8).to_json()
    sharded = replay(folder / "model.onnx", calib, data, resamples=RESAMPLES, batch_size=8, ray="auto",
                     workers=2).to_json()
    assert sharded["settings"]["distributed"]["address"] == "auto"
    _assert_same(_what_it_found(alone), _what_it_found(sharded))


def test_model_files_stay_inside_the_folder_they_are_written_to(tmp_path):
    with pytest.raises(GraphAuditError, match="expected the model's files inside its folder"):
        ModelFiles("model.onnx", {"model.onnx": b"", "../outside.bin": b"x"}).write(tmp_path)
    assert not (tmp_path.parent / "outside.bin").exists()


@pytest.mark.parametrize(("calib", "evaluation", "batch", "workers", "expected"), [
    (32, 32, 4, 2, [((0, 16), (0, 16)), ((16, 32), (16, 32))]),
    (10, 10, 4, 2, [((0, 8), (0, 8)), ((8, 10), (8, 10))]),  # whole batches: the last one short
    (8, 40, 8, 4, [((0, 8), (0, 16)), ((8, 8), (16, 24)), ((8, 8), (24, 32)), ((8, 8), (32, 40))]),
    (16, 8, 4, 5, [((0, 8), (0, 4)), ((8, 16), (4, 8))]),  # no more shards than evaluation batches
])
def test_shards_are_runs_of_whole_batches(calib, evaluation, batch, workers, expected):
    shards = plan_shards(calib, evaluation, batch, workers)
    assert [((s.calibration.start, s.calibration.stop), (s.evaluation.start, s.evaluation.stop))
            for s in shards] == expected


def test_without_ray_the_option_says_what_to_install(capfd, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    model, calib, data = _zoo("featuregate")
    err = refused(capfd, ["replay", model, "--calib", calib, "--data", data, *FAST_REPLAY, "--ray"],
                  [model, calib, data])
    assert RAY_MISSING in err


def test_ray_refuses_a_kept_cache_and_workers_need_ray(capfd, tmp_path):
    model, calib, data = _zoo("featuregate")
    refused(capfd, ["replay", model, "--calib", calib, "--data", data, *FAST_REPLAY, "--cache-dir", tmp_path / "c",
                    "--ray"], [model, calib, data], match="--cache-dir or --ray", code=2)
    refused(capfd, ["replay", model, "--calib", calib, "--data", data, *FAST_REPLAY, "--workers", "2"],
            [model, calib, data], match="--workers with --ray", code=2)
    assert not (tmp_path / "c").exists()


def test_run_with_an_embedded_ray_leaves_nothing_behind(tmp_path):
    """The command line as a user runs it: an embedded Ray started, used and removed."""
    model, calib, data = _zoo("featuregate")
    baseline = FIXTURES / "dense" / "model.onnx"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = tmp_path / "audit.json"
    env = {**os.environ, "TMPDIR": str(scratch)}  # too long for Ray's sockets: its folder goes in /tmp
    env.pop(CRASH_VARIABLE, None)
    before = set(Path("/tmp").glob("ray-*"))
    done = subprocess.run([sys.executable, "-m", "graphaudit", "run", model, "--calib", calib, "--data", data,
                           "--baseline", baseline, "--runs", "3", "--warmup", "1", "--profile-runs", "1",
                           "--resamples", "20", "-q", "-o", out, "--workers", "2", "--ray"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # -q: no line of graphaudit's, and none of Ray's
    doc = json.loads(out.read_text())
    assert doc["inputs"]["ray"] == "local" and doc["inputs"]["workers"] == 2
    assert doc["replay"]["settings"]["distributed"]["workers"] == 2
    assert any("the profile ran in this process" in note for note in doc["notes"])
    validate(doc)  # the fields --ray adds are in the schema, described
    assert undescribed(doc) == []
    assert doc["verdict"]  # the audit went on to its answers
    assert list(scratch.iterdir()) == []
    assert set(Path("/tmp").glob("ray-*")) <= before


def _commands_naming(text: str) -> list[str]:
    """The command lines of running processes that name `text` (Ray's own name their session folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # ended meanwhile
                continue
            if text in line:
                found.append(line)
    return found


# while Ray starts; once its workers capture or replay; SIGKILL runs none of the command's own code
@pytest.mark.parametrize(("signum", "delay"), [(signal.SIGTERM, 0.0), (signal.SIGTERM, 1.5), (signal.SIGKILL, 1.5)],
                         ids=["SIGTERM-0.0", "SIGTERM-1.5", "SIGKILL-1.5"])
def test_a_replay_on_an_embedded_ray_stopped_leaves_no_process_and_no_file(signum, delay):
    model, calib, data = _zoo("mudd")
    # TMPDIR /tmp: graphaudit's folder there is short enough for Ray's sockets, so Ray's files go inside it
    env = {**os.environ, "TMPDIR": "/tmp"}
    env.pop(CRASH_VARIABLE, None)
    before = set(Path("/tmp").glob("graphaudit-*"))
    process = subprocess.Popen([sys.executable, "-m", "graphaudit", "replay", model, "--calib", calib, "--data",
                                data, "--resamples", "20", "-q", "--batch-size", "1", "--workers", "2", "--ray"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:
        mine = [p for p in set(Path("/tmp").glob("graphaudit-*")) - before if list(p.glob("ray-*/session_*"))]
        if mine:
            break
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no Ray started in 120 s"
        time.sleep(0.05)
    (folder,) = mine
    while not _commands_naming(str(folder)) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay)
    assert process.poll() is None, "the replay ended before it could be stopped"
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    if signum == signal.SIGKILL:  # Ray's own reaper ends its processes, graphaudit's removes the folder
        assert process.returncode == -signal.SIGKILL, err
    else:
        assert process.returncode == 128 + signal.SIGTERM, err
        # Ray's ray.wait raises a KeyboardInterrupt of its own for graphaudit's Terminated: still 143 and SIGTERM
        assert "Traceback" not in err and err.strip() == "graphaudit: aborted (SIGTERM); temporary files removed", err
    deadline = time.monotonic() + 20  # Ray's processes end with the one that started them
    while _commands_naming(str(folder)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _commands_naming(str(folder)) == []
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not folder.exists(), sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))[:20]


def test_workers_remove_the_model_files_they_were_sent(ray_here, tmp_path):
    model, calib, data = _zoo("featuregate")
    workers_tmp = Path(ray.get(ray.remote(lambda: tempfile.gettempdir()).remote()))
    before = set(workers_tmp.glob("graphaudit-model-*"))
    replay(model, calib, data, resamples=RESAMPLES, batch_size=8, ray="auto", workers=2)  # shipped as files
    assert set(workers_tmp.glob("graphaudit-model-*")) <= before


def test_a_parity_failure_on_a_later_shard_alone_fails_the_audit_as_in_one_process(ray_here, tmp_path):
    model, calib, data = _zoo("mudd")
    ids = np.load(data)["input_ids"]
    halves = [ids[:16], ids[16:]]
    worst = []  # each half's largest every-input difference (last bits of the log-probabilities)
    for k, half in enumerate(halves):
        np.savez(tmp_path / f"half{k}.npz", input_ids=half)
        parity = replay(model, calib, tmp_path / f"half{k}.npz", resamples=RESAMPLES, batch_size=4,
                        tolerance=1.0).parity
        assert parity.max_abs_diff == 0 and parity.every_input is not None  # the first batches agree exactly
        worst.append(parity.every_input.max_abs_diff)
    if worst[0] == worst[1]:
        pytest.skip(f"both halves differ from the live model by {worst[0]:g} at most here: no tolerance between")
    first, second = (0, 1) if worst[0] < worst[1] else (1, 0)  # the half that differs more goes second: shard 1
    np.savez(tmp_path / "eval.npz", input_ids=np.concatenate([halves[first], halves[second]]))
    tolerance = (worst[first] + worst[second]) / 4  # twice that on log-probabilities: between the two
    for ray_given in (None, ""):
        with pytest.raises(GraphAuditError, match=r"every input within .* at input (1[6-9]|2\d|3[01]),") as err:
            replay(model, calib, tmp_path / "eval.npz", resamples=RESAMPLES, batch_size=4, tolerance=tolerance,
                   ray=ray_given, workers=2 if ray_given is not None else None)
        assert f"{worst[second]:.3g}" in str(err.value)


def test_a_shard_with_no_calibration_inputs_gives_the_same_json(ray_here, tmp_path):
    model, calib, data = _zoo("featuregate")
    np.savez(tmp_path / "calib.npz", input_ids=np.load(calib)["input_ids"][:4])  # one batch: shard 1 has none
    alone = replay(model, tmp_path / "calib.npz", data, resamples=RESAMPLES, batch_size=4).to_json()
    sharded = replay(model, tmp_path / "calib.npz", data, resamples=RESAMPLES, batch_size=4, ray="",
                     workers=2).to_json()
    assert sharded["settings"]["distributed"]["workers"] == 2
    _assert_same(_what_it_found(alone), _what_it_found(sharded))
