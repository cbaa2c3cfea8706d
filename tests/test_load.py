"""Model loading: graph-only loads, the checker, and errors for bad files."""

import hashlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from graphaudit.errors import GraphAuditError
from graphaudit.graph import build_graph
from graphaudit.load import load_model
from graphaudit.testing.synthetic import WEIGHTS_FILE, transformer_graph


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_graph_only_load_of_a_24_layer_model_reads_no_weights(tmp_path, monkeypatch):
    path = tmp_path / "pythia.onnx"
    onnx.save(transformer_graph(), path)
    assert not (tmp_path / WEIGHTS_FILE).exists()  # the 5.6 GB weight file is absent
    opened = []
    real_open = open

    def spy(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    before = sha(path)
    loaded = load_model(path, weights=False)
    assert not any(WEIGHTS_FILE in f for f in opened)
    assert loaded.weights_loaded is False
    assert loaded.external_files == (WEIGHTS_FILE,)
    assert loaded.shape_inference_ok
    mg = build_graph(loaded.model)
    assert sum(n.op_type == "MatMul" for n in mg.nodes.values()) == 24 * 6 + 1
    # Symbolic dimensions survive shape inference.
    assert mg.tensors[mg.outputs[0]].shape == ("batch", "seq", 50432)
    assert sha(path) == before


def test_load_with_weights_says_the_weight_file_is_missing(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(transformer_graph(layers=2, hidden=64, heads=4, vocab=100), path)
    with pytest.raises(GraphAuditError, match=r"external-data file 'weights.bin'.*found none"):
        load_model(path)


def test_inline_model_loads_and_runs(tmp_path):
    model = transformer_graph(layers=2, hidden=32, heads=4, vocab=50, external=None)
    loaded = load_model(model)
    sess = ort.InferenceSession(loaded.model.SerializeToString(), providers=["CPUExecutionProvider"])
    (logits,) = sess.run(None, {"input_ids": np.zeros((2, 5), np.int64)})
    assert logits.shape == (2, 5, 50)


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "found an empty file"),
        (b"\xff\xfe\x00garbage\x13\x37" * 10, "do not parse"),
        (onnx.helper.make_tensor_value_info("x", 1, [2]).SerializeToString(), "no graph"),
    ],
    ids=["empty", "random", "other-protobuf"],
)
def test_bad_files_give_one_line_errors(tmp_path, content, expected):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(GraphAuditError, match=expected) as info:
        load_model(path)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == content


def test_truncated_model_is_refused(tmp_path):
    good = transformer_graph(layers=1, hidden=16, heads=2, vocab=20, external=None).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(GraphAuditError, match="truncated|no graph|checker"):
        load_model(path)


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "sub/../../x.bin"])
def test_external_data_escaping_the_folder_is_refused(tmp_path, location):
    model = transformer_graph(layers=1, hidden=16, heads=2, vocab=20, external=location)
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "m.onnx"
    onnx.save(model, path)
    for weights in (True, False):
        with pytest.raises(GraphAuditError, match="refusing to read it"):
            load_model(path, weights=weights)


def test_external_data_symlink_out_of_the_folder_is_refused(tmp_path):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(bytes(10**6))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "link.bin").symlink_to(outside)
    onnx.save(transformer_graph(layers=1, hidden=16, heads=2, vocab=20, external="link.bin"), folder / "m.onnx")
    with pytest.raises(GraphAuditError, match="resolves to"):
        load_model(folder / "m.onnx")


def test_checker_objection_is_reported():
    model = transformer_graph(layers=1, hidden=16, heads=2, vocab=20, external=None)
    model.graph.node[3].input[0] = "nowhere"
    with pytest.raises(GraphAuditError, match="reads 'nowhere', which no node, input or initializer defines"):
        load_model(model)
    model.graph.node[3].input[0] = model.graph.node[2].output[0]
    model.graph.node[3].op_type = "NoSuchOp"
    with pytest.raises(GraphAuditError, match="checker's objection: No Op registered for NoSuchOp"):
        load_model(model)


def test_load_never_changes_its_argument():
    model = transformer_graph(layers=1, hidden=16, heads=2, vocab=20, external=None)
    before = model.SerializeToString()
    load_model(model)
    assert model.SerializeToString() == before


def test_external_weights_present_load_and_run_like_inline_ones(tmp_path):
    rng = np.random.default_rng(0)
    model = transformer_graph(layers=2, hidden=16, heads=2, vocab=23, external=None)
    for tensor in model.graph.initializer:
        values = rng.standard_normal(tuple(tensor.dims)).astype(np.float32)
        tensor.raw_data = values.tobytes()
    path = tmp_path / "m.onnx"
    saved = onnx.ModelProto()
    saved.CopyFrom(model)  # onnx.save moves the weights of what it is given out to the file
    onnx.save(saved, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.weights", size_threshold=0)
    loaded = load_model(path)
    assert loaded.weights_loaded and loaded.external_files == ("m.weights",)
    assert loaded.shape_inference_ok
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.model.graph.initializer)
    ids = {"input_ids": rng.integers(0, 23, (2, 5))}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, ids)[0]
    np.testing.assert_array_equal(run(loaded.model), run(model))
    assert build_graph(loaded.model).tensors[build_graph(loaded.model).outputs[0]].shape == ("batch", "seq", 23)
