"""The replay loop (`run_conditions`): what it sums, what it holds while it runs, how a run's error
reaches the caller, and when a session leaves the calling thread a core to score on."""

import contextlib

import numpy as np
import pytest

from graphaudit.analyses.declared_coefficients import declared_coefficients
from graphaudit.errors import GraphAuditError
from graphaudit.load.data import input_specs, load_data
from graphaudit.load.model import load_model
from graphaudit.metrics import PoissonBootstrap, task_for
from graphaudit.metrics.outputs import log_softmax
from graphaudit.replay.capture import capture, native
from graphaudit.replay.conditions import conditions, names
from graphaudit.replay.loop import run_conditions
from graphaudit.replay.surgery import Freeze, LogProbs, Trace
from graphaudit.runtime.sessions import create_session, spare_core

from support.models import gated_lm

CONDITIONS = names()  # every registered condition, the replay's default


@contextlib.contextmanager
def _loop_parts(gated_lm_files):
    """What run_conditions takes, on the gated model: (loaded, coefficients, evaluation inputs,
    the conditions' feeds from caches of batches of 3, the task), the caches open meanwhile."""
    loaded = load_model(gated_lm_files / "gated.onnx")
    coefs = declared_coefficients(loaded.model)
    specs = input_specs(loaded.model)
    calib, evaluation = (load_data(gated_lm_files / f"{k}.npz", specs) for k in ("calib", "eval"))
    trace = Trace(coefs)(loaded.model).model
    with capture(trace, coefs, calib, batch_size=3) as cal, capture(trace, coefs, evaluation, batch_size=3) as ev:
        yield (loaded, coefs, evaluation, conditions(CONDITIONS, ev, cal, seed=5),
               task_for(ev.live, next(evaluation.batches(3))[1], {}))


@pytest.mark.parametrize("overlap", [True, False])
def test_the_loop_sums_what_a_plain_loop_over_every_condition_and_batch_sums(gated_lm_files, overlap):
    """run_conditions, with ONNX Runtime in a worker thread (each run scored while the next one
    runs) or without: its totals must be those of each condition run and scored one at a time,
    in float64, batch by batch (4 batches of 3, 3, 3 and 1 inputs, the `correct` output of
    the same batch as the KL reference)."""
    with _loop_parts(gated_lm_files) as (loaded, coefs, evaluation, feeds, task):
        frozen = Freeze(coefs)(loaded.model).model
        session = create_session(LogProbs(task.output, task.fetch)(frozen).model)
        stats = run_conditions(session, feeds, coefs, evaluation, 3, task, PoissonBootstrap(5, 50), overlap=overlap)
        plain = create_session(frozen)
        ids = evaluation.arrays["input_ids"]
        nll = {name: 0.0 for name in feeds}
        kl = {name: 0.0 for name in feeds}
        for start in range(0, evaluation.count, 3):
            rows = np.arange(start, min(start + 3, evaluation.count))
            logp = {name: log_softmax(plain.run(["logits"], {"input_ids": ids[rows], **{
                        c.tensor: native(c, feed(c, rows)) for c in coefs}})[0].astype(np.float64))
                    for name, feed in feeds.items()}
            targets = ids[rows, 1:]
            for name in feeds:
                picked = np.take_along_axis(logp[name][:, :-1], targets[..., None], axis=-1)
                nll[name] -= picked.sum()
                kl[name] += (np.exp(logp["correct"]) * (logp["correct"] - logp[name])).sum()
    targets, positions = ids[:, 1:].size, ids.size
    assert list(stats) == list(CONDITIONS)
    for name, s in stats.items():
        assert s.inputs == evaluation.count
        assert s.figure("nll")[0] == pytest.approx(nll[name] / targets, rel=1e-5)
        assert s.figure("divergence")[0] == pytest.approx(kl[name] / positions, rel=1e-4, abs=1e-7)
    assert stats["correct"].figure("divergence")[0] == 0
    assert all(stats[name].figure("divergence")[0] > 1e-4 for name in CONDITIONS[1:])


def test_the_loop_without_a_worker_holds_no_earlier_output_while_it_runs(gated_lm_files):
    """Run in this thread, each run is scored before the next starts, and a batch's `correct`
    output is let go once it is scored (KL reads its probabilities): no run's output is alive
    when the next run starts (a batch of log-probabilities at a 50k vocabulary is 412 MB)."""
    import gc
    import weakref

    with _loop_parts(gated_lm_files) as (loaded, coefs, evaluation, feeds, task):
        session = create_session(LogProbs(task.output, task.fetch)(Freeze(coefs)(loaded.model).model).model)
        outputs, alive = [], []

        class Watched:
            def __getattr__(self, name):
                return getattr(session, name)

            def run(self, *args):
                gc.collect()
                alive.append(sum(ref() is not None for ref in outputs))
                result = session.run(*args)
                outputs.extend(weakref.ref(a) for a in result)
                return result

        run_conditions(Watched(), feeds, coefs, evaluation, 3, task, PoissonBootstrap(5, 50), overlap=False)
    assert len(alive) == 4 * len(CONDITIONS) and max(alive) == 0


def test_a_run_error_in_the_worker_thread_reaches_the_caller_in_one_line(gated_lm_files):
    loaded = load_model(gated_lm_files / "gated.onnx")
    coefs = declared_coefficients(loaded.model)
    specs = input_specs(loaded.model)
    calib = load_data(gated_lm_files / "calib.npz", specs)
    with capture(Trace(coefs)(loaded.model).model, coefs, calib, batch_size=4) as cache:
        feeds = conditions(["correct"], cache, cache, seed=0)
        task = task_for(cache.live, next(calib.batches(4))[1], {})
        session = create_session(LogProbs(task.output, task.fetch)(Freeze(coefs)(loaded.model).model).model)
        broken = {"correct": lambda c, rows: feeds["correct"](c, rows)[..., :1]}  # a coefficient cut short
        for overlap in (True, False):  # named: the condition, the inputs, ONNX Runtime's node and words
            with pytest.raises(GraphAuditError, match=r"^expected the frozen graph to run on the correct coefficients "
                                                      r"of evaluation inputs 0\.\.3, found ONNX Runtime's error.*"
                                                      r"(?i:dimension|shape)"):
                run_conditions(session, broken, coefs, calib, 4, task, PoissonBootstrap(0, 10), overlap=overlap)


def test_a_spare_core_is_one_the_session_leaves_to_the_calling_thread(monkeypatch):
    import onnxruntime as ort

    model = gated_lm()
    default = create_session(model)
    one = create_session(model, threads=1)
    assert not spare_core(default)  # ONNX Runtime's default: a thread per physical core
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert spare_core(one)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    assert not spare_core(one)  # a process held to one core has none to spare
    with pytest.raises(GraphAuditError, match=r"expected threads in 1\.\.1024, found 0"):
        create_session(model, threads=0)
    assert isinstance(one, ort.InferenceSession)
