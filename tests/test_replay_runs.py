"""The replay runs the frozen graph once per batch and condition: the parity check's run of the
first batch is the loop's first `correct` run, and the live outputs it read go once it is done."""

import numpy as np

from graphaudit.replay import steps
from graphaudit.replay.pipeline import replay


class _Counted:
    """A session that counts its runs."""

    def __init__(self, session):
        self.session, self.runs = session, 0

    def run(self, names, feeds, *args):
        self.runs += 1
        return self.session.run(names, feeds, *args)

    def __getattr__(self, name):
        return getattr(self.session, name)


def test_each_batch_and_condition_runs_once_and_the_live_outputs_go_after_parity(gated_lm_files, monkeypatch):
    files = gated_lm_files
    opened: list[_Counted] = []
    live_at_loop: list[dict] = []
    evaluation_caches = []
    open_frozen, run_conditions, make_conditions = steps.open_frozen, steps.run_conditions, steps.make_conditions

    def counted(*args, **kwargs):
        opened.append(_Counted(open_frozen(*args, **kwargs)))
        return opened[-1]

    def conditions(names, evaluation, *args, **kwargs):
        evaluation_caches.append(evaluation)
        return make_conditions(names, evaluation, *args, **kwargs)

    def loop(*args, **kwargs):
        live_at_loop.append(dict(evaluation_caches[-1].live))
        return run_conditions(*args, **kwargs)

    monkeypatch.setattr(steps, "open_frozen", counted)
    monkeypatch.setattr(steps, "make_conditions", conditions)
    monkeypatch.setattr(steps, "run_conditions", loop)
    doc = replay(files / "gated.onnx", files / "calib.npz", files / "eval.npz", batch_size=4, resamples=50,
                 rewrite=False).to_json()
    batches, conditions_run = -(-doc["data"]["evaluation_inputs"] // 4), len(doc["conditions"])
    assert (batches, conditions_run) == (3, 6)
    assert [s.runs for s in opened] == [batches * conditions_run]  # the parity check's run is the loop's first
    assert doc["parity"]["ok"] and doc["parity"]["inputs"] == 4 and live_at_loop == [{}]



def test_the_figures_are_those_of_running_the_first_batch_again(gated_lm_files, monkeypatch):
    files = gated_lm_files
    args = (files / "gated.onnx", files / "calib.npz", files / "eval.npz")
    reused = replay(*args, batch_size=4, resamples=50).to_json()
    checked = steps.checked_first_batch
    monkeypatch.setattr(steps, "checked_first_batch", lambda *a, **k: (checked(*a, **k)[0], None))
    again = replay(*args, batch_size=4, resamples=50).to_json()
    assert {k: v for k, v in reused.items() if k != "timing"} == {k: v for k, v in again.items() if k != "timing"}
    assert np.isfinite(reused["conditions"]["cross_input"]["kl"]) and reused["conditions"]["cross_input"]["kl"] > 0
