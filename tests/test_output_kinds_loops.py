"""What an output holds when a Loop makes it: what the Loop's body gives back there, each step's
value for a scan output, the last update of a state for a state (a decoder's buffer, written a
step at a time, as Paddle2ONNX exports SLANet's box head: a Sigmoid scattered into a buffer of
zeros, behind its `Add(x, 0)` assignment); and a value passed on unchanged by an arithmetic
identity is still what it was."""

import numpy as np
import onnxruntime as ort
import pytest

from graphaudit.analyses.output_kinds import LOGPROBS, PROBS, confirmed, read_outputs
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model

from support.text_graphs import model_of

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'

SCAN = HEAD + """
g (float[2, 5] x, int64 n) => (float[2, 5] h, float[N, 2, 5] probs, float[N, 2, 5] logp) {
    go = Constant <value = bool {1}> ()
    h, probs, logp = Loop (n, go, x) <body = step (int64 i, bool c, float[2, 5] s)
                                         => (bool c2, float[2, 5] s2, float[2, 5] p, float[2, 5] q) {
        c2 = Identity (c)
        s2 = Tanh (s)
        p = Softmax <axis = 1> (s2)
        q = LogSoftmax <axis = -1> (s2) }>
}"""

# the buffer starts as zeros; each step writes the Sigmoid of its input into row i (ScatterElements
# along the steps), then Paddle2ONNX's assignment adds a constant 0
BUFFER = HEAD + """
g (float[2, 4] x) => (float[2, 3, 4] boxes) {
    n = Constant <value = int64 {3}> ()
    go = Constant <value = bool {1}> ()
    dims = Constant <value = int64[3] {2, 3, 4}> ()
    zeros = ConstantOfShape (dims)
    boxes = Loop (n, go, zeros) <body = step (int64 i, bool c, float[2, 3, 4] s) => (bool c2, float[2, 3, 4] s2) {
        c2 = Identity (c)
        f = Cast <to = 1> (i)
        xf = Add (x, f)
        v = Sigmoid (xf)
        one = Constant <value = int64[1] {1}> ()
        u = Unsqueeze (v, one)
        at = Constant <value = int64[3] {1, 1, 1}> ()
        where = Constant <value = int64[3] {2, 1, 4}> ()
        i3 = Reshape (i, at)
        idx = Expand (i3, where)
        w = ScatterElements <axis = 1> (s, idx, u)
        zero = Constant <value = float[1] {0}> ()
        s2 = Add (w, zero) }>
}"""

# a greedy decoder's outputs grown by a Concat along the steps: each step's distribution over
# the classes (the last axis) is appended to those before
GROWN = HEAD + """
g (float[2, 5] x) => (float[2, N, 5] probs, float[2, N, 5] joined) {
    n = Constant <value = int64 {3}> ()
    go = Constant <value = bool {1}> ()
    one = Constant <value = int64[1] {1}> ()
    p0 = Softmax (x)
    first = Unsqueeze (p0, one)
    probs = Loop (n, go, first) <body = step (int64 i, bool c, float[2, M, 5] s) => (bool c2, float[2, K, 5] s2) {
        c2 = Identity (c)
        f = Cast <to = 1> (i)
        xf = Mul (x, f)
        p = Softmax <axis = -1> (xf)
        row = Unsqueeze (p, one)
        s2 = Concat <axis = 1> (s, row) }>
    joined = Concat <axis = -1> (first, first)
}"""

# a state the body passes on as it came: the Loop gives back its initial value, a Sigmoid
PASSED = HEAD + """
g (float[2, 4] x) => (float[2, 4] kept, float[2, 4] other) {
    n = Constant <value = int64 {2}> ()
    go = Constant <value = bool {1}> ()
    s0 = Sigmoid (x)
    kept, other = Loop (n, go, s0, x) <body = step (int64 i, bool c, float[2, 4] s, float[2, 4] t)
                                                  => (bool c2, float[2, 4] s2, float[2, 4] t2) {
        c2 = Identity (c)
        s2 = Identity (s)
        t2 = Tanh (t) }>
}"""

# identities an exporter writes (x + 0, 1 · x, x / 1) pass a Sigmoid on; x + 0.5 does not
IDENTITIES = HEAD + """
g (float[2, 4] x) => (float[2, 4] a, float[2, 4] b, float[2, 4] c, float[2, 4] d) {
    zero = Constant <value = float[1] {0}> ()
    one = Constant <value = float {1}> ()
    half = Constant <value = float[1] {0.5}> ()
    s = Sigmoid (x)
    a = Add (zero, s)
    m = Mul (one, s)
    b = Div (m, one)
    c = Add (s, half)
    d = Sub (one, s)
}"""


def _both(text: str):
    """The readings from the proto and from the graph model, checked equal."""
    loaded = load_model(model_of(text), weights=False)
    readings = read_outputs(loaded.model)
    assert read_outputs(loaded.model, graph_model=build_graph(loaded.model)) == readings
    return loaded.model, readings


def _run(model, **feeds) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def test_a_scan_output_holds_what_each_step_gives_back():
    model, read = _both(SCAN)
    assert (read["probs"].kind, read["probs"].last_axis) == (PROBS, True)
    assert read["probs"].reason == ("each step's value that the body of Loop node Loop -> probs gives back: a Softmax "
                                    "over the last axis at node Softmax -> p")
    assert (read["logp"].kind, read["logp"].last_axis) == (LOGPROBS, True)
    assert read["h"].kind is None and "Tanh" in read["h"].reason  # the state: a Tanh, no distribution
    out = _run(model, x=np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32), n=np.array(3))
    assert out["probs"].shape == (3, 2, 5)
    assert confirmed(read["probs"], out["probs"]).kind == PROBS  # sums to 1 over the last axis, as read


def test_a_buffer_each_step_writes_a_sigmoid_into_holds_per_value_probabilities():
    model, read = _both(BUFFER)
    boxes = read["boxes"]
    assert (boxes.kind, boxes.per_value) == (PROBS, True)
    assert boxes.reason == (
        "the state that the body of Loop node Loop -> boxes gives back: a ScatterElements at node "
        "ScatterElements -> w (behind Add) (into the Loop's state) of parts that each hold it: a Sigmoid, "
        "one probability per value, at node Sigmoid -> v (behind Unsqueeze)")
    out = _run(model, x=np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32))["boxes"]
    assert ((out > 0) & (out < 1)).all()  # every row written: each value a Sigmoid's


def test_distributions_grown_along_the_steps_stay_distributions_and_joined_along_their_axis_do_not():
    model, read = _both(GROWN)
    assert (read["probs"].kind, read["probs"].last_axis) == (PROBS, True)
    assert "a Concat at node Concat -> s2 (into the Loop's state) of parts that each hold it" in read["probs"].reason
    assert read["joined"].kind is None and read["joined"].reason.startswith("a Concat at node")
    out = _run(model, x=np.random.default_rng(2).standard_normal((2, 5)).astype(np.float32))
    assert out["probs"].shape == (2, 4, 5)
    np.testing.assert_allclose(out["probs"].sum(-1), 1.0, rtol=1e-5)


def test_a_state_the_body_passes_on_holds_its_initial_value():
    _, read = _both(PASSED)
    assert (read["kept"].kind, read["kept"].per_value) == (PROBS, True)
    assert read["kept"].reason.startswith("the state of Loop node Loop -> kept, which its body passes on: a Sigmoid")
    assert read["other"].kind is None


@pytest.mark.parametrize("output, kept", [("a", True), ("b", True), ("c", False), ("d", False)])
def test_an_arithmetic_identity_passes_a_sigmoid_on(output, kept):
    _, read = _both(IDENTITIES)
    assert (read[output].kind == PROBS) is kept, read[output]
