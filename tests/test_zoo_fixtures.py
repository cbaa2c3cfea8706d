"""The trained reference zoo in fixtures/: valid files, ONNX Runtime agrees with PyTorch, the
frozen graphs replay the live ones, each model's graph has (or lacks) the dynamic structure
it is there to show, and every model beats the corpus's unigram entropy.

Regenerate the fixtures with `python -m exporters.build --out fixtures` (fixtures/README.md).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from graphaudit.analyses.declared_coefficients import declared_coefficients

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODELS = ["dense", "featuregate", "mudd", "moe", "earlyexit"]
DYNAMIC = ["featuregate", "mudd", "moe", "earlyexit"]
# Trained float32 models, logits of magnitude ~10: ORT and PyTorch differ by ~1e-6.
ATOL, RTOL = 1e-4, 1e-4
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


@functools.cache
def zoo() -> dict:
    return json.loads((FIXTURES / "zoo.json").read_text())


@functools.cache
def load(name: str, frozen: bool = False) -> onnx.ModelProto:
    return onnx.load(str(FIXTURES / name / ("model.frozen.onnx" if frozen else "model.onnx")))


@functools.cache
def session(name: str, frozen: bool = False) -> ort.InferenceSession:
    return ort.InferenceSession(
        load(name, frozen).SerializeToString(), providers=["CPUExecutionProvider"]
    )


@functools.cache
def tracing_session(name: str) -> ort.InferenceSession:
    """The live graph with its coefficient tensors added as outputs, after `logits`."""
    model = onnx.ModelProto()
    model.CopyFrom(load(name))
    for c in declared_coefficients(model):
        model.graph.output.append(
            onnx.helper.make_tensor_value_info(c.tensor, onnx.TensorProto.FLOAT, None)
        )
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def data(name: str, split: str) -> np.ndarray:
    with np.load(FIXTURES / name / f"{split}.npz", allow_pickle=False) as f:
        assert list(f.keys()) == ["input_ids"]
        return f["input_ids"]


def batches(name: str, ids: np.ndarray) -> list[np.ndarray]:
    """EarlyExit decides per batch, so it runs one input per batch (each takes its branch)."""
    return [ids[i : i + 1] for i in range(len(ids))] if name == "earlyexit" else [ids]


def graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from graphs(attr.g)


def op_types(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for g in graphs(model.graph) for n in g.node}


def nll(logits: np.ndarray, ids: np.ndarray) -> float:
    """Mean next-token cross-entropy in nats."""
    z = logits[:, :-1].astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, ids[:, 1:, None], -1).mean())


# --- files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_files_pass_the_checker_and_carry_no_stack_traces(name):
    files = ["model.onnx"] + (["model.frozen.onnx"] if name in DYNAMIC else [])
    assert sorted(p.name for p in (FIXTURES / name).iterdir()) == sorted(
        [*files, "calib.npz", "eval.npz", "state_dict.pt"]
    )
    for frozen in (False, True)[: len(files)]:
        model = load(name, frozen)
        onnx.checker.check_model(model, full_check=True)
        assert next(i.name for i in model.graph.input) == "input_ids"
        assert [o.name for o in model.graph.output] == ["logits"]
        shape = model.graph.input[0].type.tensor_type.shape
        assert [d.dim_param or d.dim_value for d in shape.dim] == ["batch", "seq"]
        for g in graphs(model.graph):
            for node in g.node:
                assert STACK_TRACE_KEY not in {p.key for p in node.metadata_props}


@pytest.mark.parametrize("name", MODELS)
def test_calib_and_eval_are_disjoint_token_windows(name):
    calib, eval_ = data(name, "calib"), data(name, "eval")
    assert calib.dtype == eval_.dtype == np.int64
    assert calib.shape == tuple(zoo()["data"]["calib"])
    assert eval_.shape == tuple(zoo()["data"]["eval"])
    assert calib.min() >= 0 and max(calib.max(), eval_.max()) < 256
    assert not {r.tobytes() for r in calib} & {r.tobytes() for r in eval_}


@pytest.mark.parametrize("name", MODELS)
def test_block_structure_is_in_names(name):
    """Top-level nodes name their block in torch's name scopes; every block's weights keep
    their module path (nodes inside EarlyExit's `If` keep only a short scope)."""
    scopes = {
        p.value
        for node in load(name).graph.node
        for p in node.metadata_props
        if p.key == "pkg.torch.onnx.name_scopes"
    }
    entry = zoo()["models"][name]
    n_layers = entry["config"]["n_layers"]
    top_level = entry["exit_after"] + 1 if name == "earlyexit" else n_layers
    for i in range(top_level):
        assert any(f"'blocks.{i}" in s for s in scopes), f"no node scoped blocks.{i}"
    initializers = {t.name for t in load(name).graph.initializer}
    assert all(f"blocks.{i}.attn.q.weight" in initializers for i in range(n_layers))


# --- coefficients --------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_metadata_declares_every_coefficient(name):
    declared = declared_coefficients(load(name))
    assert [c.to_json() | {"source": "metadata"} for c in declared] == [
        c | {"source": "metadata"} for c in zoo()["models"][name]["coefficients"]
    ]
    if name == "dense":
        assert declared == ()
        return
    assert declared
    produced = {o for n in load(name).graph.node for o in n.output}
    assert all(c.tensor in produced for c in declared)
    frozen = load(name, frozen=True)
    assert declared_coefficients(frozen) == declared
    assert [i.name for i in frozen.graph.input] == ["input_ids", *(c.tensor for c in declared)]
    for c, graph_input in zip(declared, frozen.graph.input[1:]):
        dims = [d.dim_param or d.dim_value for d in graph_input.type.tensor_type.shape.dim]
        assert dims[c.axes.index("batch")] == "batch" and dims[c.axes.index("token")] == "seq"


@pytest.mark.parametrize("name", DYNAMIC)
def test_frozen_graph_has_no_controller(name):
    live, frozen = load(name), load(name, frozen=True)
    assert len(frozen.graph.node) < len(live.graph.node)
    controller = {"featuregate": ".gate.", "mudd": ".mudd.", "moe": ".router."}.get(name)
    if controller:
        assert any(controller in t.name for t in live.graph.initializer)
        assert not any(controller in t.name for t in frozen.graph.initializer)


@pytest.mark.parametrize("name", DYNAMIC)
def test_frozen_graph_replays_the_live_coefficients(name):
    declared = declared_coefficients(load(name))
    for ids in batches(name, data(name, "eval")):
        logits, *coefficients = tracing_session(name).run(None, {"input_ids": ids})
        for c, value in zip(declared, coefficients):
            assert value.shape[c.axes.index("batch")] == ids.shape[0]
            assert value.shape[c.axes.index("token")] == ids.shape[1]
        feed = {"input_ids": ids, **{c.tensor: v for c, v in zip(declared, coefficients)}}
        (replayed,) = session(name, frozen=True).run(None, feed)
        np.testing.assert_allclose(replayed, logits, atol=ATOL, rtol=RTOL)


# --- ONNX Runtime against PyTorch ----------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime_matches_pytorch_on_eval_data(name):
    torch = pytest.importorskip("torch")
    from exporters.zoo import load_trained

    model = load_trained(name, FIXTURES)
    names = [c.tensor for c in model.coefficients()]
    for ids in batches(name, data(name, "eval")):
        with torch.no_grad():
            logits, computed = model(torch.from_numpy(ids))
        ort_logits, *coefficients = tracing_session(name).run(None, {"input_ids": ids})
        np.testing.assert_allclose(ort_logits, logits.numpy(), atol=ATOL, rtol=RTOL)
        for n, value in zip(names, coefficients):
            np.testing.assert_allclose(value, computed[n].numpy(), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", MODELS)
def test_eval_nll_is_below_the_unigram_entropy(name):
    ids = data(name, "eval")
    total = sum(
        nll(session(name).run(None, {"input_ids": b})[0], b) * len(b) for b in batches(name, ids)
    )
    measured = total / len(ids)
    assert measured == pytest.approx(zoo()["models"][name]["eval_nll"], abs=1e-3)
    assert measured < zoo()["corpus"]["unigram_entropy_nats"] - 0.5


# --- execution structure -------------------------------------------------------------------


def test_moe_dispatches_tokens_data_dependently():
    model = load("moe")
    ops = op_types(model)
    assert {"TopK", "NonZero"} <= ops and ops & {"ScatterND", "ScatterElements"}
    # Every expert's first MatMul reads rows selected downstream of a NonZero.
    producer = {o: n for n in model.graph.node for o in n.output}

    def ancestors(name, seen):
        node = producer.get(name)
        if node is None or id(node) in seen:
            return
        seen.add(id(node))
        yield node
        for i in node.input:
            yield from ancestors(i, seen)

    expert_matmuls = [
        n
        for n in model.graph.node
        if any(".experts." in i and i.endswith("up.weight") for i in n.input)
    ]
    assert len(expert_matmuls) == len(declared_coefficients(model)) * 4  # 4 experts a layer
    for node in expert_matmuls:
        assert any(a.op_type == "NonZero" for a in ancestors(node.input[0], set()))


def test_earlyexit_if_holds_the_later_blocks():
    model = load("earlyexit")
    entry = zoo()["models"]["earlyexit"]
    early = {str(i) for i in range(entry["exit_after"] + 1)}
    late = {str(i) for i in range(entry["exit_after"] + 1, entry["config"]["n_layers"])}
    (if_node,) = [n for n in model.graph.node if n.op_type == "If"]
    branches = {a.name: a.g for a in if_node.attribute}

    def blocks_read(graph):
        return {
            name.split(".")[1]
            for g in graphs(graph)
            for n in g.node
            for name in n.input
            if name.startswith("blocks.")
        }

    assert blocks_read(branches["else_branch"]) == late
    assert blocks_read(branches["then_branch"]) == set()
    top = {i.split(".")[1] for n in model.graph.node for i in n.input if i.startswith("blocks.")}
    assert top == early
    assert not {"If", "Loop", "NonZero"} & {n.op_type for n in model.graph.node if n is not if_node}


def test_earlyexit_single_inputs_take_both_branches():
    ee = zoo()["models"]["earlyexit"]
    means = [
        tracing_session("earlyexit").run(None, {"input_ids": b})[1].mean()
        for b in batches("earlyexit", data("earlyexit", "eval"))
    ]
    exits = sum(m > ee["threshold"] for m in means)
    assert exits == ee["eval_exits"]
    assert 0 < exits < len(means)


@pytest.mark.parametrize("name", ["dense", "featuregate", "mudd"])
def test_static_models_have_no_data_dependent_execution(name):
    for frozen in (False, True)[: 1 + (name != "dense")]:
        ops = op_types(load(name, frozen))
        assert not ops & {"If", "Loop", "NonZero", "TopK", "Compress", "Scan"}
