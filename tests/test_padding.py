"""Padded inputs: where the data's `attention_mask` is 0, a position is no token. The replay
leaves those positions out of NLL, KL, the token shuffle, the profiles and the variance
decomposition, so that what sits at a padded position changes nothing it reports."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphaudit.errors import GraphAuditError
from graphaudit.load.data import from_arrays, input_specs, padding
from graphaudit.metrics import Reference, task_for
from graphaudit.metrics.outputs import column, log_softmax, score
from graphaudit.replay.conditions import cross_partners, derangement, position_orders
from graphaudit.replay.pipeline import replay

from support.models import VOCAB, gated_lm, token_ids

CONDITIONS = ("correct", "token_shuffle", "static_layer", "static_position", "global_mean")  # cross_input: below


def masked_lm() -> onnx.ModelProto:
    """gated_lm taking an `attention_mask` too. A padded position computes from the token id it
    holds, as in a transformer whose mask only stops tokens attending to it (gated_lm is causal,
    so the tokens before it never see it)."""
    model = gated_lm()
    graph = model.graph
    embed = next(n for n in graph.node if n.name == "embed")
    embed.output[0] = "x0_raw"
    graph.input.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]))
    graph.initializer.append(onnx.numpy_helper.from_array(np.array(0.0, np.float32), "nothing"))
    at = list(graph.node).index(embed)
    for i, node in enumerate([helper.make_node("Cast", ["attention_mask"], ["m"], to=1),
                              helper.make_node("Unsqueeze", ["m", "axis_last"], ["m3"]),
                              helper.make_node("Mul", ["m3", "nothing"], ["m0"]),
                              helper.make_node("Add", ["x0_raw", "m0"], ["x0"])], start=1):
        graph.node.insert(at + i, node)
    onnx.checker.check_model(model, full_check=True)
    return model


def right_padded(count: int, length: int, seed: int, filler: int, full: int = 1) -> dict[str, np.ndarray]:
    """Token ids whose positions past each input's length hold `filler`, and their mask."""
    rng = np.random.default_rng(seed)
    ids = token_ids(count, length, seed=seed)
    lengths = rng.integers(3, length + 1, count)
    lengths[:full] = length  # `full` inputs unpadded
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int64)
    return {"input_ids": np.where(mask == 1, ids, filler), "attention_mask": mask}


def test_padding_is_read_from_the_attention_mask():
    specs = input_specs(masked_lm())
    data = right_padded(5, 6, seed=1, filler=0)
    tokens = padding(from_arrays(data, specs, "d.npz"))
    assert tokens.dtype == bool and (tokens == (data["attention_mask"] == 1)).all()
    assert padding(from_arrays({**data, "attention_mask": np.ones_like(data["input_ids"])}, specs, "d.npz")) is None
    assert padding(from_arrays({"input_ids": data["input_ids"]}, input_specs(gated_lm()), "d.npz")) is None
    bad = {**data, "attention_mask": data["attention_mask"] * 2}
    with pytest.raises(GraphAuditError, match=r"expected attention_mask in d.npz to hold 1 for a token and 0 for "
                                              r"padding, found np.int64\(2\) \(\d+ values neither\)"):
        padding(from_arrays(bad, specs, "d.npz"))


def test_scores_leave_padded_positions_out():
    data = right_padded(4, 6, seed=2, filler=3)
    rng = np.random.default_rng(0)
    live, other = (log_softmax(rng.standard_normal((4, 6, VOCAB)).astype(np.float32)) for _ in range(2))
    task = task_for({"logits": live}, data, {})
    assert task.mask == "attention_mask"
    reference = Reference.of(task, live, data, {})
    sums = score(task, other, data, {}, reference)
    tokens = data["attention_mask"] == 1
    targets = tokens[:, 1:]
    picked = np.take_along_axis(other[:, :-1], data["input_ids"][:, 1:, None], axis=2)[..., 0]
    assert sums[:, column("nll")] == pytest.approx(-(picked * targets).sum(axis=1), rel=1e-6)
    assert (sums[:, column("targets")] == targets.sum(axis=1)).all()
    kl = (np.exp(live) * (live - other)).sum(axis=2)
    assert sums[:, column("divergence")] == pytest.approx((kl * tokens).sum(axis=1), rel=1e-5)
    assert (sums[:, column("positions")] == tokens.sum(axis=1)).all()


def test_token_shuffle_permutes_an_inputs_tokens_among_themselves():
    tokens = np.arange(8)[None] < np.array([[8], [5], [2]])
    orders = position_orders(3, 8, np.random.default_rng(0), tokens)
    for order, kept in zip(orders, tokens):
        assert sorted(order[kept]) == list(np.flatnonzero(kept))  # tokens go to tokens
        assert (order[~kept] == np.flatnonzero(~kept)).all()  # padding stays put
    assert (orders[0] != np.arange(8)).any()


def test_what_padding_holds_changes_nothing_the_replay_reports(tmp_path):
    onnx.save(masked_lm(), tmp_path / "m.onnx")
    reports = []
    for filler in (0, 7):
        np.savez(tmp_path / f"calib{filler}.npz", **right_padded(10, 8, seed=3, filler=filler))
        np.savez(tmp_path / f"eval{filler}.npz", **right_padded(8, 8, seed=4, filler=filler))
        reports.append(replay(tmp_path / "m.onnx", tmp_path / f"calib{filler}.npz", tmp_path / f"eval{filler}.npz",
                              conditions=CONDITIONS, resamples=50, batch_size=4))
    a, b = reports
    assert "positions padded (attention_mask 0)" in a.settings["padding"]
    assert a.task.mask == "attention_mask"
    for x, y in zip(a.conditions, b.conditions):
        for figure in ("nll", "divergence"):
            assert getattr(y, figure).value == pytest.approx(getattr(x, figure).value, rel=1e-5, abs=1e-7), \
                (x.name, figure)
    assert [name for name, _ in a.variance] == ["gate"]
    for share, estimate in a.variance[0][1].items():
        assert b.variance[0][1][share].value == pytest.approx(estimate.value, rel=1e-5, abs=1e-9), share
    assert a.conditions[1].name == "token_shuffle" and a.conditions[1].delta_nll.value > 0


def test_without_the_mask_padding_would_count(tmp_path):
    """The same data with its mask all ones scores the filler as tokens: the figures move."""
    onnx.save(masked_lm(), tmp_path / "m.onnx")
    nll = []
    for filler in (0, 7):
        for name, count, seed in (("calib", 10, 3), ("eval", 8, 4)):
            data = right_padded(count, 8, seed=seed, filler=filler)
            np.savez(tmp_path / f"{name}{filler}.npz", input_ids=data["input_ids"],
                     attention_mask=np.ones_like(data["attention_mask"]))
        report = replay(tmp_path / "m.onnx", tmp_path / f"calib{filler}.npz", tmp_path / f"eval{filler}.npz",
                        conditions=("correct",), resamples=10, batch_size=4)
        assert "padding" not in report.settings
        nll.append(report.conditions[0].nll.value)
    assert nll[0] != pytest.approx(nll[1], rel=1e-3)


def test_cross_input_partners_have_tokens_wherever_their_input_has():
    lengths = np.array([8, 8, 5, 3, 5, 2, 7, 3])
    tokens = np.arange(8)[None] < lengths[:, None]
    for seed in range(20):
        drawn = derangement(len(lengths), np.random.default_rng(seed))
        partner, note = cross_partners(drawn, tokens, np.random.default_rng(seed))
        assert (partner != np.arange(len(lengths))).all()
        assert (tokens[partner] >= tokens).all()  # no token meets a partner's padding
        kept = lengths[drawn] >= lengths
        assert (partner[kept] == drawn[kept]).all()  # a drawn partner that covers stays
        moved = int((~kept).sum())
        assert (note is None) == (moved == 0)
        if moved:
            assert note.startswith(f"cross_input gave {moved} of 8 inputs another partner") and "still" not in note


def test_an_input_no_other_covers_takes_the_partner_sharing_most_of_its_tokens():
    lengths = np.array([8, 6, 6, 3])
    tokens = np.arange(8)[None] < lengths[:, None]
    partner, note = cross_partners(np.array([3, 0, 1, 2]), tokens, np.random.default_rng(0))
    assert partner[0] in (1, 2) and partner[1] in (0, 2) and partner[2] in (0, 1) and partner[3] == 2
    assert note.endswith("2 tokens of 1 inputs that no other input covers still met a partner's padding")


def test_what_padding_holds_changes_nothing_cross_input_reports(tmp_path):
    onnx.save(masked_lm(), tmp_path / "m.onnx")
    reports = []
    for filler in (0, 7):
        np.savez(tmp_path / f"calib{filler}.npz", **right_padded(10, 8, seed=3, filler=filler))
        np.savez(tmp_path / f"eval{filler}.npz", **right_padded(8, 8, seed=4, filler=filler, full=2))
        reports.append(replay(tmp_path / "m.onnx", tmp_path / f"calib{filler}.npz", tmp_path / f"eval{filler}.npz",
                              conditions=("correct", "cross_input"), resamples=50, batch_size=4))
    a, b = reports
    assert "cross_input gave" in a.settings["padding"] and "still" not in a.settings["padding"]
    for figure in ("nll", "divergence"):
        assert getattr(b.conditions[1], figure).value == pytest.approx(getattr(a.conditions[1], figure).value,
                                                                       rel=1e-5, abs=1e-7), figure
    assert a.conditions[1].delta_nll.value > 0
