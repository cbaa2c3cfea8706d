"""The replay takes a model's large inline weights out once (`steps.held_apart`): the trace and
frozen graphs it cuts hold stubs, never a copy of a weight, their sessions are handed the same
arrays, the figures are those of graphs that copy them, and a kept cache's key still reads the
weights' values. A caller that takes them out itself (the audit, whose profile reads the model's
file) hands the replay the arrays, and holds the proto without them while it runs."""

import importlib

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from graphaudit.audit import audit
from graphaudit.load.model import load_for_runtime
from graphaudit.replay import pipeline, steps
from graphaudit.replay.pipeline import replay
from graphaudit.runtime.handed_weights import HANDED_OVER, is_stub

from support.models import gated_lm, token_ids, with_a_large_weight

audit_module = importlib.import_module("graphaudit.audit")  # the package's `audit` is the function


def _with_a_large_weight(scale: float = 1.0) -> onnx.ModelProto:
    model = with_a_large_weight(gated_lm(), scale=scale)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture()
def files(tmp_path):
    onnx.save(_with_a_large_weight(), tmp_path / "big.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(8, seed=1))
    np.savez(tmp_path / "eval.npz", input_ids=token_ids(8, seed=2))
    return tmp_path


def _heavy(model: onnx.ModelProto) -> list[str]:
    return [t.name for t in model.graph.initializer if len(t.raw_data) > HANDED_OVER]


def _outside(loaded) -> list[str]:
    """The initializers whose values `loaded`'s proto does not hold (stubs, or references to a file)."""
    return [t.name for t in loaded.model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]


def _figures(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("timing", "settings")}


def test_no_graph_the_replay_cuts_copies_a_large_weight_and_the_figures_stay(files, monkeypatch):
    args = (files / "big.onnx", files / "calib.npz", files / "eval.npz")
    handed: list[tuple[list[str], list[str]]] = []  # (inline heavy weights, weights handed over) per session
    create, open_frozen = steps.create_session, steps.open_frozen

    def trace_session(model, *args, weights=None, **kwargs):
        handed.append((_heavy(model), sorted(weights or {})))
        return create(model, *args, weights=weights, **kwargs)

    def frozen_session(model, *args):
        handed.append((_heavy(model), sorted(args[-1] or {})))
        return open_frozen(model, *args)

    monkeypatch.setattr(steps, "create_session", trace_session)
    monkeypatch.setattr(steps, "open_frozen", frozen_session)
    held = replay(*args, batch_size=4, resamples=50).to_json()
    assert handed == [([], ["big"]), ([], ["big"])]  # the trace's session, then the frozen graph's
    assert held["parity"]["ok"]

    monkeypatch.setattr(pipeline, "held_apart", lambda loaded: (loaded, {}))
    handed.clear()
    copied = replay(*args, batch_size=4, resamples=50).to_json()
    assert handed == [(["big"], []), (["big"], [])]  # each graph a copy of the weight, as before
    assert _figures(held) == _figures(copied)


def test_a_kept_cache_is_captured_again_when_a_large_weight_changes(files, tmp_path):
    cache = tmp_path / "cache"
    args = (files / "calib.npz", files / "eval.npz")

    def reused(model: onnx.ModelProto) -> bool:
        onnx.save(model, files / "big.onnx")
        doc = replay(files / "big.onnx", *args, batch_size=4, resamples=20, cache_dir=cache).to_json()
        return doc["settings"]["cache"]["reused"]

    assert [reused(_with_a_large_weight()), reused(_with_a_large_weight())] == [False, True]
    assert reused(_with_a_large_weight(scale=2.0)) is False  # the same graph, another weight


def test_weights_a_caller_took_out_give_the_replay_of_the_whole_model(files):
    args = (files / "calib.npz", files / "eval.npz")
    apart, weights = steps.held_apart(load_for_runtime(files / "big.onnx"))
    assert _heavy(apart.model) == [] and sorted(weights) == ["big"]
    handed = replay(apart, *args, batch_size=4, resamples=50, weights=weights).to_json()
    whole = replay(files / "big.onnx", *args, batch_size=4, resamples=50).to_json()
    assert handed["parity"]["ok"]
    assert _figures(handed) == _figures(whole)


def test_weights_cannot_be_handed_to_a_replay_on_ray(files):
    apart, weights = steps.held_apart(load_for_runtime(files / "big.onnx"))
    with pytest.raises(ValueError, match="Ray"):
        replay(apart, files / "calib.npz", files / "eval.npz", weights=weights, ray="")


def test_the_audit_holds_the_models_proto_without_its_large_weights_through_the_replay(files, monkeypatch):
    """The profile's sessions read the model's file, so only the replay's need the weights: the
    audit hands it them as arrays and holds the proto without them (at Pythia-70M's shape the
    proto held beside the arrays was 282 MB of a 2.3 GB peak), and the figures stay."""
    seen: dict[str, list] = {"replay": [], "profile": []}
    replayed, profiled = pipeline.replay, audit_module._profile

    def replay_seen(model, *args, weights=None, **kwargs):
        seen["replay"].append((_heavy(model.model), sorted(weights or {})))
        return replayed(model, *args, weights=weights, **kwargs)

    def profile_seen(loaded, *args, **kwargs):
        seen["profile"].append(_outside(loaded))
        return profiled(loaded, *args, **kwargs)

    monkeypatch.setattr(pipeline, "replay", replay_seen)
    monkeypatch.setattr(audit_module, "_profile", profile_seen)
    args = (files / "big.onnx", files / "calib.npz", files / "eval.npz")
    options = {"provider": "cpu", "runs": 2, "warmup": 1, "threads": 1, "batch_size": 4, "resamples": 50}
    held = audit(*args, **options)
    assert seen == {"replay": [([], ["big"])], "profile": [["big"]]}

    monkeypatch.setattr(audit_module, "_held_for_replay", lambda loaded, settings, static: (loaded, {}))
    seen["replay"].clear()
    whole = audit(*args, **options)
    assert seen["replay"] == [(["big"], [])]
    assert _figures(held.replay.to_json()) == _figures(whole.replay.to_json())
    assert held.profile.to_json()["examples"] == whole.profile.to_json()["examples"]


def test_an_audit_whose_model_has_no_coefficient_takes_no_weight_out(tmp_path, monkeypatch):
    """The static audit found nothing to replay: no arrays are made for sessions that never open,
    and the profile still holds the model's graph alone."""
    plain = with_a_large_weight(gated_lm(layers=0))
    onnx.save(plain, tmp_path / "plain.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(8, seed=1))
    taken, profiled = [], []
    held_apart, profile = steps.held_apart, audit_module._profile

    def counted(loaded):
        taken.append(loaded.name)
        return held_apart(loaded)

    def profile_seen(loaded, *args, **kwargs):
        profiled.append(_outside(loaded))
        return profile(loaded, *args, **kwargs)

    monkeypatch.setattr(steps, "held_apart", counted)
    monkeypatch.setattr(audit_module, "_profile", profile_seen)
    report = audit(tmp_path / "plain.onnx", tmp_path / "calib.npz", provider="cpu", runs=2, warmup=1, threads=1)
    assert report.replay is None and taken == []
    assert profiled == [["big"]]


def test_a_model_read_from_its_file_refers_to_its_weights_bytes_there(files):
    """ONNX Runtime maps external data in place and copies arrays it is handed: the replay's graphs
    refer to a large inline weight's bytes in the model's own file, and the array by its name is a
    read-only view of them (what a kept cache's key digests), no copy."""
    loaded = load_for_runtime(files / "big.onnx")
    apart, weights = steps.held_apart(loaded)
    big = next(t for t in apart.model.graph.initializer if t.name == "big")
    where = {e.key: e.value for e in big.external_data}
    assert not is_stub(big) and where["location"] == "big.onnx" and apart.weights_folder == files.resolve()
    start, length = int(where["offset"]), int(where["length"])
    whole = next(t for t in loaded.model.graph.initializer if t.name == "big")
    assert (files / "big.onnx").read_bytes()[start:start + length] == whole.raw_data
    assert not weights["big"].flags.writeable and not weights["big"].flags.owndata
    np.testing.assert_array_equal(weights["big"], numpy_helper.to_array(whole))
    assert "big.onnx" in apart.external_files


def test_a_model_with_no_file_hands_its_sessions_copies(files):
    model = onnx.load(files / "big.onnx")
    apart, weights = steps.held_apart(load_for_runtime(model))
    assert [t.name for t in apart.model.graph.initializer if is_stub(t)] == ["big"]
    assert apart.weights_folder is None  # nothing for ONNX Runtime to read: the array is handed over
    np.testing.assert_array_equal(weights["big"], numpy_helper.to_array(model.graph.initializer[-1]))


def test_a_model_whose_file_no_longer_holds_its_weights_hands_its_sessions_copies(files):
    """Read, then its file rewritten without the large weight (or gone): nothing to point at, so
    the arrays are the proto's own, handed over."""
    loaded = load_for_runtime(files / "big.onnx")
    onnx.save(gated_lm(), files / "big.onnx")  # the same name, no weight `big` in it
    apart, weights = steps.held_apart(loaded)
    assert [t.name for t in apart.model.graph.initializer if is_stub(t)] == ["big"]
    (files / "big.onnx").unlink()
    again, _ = steps.held_apart(loaded)
    assert [t.name for t in again.model.graph.initializer if is_stub(t)] == ["big"]
    np.testing.assert_array_equal(weights["big"], numpy_helper.to_array(loaded.model.graph.initializer[-1]))


def test_weights_already_left_as_stubs_are_found_in_the_file_alike(files):
    """A proto held without its weights (`without_weights`: the profile's, where its sessions read
    the file) still finds each one's bytes in the file: the same references and views."""
    from graphaudit.runtime.handed_weights import weights_in_file, without_weights

    loaded = load_for_runtime(files / "big.onnx")
    whole = weights_in_file(loaded.model, files / "big.onnx")
    stubbed = weights_in_file(without_weights(loaded.model), files / "big.onnx")
    assert whole is not None and stubbed is not None
    assert stubbed[0].graph.initializer[-1] == whole[0].graph.initializer[-1]
    np.testing.assert_array_equal(stubbed[1]["big"], whole[1]["big"])
    np.testing.assert_array_equal(stubbed[1]["big"], numpy_helper.to_array(loaded.model.graph.initializer[-1]))
