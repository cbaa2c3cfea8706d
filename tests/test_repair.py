"""Models ONNX Runtime runs but the ONNX checker refuses: repaired in memory, audited, the file unchanged.

Each objection is a tiny gated model (a coefficient `gate.0`, so the replay runs too) broken
one way: an operator of `com.microsoft` without its opset import, nodes out of order, a
`value_info` without a type, a graph output without a type. ONNX Runtime opens each file as
it is; graphaudit repairs each in memory, says so in one note, and audits the repaired model.
What ONNX Runtime refuses too (a name assigned twice, a body out of order, an input without a
type, no opset import at all) is refused in one line, exit 1.
"""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphaudit.load.model import load_for_runtime, load_model
from graphaudit.profile.session import runnable_model
from graphaudit.runtime.sessions import create_session

from support.cli import FAST_REPLAY, FAST_RUN, accepted, refused, sha
from support.models import float_data, float_gated


def _with_microsoft_act(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` whose activation is com.microsoft's FastGelu, the domain not imported (as in ORT's own test models)."""
    act = next(n for n in model.graph.node if n.name == "block0/act")
    act.op_type, act.domain = "FastGelu", "com.microsoft"
    return model


def _unsorted(model: onnx.ModelProto) -> onnx.ModelProto:
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def _empty_value_info(model: onnx.ModelProto) -> onnx.ModelProto:
    model.graph.value_info.add(name="h")  # a name only, no type
    return model


def _untyped_output(model: onnx.ModelProto) -> onnx.ModelProto:
    model.graph.output[0].ClearField("type")
    return model


# name -> (how the gated model is broken, what the note must say)
REPAIRABLE = {
    "microsoft-without-import": (_with_microsoft_act, "added the opset import ONNX Runtime assumes, com.microsoft 1"),
    "unsorted": (_unsorted, r"sorted the nodes topologically, as ONNX Runtime does \(\d+ moved\)"),
    "value-info-without-type": (_empty_value_info, "dropped 1 value_info entry without a type"),
    "output-without-type": (_untyped_output, "typed output 'y' by shape inference"),
}


def _broken(case: str) -> onnx.ModelProto:
    return REPAIRABLE[case][0](float_gated())


@pytest.fixture()
def data(tmp_path):
    np.savez(tmp_path / "calib.npz", x=float_data(8, seed=1))
    np.savez(tmp_path / "eval.npz", x=float_data(8, seed=2))
    return tmp_path


def _runtime_opens(payload: bytes) -> bool:
    try:
        ort.InferenceSession(payload, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - ORT raises its own types
        return False
    return True


@pytest.mark.parametrize("case", sorted(REPAIRABLE))
def test_what_onnx_runtime_runs_is_repaired_in_memory_and_audited(data, capfd, case):
    model = _broken(case)
    path = data / "model.onnx"
    path.write_bytes(model.SerializeToString())
    assert _runtime_opens(path.read_bytes())  # ORT's answer: it runs the file as written
    if case != "value-info-without-type":  # (the checker takes that one; ONNX's inference then types 'h' twice)
        with pytest.raises(onnx.checker.ValidationError):
            onnx.checker.check_model(model)
    before = sha(path)
    static = json.loads(accepted(capfd, ["static", path, "--format", "json"], [path]))
    assert any(re.search(REPAIRABLE[case][1], r) for r in static["repairs"]), static["repairs"]
    assert [c["tensor"] for c in static["coefficients"]] == ["gate.0"]
    inspected = accepted(capfd, ["inspect", path], [path])
    assert "repaired in memory as ONNX Runtime reads it (the file is unchanged)" in inspected
    replayed = json.loads(accepted(capfd, ["replay", path, "--calib", data / "calib.npz", "--data", data / "eval.npz",
                                          *FAST_REPLAY, "--format", "json"], [path]))
    assert [c["tensor"] for c in replayed["coefficients"]] == ["gate.0"]
    assert sha(path) == before


def test_every_objection_at_once_is_one_note_of_the_run_and_the_profile_runs_the_repaired_model(data, capfd):
    model = float_gated()
    for _, (breaks, _) in sorted(REPAIRABLE.items()):
        model = breaks(model)
    path = data / "model.onnx"
    onnx.save(model, path)
    before = sha(path)
    report = json.loads(accepted(capfd, ["run", path, "--calib", data / "calib.npz", "--data", data / "eval.npz",
                                         *FAST_RUN, "--format", "json"], [path]))
    notes = [n for n in report["notes"] if "repaired in memory" in n]
    assert len(notes) == 1, report["notes"]
    for _, said in REPAIRABLE.values():
        assert re.search(said, notes[0]), notes[0]
    assert report["replay"] is not None and report["profile"] is not None
    # ONNX Runtime is handed the repaired model, not the file
    runnable = runnable_model(load_for_runtime(path))
    assert isinstance(runnable.source, bytes) and runnable.source != path.read_bytes()
    onnx.checker.check_model(runnable.source)
    assert sha(path) == before


def test_a_model_loaded_from_a_proto_is_repaired_in_a_copy():
    model = _with_microsoft_act(float_gated())
    before = model.SerializeToString()
    loaded = load_model(model)
    assert {(o.domain, o.version) for o in loaded.model.opset_import} == {("", 17), ("com.microsoft", 1)}
    assert model.SerializeToString() == before
    assert loaded.repair_note.count("the file is unchanged") == 1
    assert load_model(float_gated()).repairs == ()


# -- what ONNX Runtime refuses too -------------------------------------------------------------

def _tiny(nodes, inputs=None, outputs=None, opsets=(("", 17),)) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    graph = helper.make_graph(nodes, "g", inputs or [x], outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=8)


def _branch(nodes, out):
    return helper.make_graph(nodes, "b", [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2])])


def _if(then_nodes, then_out):
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    return [x, cond], helper.make_node("If", ["c"], ["y"], then_branch=_branch(then_nodes, then_out),
                                       else_branch=_branch([helper.make_node("Neg", ["x"], ["e"])], "e"))


def _untyped_input():
    model = _tiny([helper.make_node("Relu", ["x"], ["y"])])
    model.graph.input[0].ClearField("type")
    return model


def _no_opset():
    model = _tiny([helper.make_node("Relu", ["x"], ["y"])])
    del model.opset_import[:]
    return model


def _body_unsorted():
    inputs, node = _if([helper.make_node("Neg", ["a"], ["b"]), helper.make_node("Relu", ["x"], ["a"])], "b")
    return _tiny([node], inputs=inputs)


def _body_reassigns():
    inputs, node = _if([helper.make_node("Relu", ["x"], ["t"])], "t")  # 't' is made outside too
    return _tiny([helper.make_node("Neg", ["x"], ["t"]), node, helper.make_node("Add", ["t", "y"], ["z"])],
                 inputs=inputs, outputs=[helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])


REFUSED = {
    "reassigned": (lambda: _tiny([helper.make_node("Relu", ["x"], ["t"], name="relu"),
                                  helper.make_node("Neg", ["t"], ["t"], name="neg"),
                                  helper.make_node("Abs", ["t"], ["y"], name="abs")]),
                   r"expected every value name assigned once .*found 't' assigned by node 'relu' and by node 'neg'; "
                   "ONNX Runtime refuses it too"),
    "input-reassigned": (lambda: _tiny([helper.make_node("Relu", ["x"], ["x"], name="relu"),
                                        helper.make_node("Neg", ["x"], ["y"])]),
                         r"found 'x' assigned by input 'x' and by node 'relu'"),
    "body-reassigns": (_body_reassigns, r"found 't' assigned by node 'Neg' and by node 'Relu'"),
    "body-unsorted": (_body_unsorted, r"expected the nodes of every body in order .*ONNX Runtime sorts only the main"),
    "input-without-type": (_untyped_input, r"expected a type for every graph input .*found none for input 'x'; "
                                           "ONNX Runtime refuses it too"),
    "no-opset-import": (_no_opset, r"must specify opset_import"),
    "unknown-domain-without-import": (lambda: _tiny([helper.make_node("Frob", ["x"], ["y"], domain="acme")]),
                                      r"No opset import for domain 'acme'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_onnx_runtime_refuses_too_is_refused_in_one_line(tmp_path, capfd, case):
    make, message = REFUSED[case]
    path = tmp_path / "model.onnx"
    path.write_bytes(make().SerializeToString())
    assert not _runtime_opens(path.read_bytes())  # ORT's answer: it refuses the file too
    for command in ("inspect", "static"):
        refused(capfd, [command, path], [path], match=message)


# -- the decoders inside ONNX Runtime's search operators, without the com.microsoft import ----------

VOCAB, WIDTH_D, EOS = 7, 4, 6


def _decoder(layers: int = 2) -> onnx.GraphProto:
    """A GPT-2-style decoder as ONNX Runtime's search operators take it (input_ids, position_ids,
    attention_mask, past_i -> logits, present_i), its nodes named by torch's module scopes."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((VOCAB, WIDTH_D)).astype(np.float32), "wte"),
             numpy_helper.from_array(rng.standard_normal((WIDTH_D, VOCAB)).astype(np.float32), "lm_head.weight"),
             numpy_helper.from_array(np.array([0, 2], np.int64), "axes")]
    x = "/transformer/wte/Gather_output_0"
    nodes = [helper.make_node("Gather", ["wte", "input_ids"], [x], name="/transformer/wte/Gather")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, ["b", d])
              for n, d in (("input_ids", "s"), ("position_ids", "s"), ("attention_mask", "t"))]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", VOCAB])]
    for i in range(layers):
        p = f"/transformer/h.{i}"
        inits.append(numpy_helper.from_array(rng.standard_normal((WIDTH_D, WIDTH_D)).astype(np.float32), f"h.{i}.w"))
        nodes += [helper.make_node("MatMul", [x, f"h.{i}.w"], [f"{p}/mlp/mm"], name=f"{p}/mlp/MatMul"),
                  helper.make_node("Tanh", [f"{p}/mlp/mm"], [f"{p}/mlp/act"], name=f"{p}/mlp/Tanh"),
                  helper.make_node("Add", [x, f"{p}/mlp/act"], [f"{p}/out"], name=f"{p}/Add"),
                  helper.make_node("Unsqueeze", [x, "axes"], [f"{p}/attn/k"], name=f"{p}/attn/Unsqueeze"),
                  helper.make_node("Concat", [f"{p}/attn/k", f"{p}/attn/k"], [f"{p}/attn/kv"], name=f"{p}/attn/Concat", axis=0),
                  helper.make_node("Concat", [f"past_{i}", f"{p}/attn/kv"], [f"present_{i}"], name=f"{p}/attn/Concat_1", axis=3)]
        inputs.append(helper.make_tensor_value_info(f"past_{i}", TensorProto.FLOAT, [2, "b", 1, "p", WIDTH_D]))
        outputs.append(helper.make_tensor_value_info(f"present_{i}", TensorProto.FLOAT, [2, "b", 1, "t", WIDTH_D]))
        x = f"{p}/out"
    nodes.append(helper.make_node("MatMul", [x, "lm_head.weight"], ["logits"], name="/lm_head/MatMul"))
    return helper.make_graph(nodes, "decoder", inputs, outputs, initializer=inits)


def _search(op: str) -> tuple[onnx.ModelProto, dict]:
    """A GreedySearch or BeamSearch model over `_decoder` that does not import com.microsoft, and feeds for it."""
    names = ["input_ids", "max_length", "min_length"] + (["num_beams", "num_return_sequences", "length_penalty"]
                                                          if op == "BeamSearch" else [])
    types = {"input_ids": (TensorProto.INT32, ["batch", "seq"]), "length_penalty": (TensorProto.FLOAT, [1])}
    inputs = [helper.make_tensor_value_info(n, *types.get(n, (TensorProto.INT32, [1]))) for n in names]
    node = helper.make_node(op, names, ["sequences"], name="search", domain="com.microsoft", decoder=_decoder(),
                            eos_token_id=EOS, pad_token_id=0, model_type=0)
    shape = ["batch", "seqs"] if op == "GreedySearch" else ["batch", "returned", "seqs"]
    graph = helper.make_graph([node], "search", inputs, [helper.make_tensor_value_info("sequences", TensorProto.INT32, shape)])
    feeds = {"input_ids": np.array([[1, 2, 3], [4, 5, 1]], np.int32), "max_length": np.array([8], np.int32),
             "min_length": np.array([1], np.int32), "num_beams": np.array([2], np.int32),
             "num_return_sequences": np.array([1], np.int32), "length_penalty": np.array([1.0], np.float32)}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), \
        {n: feeds[n] for n in names}


@pytest.mark.parametrize("op", ["GreedySearch", "BeamSearch"])
def test_a_search_operators_decoder_is_audited_as_blocks_of_the_search_loop(tmp_path, capfd, op):
    model, feeds = _search(op)
    path = tmp_path / "search.onnx"
    onnx.save(model, path)
    before = sha(path)
    expected = ort.InferenceSession(path.read_bytes(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    (found,) = create_session(load_model(path).model).run(None, feeds)  # the repaired model runs the same search
    assert np.array_equal(found, expected) and found.shape[-1] == 8
    static = json.loads(accepted(capfd, ["static", path, "--format", "json"], [path]))
    assert static["repairs"] == ["added the opset import ONNX Runtime assumes, com.microsoft 1"]
    assert [(b["name"], b["verdict"]) for b in static["blocks"]] == [("transformer.h.0", "branch"),
                                                                   ("transformer.h.1", "branch")]
    for block in static["blocks"]:
        text = block["evidence"][0]["text"]
        assert f"run only in the decoder of {op} `search`" in text, text
        assert f"at end-of-sequence token {EOS} (the model decides" in text, text
        assert "at max_length (the caller's graph input `max_length`)" in text, text
    assert static["control_flow"][0]["tensor"] == "input_ids, max_length"
    assert f"control flow: {op} `search` (14 nodes inside)" in accepted(capfd, ["inspect", path], [path])
    assert sha(path) == before
