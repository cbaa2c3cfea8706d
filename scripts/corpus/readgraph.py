"""Print what an ONNX graph says about the facts the corpus records, read with onnx alone.

This is how the answers in corpus.py were established: run it on a model and read its
output next to the table.  It needs only numpy and onnx (the repo's venv has both):

    python scripts/corpus/readgraph.py MODEL.onnx [--json]
"""
import argparse
import hashlib
import json
import sys
from collections import Counter

import onnx
from onnx import numpy_helper

# Operators that move, compare or re-type values without computing learned ones: a branch
# condition reached only through these comes from wherever their inputs come from.
STRUCTURAL = {
    "Identity", "Gather", "GatherElements", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Cast",
    "Flatten", "Concat", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not",
    "And", "Or", "Xor", "Expand", "Transpose", "Where",
}
SHAPE_OPS = {"Shape", "Size"}
# Operators an output's kind can hide behind.
PASS_THROUGH = {"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"}


def dims_as_written(value_info):
    """Return the dims of a graph input or output exactly as written: ints, 'sym' or None."""
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    out = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            out.append(dim.dim_value)
        elif dim.HasField("dim_param"):
            out.append(dim.dim_param)
        else:
            out.append(None)
    return out


class Scopes:
    """Producers, initializers and graph inputs of a model and of every nested body."""

    def __init__(self, model):
        self.model = model
        self.producer = {}
        self.initializers = {}
        self.body_inputs = set()
        self.graph_inputs = [i.name for i in model.graph.input]
        self._collect(model.graph)

    def _collect(self, graph):
        for init in graph.initializer:
            self.initializers[init.name] = init
        for node in graph.node:
            for out in node.output:
                self.producer[out] = node
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    self.body_inputs.update(i.name for i in attr.g.input)
                    self._collect(attr.g)

    def deciders(self, name):
        """Return the set of sources a value comes from: caller:X, shape:X, constant, model:OP."""
        found, seen, stack = set(), set(), [name]
        while stack:
            cur = stack.pop()
            if not cur or cur in seen:
                continue
            seen.add(cur)
            if cur in self.initializers:
                found.add("constant")
                continue
            if cur in self.graph_inputs:
                found.add("caller:" + cur)
                continue
            if cur in self.body_inputs:
                found.add("loop-carried:" + cur)
                continue
            node = self.producer.get(cur)
            if node is None:
                found.add("unknown:" + cur)
                continue
            if node.op_type in ("Constant", "ConstantOfShape") and not (
                    node.op_type == "ConstantOfShape" and node.input):
                found.add("constant")
                continue
            if node.op_type in SHAPE_OPS:
                found.add("shape:" + self._shape_root(node.input[0]))
                continue
            if node.op_type in STRUCTURAL or node.op_type == "ConstantOfShape":
                stack.extend(node.input)
                continue
            found.add("model:" + node.op_type + "(" + cur + ")")
        return found

    def _shape_root(self, name):
        """Return the graph inputs whose shapes a Shape node's operand follows (best effort)."""
        roots, seen, stack = set(), set(), [name]
        while stack:
            cur = stack.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if cur in self.graph_inputs:
                roots.add(cur)
            node = self.producer.get(cur)
            if node is not None:
                stack.extend(i for i in node.input if i and i not in self.initializers)
        return ",".join(sorted(roots)) or name


def output_chain(scopes, name, limit=8):
    """Return the op types behind an output, nearest first (an If shows both branches)."""
    chain = []
    while name in scopes.producer and len(chain) < limit:
        node = scopes.producer[name]
        if node.op_type == "If":
            index = list(node.output).index(name)
            branches = {}
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    branches[attr.name] = output_chain(scopes, attr.g.output[index].name, limit)
            chain.append({"If": branches})
            break
        chain.append(node.op_type)
        name = next((i for i in node.input if i and i not in scopes.initializers), None)
    return chain


def final_op(chain):
    """Return the first op of a chain that is not a pass-through (Identity, Reshape...)."""
    for op in chain:
        if isinstance(op, dict):
            return {k: final_op(v) for k, v in op["If"].items()}
        if op not in PASS_THROUGH:
            return op
    return None


def body_summary(scopes, graph):
    """Return a branch body's op counts, initializer names and content digests."""
    ops, inits = Counter(), {}
    def walk(g):
        for init in g.initializer:
            inits[init.name] = hashlib.sha256(init.SerializeToString()).hexdigest()[:12]
        for node in g.node:
            ops[node.op_type] += 1
            if node.op_type == "Constant":
                # exporters that inline a body (spox) hold its weights as Constant nodes
                for attr in node.attribute:
                    if attr.type == onnx.AttributeProto.TENSOR and numpy_helper.to_array(attr.t).size >= 16:
                        inits[node.output[0]] = hashlib.sha256(attr.t.raw_data or
                                                               attr.t.SerializeToString()).hexdigest()[:12]
            for inp in node.input:
                if inp in scopes.initializers and inp not in inits:
                    inits[inp] = hashlib.sha256(
                        scopes.initializers[inp].raw_data or
                        scopes.initializers[inp].SerializeToString()).hexdigest()[:12]
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
    walk(graph)
    return ops, inits


def control_flow(scopes):
    """Return every If and Loop with where its condition (trip count) comes from."""
    rows = []
    def walk(graph, depth):
        for node in graph.node:
            if node.op_type in ("If", "Loop"):
                row = {"op": node.op_type, "name": node.name, "nesting": depth}
                if node.op_type == "If":
                    row["condition"] = sorted(scopes.deciders(node.input[0]))
                    bodies = {a.name: a.g for a in node.attribute}
                    then_ops, then_w = body_summary(scopes, bodies["then_branch"])
                    else_ops, else_w = body_summary(scopes, bodies["else_branch"])
                    row["then_ops"] = sum(then_ops.values())
                    row["else_ops"] = sum(else_ops.values())
                    heavy = ("Conv", "Gemm", "MatMul", "LSTM", "GRU")
                    row["then_heavy"] = {k: then_ops[k] for k in heavy if then_ops[k]}
                    row["else_heavy"] = {k: else_ops[k] for k in heavy if else_ops[k]}
                    row["same_ops"] = then_ops == else_ops
                    row["same_weights"] = sorted(then_w.values()) == sorted(else_w.values())
                    row["weights"] = [len(then_w), len(else_w)]
                else:
                    row["trip_count"] = sorted(scopes.deciders(node.input[0])) if node.input[0] else ["none"]
                    row["condition"] = sorted(scopes.deciders(node.input[1])) if len(node.input) > 1 and node.input[1] else ["none"]
                rows.append(row)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g, depth + 1)
    walk(scopes.model.graph, 0)
    return rows


def se_gates(scopes):
    """Return squeeze-excitation gates in depth order: the gate tensor, its Mul, its conv depth.

    A gate is GlobalAveragePool -> Conv -> (Add) -> Relu -> Conv -> (Add) -> HardSigmoid|Sigmoid
    -> Mul whose other operand is the pooled feature map, Identity allowed anywhere.  Depth is
    the number of Conv nodes on the longest path from a graph input to the gate's Mul.
    """
    graph = scopes.model.graph
    consumers = {}
    for node in graph.node:
        for inp in node.input:
            consumers.setdefault(inp, []).append(node)

    def back(name):
        node = scopes.producer.get(name)
        while node is not None and node.op_type == "Identity":
            node = scopes.producer.get(node.input[0])
        return node

    def strip(name):
        node = scopes.producer.get(name)
        while node is not None and node.op_type == "Identity":
            name = node.input[0]
            node = scopes.producer.get(name)
        return name

    known = {}

    def constant(name):
        """Return whether a value is computed from constants alone (a bias Reshape'd by Paddle):
        walked back iteratively, each value once (a Sigmoid deep in a transformer has hundreds
        of nodes above it)."""
        stack = [(name, False)]
        while stack:
            value, ready = stack.pop()
            if value in known:
                continue
            node = scopes.producer.get(value)
            if value in scopes.initializers or node is None:
                known[value] = value in scopes.initializers
            elif ready:
                known[value] = all(known[i] for i in node.input if i)
            else:
                stack.append((value, True))
                stack.extend((i, False) for i in node.input if i and i not in known)
        return known[name]

    def follow(node, want):
        """Walk back through an optional bias Add to the wanted op."""
        if node is not None and node.op_type == "Add" and want != "Add":
            data = [i for i in node.input if not constant(i)]
            node = back(data[0]) if len(data) == 1 else node
        return node if node is not None and node.op_type == want else None

    # conv depth by longest path, main graph, nodes in order (topologically sorted graphs)
    depth = {}
    for node in graph.node:
        d = max((depth.get(i, 0) for i in node.input), default=0)
        d += node.op_type in ("Conv", "ConvTranspose", "ConvInteger")
        for out in node.output:
            depth[out] = d
    gates = []
    for node in graph.node:
        if node.op_type not in ("HardSigmoid", "Sigmoid"):
            continue
        conv2 = follow(back(node.input[0]), "Conv")
        relu = back(conv2.input[0]) if conv2 else None
        relu = follow(relu, "Relu") if relu is not None else None
        conv1 = follow(back(relu.input[0]), "Conv") if relu else None
        gap = back(conv1.input[0]) if conv1 else None
        if gap is None or gap.op_type not in ("GlobalAveragePool", "ReduceMean"):
            continue
        fmap = strip(gap.input[0])
        gate_out = node.output[0]
        muls = []
        frontier = [gate_out]
        while frontier:
            cur = frontier.pop()
            for c in consumers.get(cur, []):
                if c.op_type == "Identity":
                    frontier.append(c.output[0])
                elif c.op_type == "Mul" and any(strip(i) == fmap for i in c.input):
                    muls.append(c)
        if not muls:
            continue
        identities = sum(1 for n in graph.node if n.op_type == "Identity" and
                         (n.input[0] in (gate_out, fmap) or n.output[0] in gap.input))
        gates.append({"tensor": gate_out, "mul": muls[0].name or muls[0].output[0],
                      "activation": node.op_type, "conv_depth": depth[muls[0].output[0]],
                      "identity_nearby": identities})
    gates.sort(key=lambda g: g["conv_depth"])
    for rank, gate in enumerate(gates):
        gate["rank"] = rank
    return gates


def read(path):
    """Return the facts of one model file as a dict."""
    model = onnx.load(path)
    scopes = Scopes(model)
    inits = set(scopes.initializers)
    facts = {
        "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "producer": (model.producer_name + " " + model.producer_version).strip(),
        "inputs": {i.name: {"elem_type": onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type),
                            "dims": dims_as_written(i)}
                   for i in model.graph.input if i.name not in inits},
        "outputs": {},
        "control_flow": control_flow(scopes),
        "se_gates": se_gates(scopes),
        "ops": dict(Counter(n.op_type for n in model.graph.node)),
    }
    for out in model.graph.output:
        chain = output_chain(scopes, out.name)
        facts["outputs"][out.name] = {"dims": dims_as_written(out), "chain": chain,
                                      "final_op": final_op(chain)}
    try:
        onnx.checker.check_model(model, full_check=True)
        facts["checker"] = "ok"
    except Exception as err:  # noqa: BLE001 - the checker's own exception types vary by version
        facts["checker"] = str(err).splitlines()[0][:300]
    return facts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    facts = read(args.model)
    if args.json:
        json.dump(facts, sys.stdout, indent=1)
        print()
        return
    print("opsets", facts["opsets"], "producer", facts["producer"], "checker:", facts["checker"])
    for name, inp in facts["inputs"].items():
        print("input ", name, inp["elem_type"], inp["dims"])
    for name, out in facts["outputs"].items():
        print("output", name, out["dims"], "final op:", out["final_op"], "chain:", out["chain"])
    for row in facts["control_flow"]:
        print("flow  ", json.dumps(row))
    print("se gates:", len(facts["se_gates"]))
    for gate in facts["se_gates"]:
        print("  gate", gate["rank"], gate["tensor"], gate["activation"], "conv depth", gate["conv_depth"],
              "identity nearby", gate["identity_nearby"])


if __name__ == "__main__":
    main()
