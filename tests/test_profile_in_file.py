"""The profile's sessions map a model's inline weights from its own file: they get the graph alone,
each large weight referring to its bytes there, and the optimised model ONNX Runtime saves for the
event mapping refers to them in turn instead of holding a copy (646 MiB written a session at
Pythia-160M's shape). Kept profiles still hold their optimised model's weights beside it."""

import numpy as np
import onnx
import pytest
from onnx import helper

import graphaudit.profile.profiler as profiler
from graphaudit.load.model import load_for_runtime
from graphaudit.load.raw_offsets import raw_data_spans
from graphaudit.profile import profile_model
from graphaudit.profile.session import held_for_profile, runnable_model, session_options
from graphaudit.runtime.handed_weights import is_stub

from support.models import gated_lm, save_heavy_pair, token_ids

SIDE_FILE = "session.optimized_model_external_initializers_file_name"
FAST = {"runs": 2, "warmup": 1, "profile_runs": 1, "threads": 1}


def with_a_gathered_weight(model: onnx.ModelProto, seed: int = 5) -> onnx.ModelProto:
    """`model` (gated_lm's layout) whose logits move by a row of `big`, a weight past HANDED_OVER,
    picked by each token: read at run time, so no optimisation folds it away."""
    from graphaudit.runtime.handed_weights import HANDED_OVER

    big = np.random.default_rng(seed).standard_normal((HANDED_OVER // 4 + 16, 1)).astype(np.float32)
    graph = model.graph
    head = next(n for n in graph.node if n.name == "head")
    head.output[0] = "logits.head"
    graph.initializer.append(onnx.numpy_helper.from_array(big, "big"))
    graph.node.extend([helper.make_node("Gather", ["big", "input_ids"], ["big.rows"], name="big/gather"),
                       helper.make_node("Add", ["logits.head", "big.rows"], ["logits"], name="big/add")])
    return model


@pytest.fixture
def heavy(tmp_path):
    """A model and a baseline, each with a weight past HANDED_OVER inline, and their inputs."""
    return save_heavy_pair(tmp_path, with_a_gathered_weight)


def _references(source: bytes) -> dict[str, dict[str, str]]:
    graph = onnx.load_from_string(source)
    return {t.name: {e.key: e.value for e in t.external_data} for t in graph.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL}


@pytest.mark.parametrize("held", [False, True])
def test_the_sessions_get_the_graph_with_each_weight_where_the_file_holds_it(heavy, held):
    loaded = load_for_runtime(heavy / "model.onnx")
    if held:  # as the profile holds it: the weights already left as stubs
        loaded = held_for_profile(loaded)
        assert any(is_stub(t) for t in loaded.model.graph.initializer)
    runnable = runnable_model(loaded)
    assert isinstance(runnable.source, bytes) and not runnable.holds_weights
    assert runnable.weights_folder == heavy.resolve() and runnable.renamed == 0
    file_bytes = (heavy / "model.onnx").read_bytes()
    assert len(runnable.source) < len(file_bytes) / 10
    spans = raw_data_spans(file_bytes)
    refs = _references(runnable.source)
    assert "big" in refs and all(ref["location"] == "model.onnx" for ref in refs.values())
    for name, ref in refs.items():
        assert (int(ref["offset"]), int(ref["length"])) == spans[name]
    big = onnx.numpy_helper.to_array(next(t for t in onnx.load(heavy / "model.onnx").graph.initializer
                                          if t.name == "big"))
    offset, length = spans["big"]
    assert np.array_equal(np.frombuffer(file_bytes[offset:offset + length], np.float32), big.ravel())


def test_a_model_renamed_for_the_profiler_refers_to_its_file_too(tmp_path):
    model = with_a_gathered_weight(gated_lm())
    for node in model.graph.node[:3]:
        node.name = ""
    onnx.save(model, tmp_path / "unnamed.onnx")
    runnable = runnable_model(load_for_runtime(tmp_path / "unnamed.onnx"))
    assert runnable.renamed == 3 and isinstance(runnable.source, bytes) and not runnable.holds_weights
    assert "big" in _references(runnable.source)
    handed = onnx.load_from_string(runnable.source)
    assert all(node.name for node in handed.graph.node)
    assert [n.name for n in handed.graph.node] == [n.name for n in runnable.model.graph.node]


def test_a_model_without_a_file_is_handed_whole_and_its_weights_go_to_a_side_file():
    loaded = load_for_runtime(with_a_gathered_weight(gated_lm()))
    runnable = runnable_model(loaded)
    assert runnable.holds_weights and "big" not in _references(runnable.source)


@pytest.mark.parametrize("side_file", [False, True])
def test_the_side_file_is_asked_for_only_where_the_session_holds_its_weights(tmp_path, side_file):
    options = session_options("all", 1, None, tmp_path / "optimised.onnx", side_file=side_file)
    if side_file:
        assert options.get_session_config_entry(SIDE_FILE) == "optimised.onnx.data"
    else:
        with pytest.raises(RuntimeError):
            options.get_session_config_entry(SIDE_FILE)
    assert options.optimized_model_filepath == str(tmp_path / "optimised.onnx")


def test_the_optimised_models_refer_to_the_weights_and_nothing_is_copied(heavy, monkeypatch):
    """No side file is written in the profile's folder, the optimised graph the events are mapped
    through refers to each weight in the model's file, and the profile is the one of the sessions
    that read the file itself."""
    seen, load_optimised = [], profiler.load_optimised

    def recorded(path):
        seen.append(sorted(p.name for p in path.parent.iterdir()))
        optimised = load_optimised(path)
        seen.append({t.name: {e.key: e.value for e in t.external_data}.get("location")
                     for t in optimised.graph.initializer if t.name == "big"})
        return optimised

    monkeypatch.setattr(profiler, "load_optimised", recorded)
    mapped = profile_model(heavy / "model.onnx", heavy / "eval.npz", baseline=heavy / "dense.onnx", **FAST)
    folders, locations = seen[0::2], seen[1::2]
    assert folders and not any(name.endswith(".data") for names in folders for name in names)
    assert "optimised.onnx" in folders[0] and "baseline-optimised.onnx" in folders[1]
    assert locations == [{"big": "model.onnx"}, {"big": "dense.onnx"}]

    seen.clear()
    monkeypatch.setattr("graphaudit.profile.session.graph_in_file", lambda *args: None)
    read = profile_model(heavy / "model.onnx", heavy / "eval.npz", baseline=heavy / "dense.onnx", **FAST)
    assert any(name.endswith(".data") for names in seen[0::2] for name in names)  # the file's copied weights
    docs = [p.to_json() for p in (mapped, read)]
    kept = ("examples", "mapping", "block_method", "flops_executed", "notes")
    same = [{k: d[k] for k in kept}
            | {"ran": [{k: v for k, v in r.items() if k != "latency_ms"} for r in d["per_input"]]}
            | {"nodes": sorted((n["node"], n["op_type"], n["block"], n["calls"]) for n in d["nodes"])}
            for d in docs]
    assert same[0] == same[1]
    assert docs[0]["nodes"] and docs[0]["baseline"]["flops_executed"] == docs[1]["baseline"]["flops_executed"]


def test_kept_profiles_hold_the_optimised_models_weights_beside_it(heavy, tmp_path):
    kept = tmp_path / "kept"
    profile_model(heavy / "model.onnx", heavy / "eval.npz", keep_profiles=kept, **FAST)
    optimised = onnx.load(kept / "optimised.onnx")  # whole, from the kept folder alone
    big = next(t for t in optimised.graph.initializer if t.name == "big")
    original = next(t for t in onnx.load(heavy / "model.onnx").graph.initializer if t.name == "big")
    assert np.array_equal(onnx.numpy_helper.to_array(big), onnx.numpy_helper.to_array(original))


def test_an_external_data_model_is_read_from_its_file_and_its_weights_not_copied(tmp_path, monkeypatch):
    model = with_a_gathered_weight(gated_lm())
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.data", size_threshold=1 << 20)
    np.savez(tmp_path / "eval.npz", input_ids=token_ids(6, seed=2))
    loaded = load_for_runtime(tmp_path / "ext.onnx")
    runnable = runnable_model(loaded)
    assert not runnable.holds_weights
    seen, load_optimised = [], profiler.load_optimised

    def recorded(path):
        seen.append(sorted(p.name for p in path.parent.iterdir()))
        return load_optimised(path)

    monkeypatch.setattr(profiler, "load_optimised", recorded)
    report = profile_model(tmp_path / "ext.onnx", tmp_path / "eval.npz", **FAST)
    assert seen and not any(name.endswith(".data") for name in seen[0])
    assert report.to_json()["per_input"]


def test_a_graph_with_only_small_weights_is_still_profiled(tmp_path):
    """Weights under IN_FILE_OVER stay in the graph; one over it still refers to the file."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
    w = onnx.numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "small.onnx")
    runnable = runnable_model(load_for_runtime(tmp_path / "small.onnx"))
    assert runnable.source == str(tmp_path / "small.onnx") and not runnable.holds_weights
