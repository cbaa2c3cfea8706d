"""The replay sharded over Ray workers (`--ray`), its statistics merged exactly.

`replay_on_ray` connects to Ray (an embedded local instance, or a cluster at an address),
starts one actor per shard (graphaudit.replay.shards.ShardWorker: each opens its own ONNX
Runtime sessions once), has every actor capture its shard, merges the coefficients in input
order and hands them to every actor through Ray's object store, has every actor replay its
shard, and adds up the statistics they send back. The model reaches the actors by its path on
an embedded Ray (the same disk) and through the object store on a cluster, external weights
included; the data always goes through the object store.

A worker that dies or fails (a Ray error: its process killed, its node lost, an exception that
is not a refusal of the model) is replaced by a new actor that does the shard again; a shard
that fails twice fails the audit, naming its inputs. A refusal (a GraphAuditError in a worker:
a parity failure, NaN coefficients) is raised at once, as one process raises it.

An embedded Ray keeps its files in a temporary folder of its own, inside graphaudit's (the
CLI's scratch folder), removed when the replay ends. `GRAPHAUDIT_RAY_CRASH=SHARD:BATCHES[:WORKERS]`
makes that shard's first worker (or first WORKERS workers) kill itself with SIGKILL after that
many batches of its replay: how the tests check retries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from graphaudit.errors import GraphAuditError
from graphaudit.files import scratch
from graphaudit.load.data import InputData
from graphaudit.load.model import LoadedModel
from graphaudit.progress import Progress
from graphaudit.replay.shards import (
    Captured,
    ModelFiles,
    Refusal,
    Shard,
    ShardWorker,
    merge_arrays,
    merge_every,
    merge_stats,
    merged_cache,
    plan_shards,
)
from graphaudit.replay.steps import Replayed, ReplayedConditions, ReplayJob
from graphaudit.runtime.sessions import usable_cores
from graphaudit.wording import counted

RAY_MISSING = "expected Ray for --ray, found it is not installed: pip install 'graphaudit[ray]'"
CRASH_VARIABLE = "GRAPHAUDIT_RAY_CRASH"
ATTEMPTS = 2  # a shard's workers: the first, and the one that does it again
POLL_S = 0.25  # how often the progress of the workers is read while they run
CLOSE_S = 10.0  # how long the actors may take to remove their files before they are ended
ENDED_S = 2.0  # how long an embedded Ray's processes may take to end after ray.shutdown, before they are killed
STOP_GRACE_S = 15.0  # how long a command stopped by a signal may take to end an embedded Ray (scratch.grace)
# the longest temporary folder an embedded Ray's files may go in: its sockets' paths add up to 79
# bytes to it (/ray-XXXXXXXX/session_<date>_<time>_<6 digits>_<pid>/sockets/plasma_store) of the 107 allowed
RAY_FOLDER_ROOM = 28


def import_ray() -> Any:
    """The `ray` module, or the one-line GraphAuditError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise GraphAuditError(RAY_MISSING) from None
    return ray


def replay_on_ray(loaded: LoadedModel, job: ReplayJob, calibration: InputData, evaluation: InputData,
                  address: str, workers: int | None, progress: Progress | None) -> Replayed:
    """Capture and replay `job` over shards of the inputs on Ray (`address` "": an embedded local
    instance); the merged Replayed, its settings saying how it ran."""
    ray = import_ray()
    timing: dict[str, float] = {}
    clock = time.perf_counter()
    with _connected(ray, address) as (cpus, node_cpus):
        timing["ray_start_s"], clock = time.perf_counter() - clock, time.perf_counter()
        shards = plan_shards(calibration.count, evaluation.count, job.batch_size, workers or cpus)
        threads = job.threads or max(1, min(cpus // len(shards), node_cpus))
        job = replace(job, threads=threads)
        model: str | ModelFiles = str(loaded.path) if address == "" and loaded.path is not None \
            else ModelFiles.of(loaded)
        pool = _Pool(ray, ray.put(model), job, shards, _crash_spec(), (calibration, evaluation))
        ended = False
        try:
            captured = pool.run("capture", pool.capture, evaluation.count, progress=None)
            first = captured[0]
            timing["capture_s"], clock = time.perf_counter() - clock, time.perf_counter()
            calib_arrays = merge_arrays([c.calibration for c in captured])
            eval_arrays = merge_arrays([c.evaluation for c in captured])
            merged = ray.put(calib_arrays), ray.put(eval_arrays)
            timing["merge_s"], clock = time.perf_counter() - clock, time.perf_counter()
            replayed = _replay_all(pool, merged, first, job.rewrite, evaluation.count, progress)
            timing["replay_s"] = time.perf_counter() - clock
            # the slowest worker's own times: what is over them in capture_s and replay_s is Ray's
            for key, parts in (("worker_load_s", [c.timing["load_s"] for c in captured]),
                               ("worker_capture_s", [c.timing["capture_s"] for c in captured]),
                               ("worker_replay_s", [r.timing["parity_s"] + r.timing["replay_s"] for r in replayed])):
                timing[key] = max(parts)
            ended = True
        finally:  # stopped or failed: the actors are ended at once (an embedded Ray's files go with graphaudit's)
            pool.close(graceful=ended)
    stats, failed = merge_stats(replayed)
    settings = {**first.tolerance_settings, **replayed[0].settings, "threads": threads,
                "distributed": {"engine": "ray", "address": address or "local", "workers": len(shards),
                                "threads_per_worker": threads, "retries": pool.retries,
                                "shards": [[s.evaluation.start, s.evaluation.stop] for s in shards]},
                "distributed_note": _note(address, shards, workers or cpus, job.batch_size, threads, pool.retries),
                "cache": {"location": "Ray workers' memory", "reused": False,
                          "bytes": sum(a.nbytes for a in (*calib_arrays.values(), *eval_arrays.values()))}}
    caches = merged_cache(job.coefficients, calib_arrays), merged_cache(job.coefficients, eval_arrays)
    return Replayed(caches, first.task, replayed[0].parity, stats, failed,
                    merge_every([r.every for r in replayed]), settings, replayed[0].notes, timing)


def _replay_all(pool: _Pool, merged: tuple[Any, Any], first: Captured, rewrite: bool, total: int,
                progress: Progress | None) -> list[ReplayedConditions]:
    """Every shard replayed; where a rewritten frozen graph did not reproduce the live outputs on
    some shard, every shard replayed with the graph as exported, as one process would have."""
    def call(rewritten: bool) -> Callable:
        def submit(k: int, worker: Any) -> Any:
            return worker.replay.remote(*merged, first.task, first.tolerance, rewritten,
                                        pool.reporter(k), pool.crash_after(k))
        return submit

    replayed = pool.run("replay", call(rewrite), total, progress)
    if rewrite and any(r.settings.get("rewrite_note") for r in replayed):
        kept = next(r for r in replayed if r.settings.get("rewrite_note"))
        replayed = pool.run("replay", call(False), total, progress)
        for r in replayed:
            r.settings = {**r.settings, "rewrite_note": kept.settings["rewrite_note"]}
    return replayed


class _Pool:
    """The actors of the shards, each replaced once where it dies (`run`), and their progress."""

    def __init__(self, ray: Any, model: Any, job: ReplayJob, shards: Sequence[Shard],
                 crash: tuple[int, int, int] | None, data: tuple[InputData, InputData]):
        self.ray, self.model, self.job, self.shards, self.crash = ray, model, job, list(shards), crash
        self._data = ray.put(data[0]), ray.put(data[1])  # the calibration and evaluation inputs, put once
        self.retries = 0
        self._attempts = [0] * len(shards)
        self._actor = ray.remote(ShardWorker).options(num_cpus=job.threads, max_restarts=0, max_task_retries=0)
        self._tally = ray.remote(_Tally).options(num_cpus=0).remote(len(shards))
        self.workers = [self._start(s) for s in shards]

    def _start(self, shard: Shard) -> Any:
        return self._actor.remote(self.model, self.job, shard)

    def capture(self, k: int, worker: Any) -> Any:
        """Shard k's capture, submitted to `worker`."""
        return worker.capture.remote(*self._data)

    def reporter(self, k: int) -> Callable[[int], object]:
        tally = self._tally
        return lambda done: tally.record.remote(k, done)

    def crash_after(self, k: int) -> int | None:
        crash = self.crash
        return crash[1] if crash is not None and crash[0] == k and self._attempts[k] < crash[2] else None

    def run(self, step: str, submit: Callable[[int, Any], Any], total: int, progress: Progress | None) -> list[Any]:
        """`submit(k, actor)` for every shard k, their answers in shard order. A shard whose actor
        dies gets a new actor, which captures its shard again before a replay."""
        ray = self.ray
        pending = {submit(k, w): k for k, w in enumerate(self.workers)}
        answers: dict[int, Any] = {}
        shown = -1
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            if progress is not None:
                done = ray.get(self._tally.done.remote())
                if done != shown:
                    progress(step, done, total)
                    shown = done
            for ref in ready:
                k = pending.pop(ref)
                try:
                    answer = ray.get(ref)
                except ray.exceptions.RayError as err:
                    pending[self._again(k, step, submit, err)] = k
                    continue
                if isinstance(answer, Refusal):
                    answer.raise_it()
                answers[k] = answer
        if progress is not None and step == "replay":
            progress(step, total, total)
        return [answers[k] for k in range(len(self.shards))]

    def _again(self, k: int, step: str, submit: Callable[[int, Any], Any], err: Exception) -> Any:
        """Shard k's work submitted to a new actor (captured again first, for a replay), once: a
        shard whose second worker fails too fails the audit."""
        while True:
            self._attempts[k] += 1
            if self._attempts[k] >= ATTEMPTS:
                raise GraphAuditError(f"expected {self.shards[k].describe()} to {step} on a Ray worker, found "
                                      f"that it failed {ATTEMPTS} times: {_cause(err)}")
            self.retries += 1
            self._end(self.workers[k])
            self.ray.get(self._tally.record.remote(k, 0))
            worker = self.workers[k] = self._start(self.shards[k])
            if step != "replay":
                return submit(k, worker)
            try:  # its live outputs and the data are the new actor's too, once it has captured
                recaptured = self.ray.get(self.capture(k, worker))
            except self.ray.exceptions.RayError as again:
                err = again
                continue
            if isinstance(recaptured, Refusal):
                recaptured.raise_it()
            return submit(k, worker)

    def _end(self, worker: Any) -> None:
        """End an actor that failed, once it has removed its files where it still can."""
        with contextlib.suppress(Exception):  # a dead actor: nothing to remove, nothing to end
            self.ray.wait([worker.close.remote()], timeout=CLOSE_S)
        with contextlib.suppress(Exception):
            self.ray.kill(worker)

    def close(self, graceful: bool = True) -> None:
        """End every actor (on a cluster they would outlive the connection otherwise), `graceful`:
        once it has removed what it wrote (`ShardWorker.close`: a model shipped as files). Not
        after a failure or a signal: an actor still replaying would answer only once done."""
        closing = []
        for worker in self.workers if graceful else ():
            with contextlib.suppress(Exception):  # one already gone
                closing.append(worker.close.remote())
        with contextlib.suppress(Exception):  # a dead actor's answer is an error: it has nothing to close
            self.ray.wait(closing, num_returns=len(closing), timeout=CLOSE_S)
        for worker in [*self.workers, self._tally]:
            with contextlib.suppress(Exception):
                self.ray.kill(worker)


class _Tally:
    """The inputs each shard has replayed so far, as its worker reports them (a Ray actor)."""

    def __init__(self, shards: int):
        self.counts = [0] * shards

    def record(self, shard: int, done: int) -> None:
        self.counts[shard] = done

    def done(self) -> int:
        return sum(self.counts)


@contextlib.contextmanager
def _connected(ray: Any, address: str) -> Iterator[tuple[int, int]]:
    """Ray connected (an embedded instance started for this replay where `address` is "" and
    none runs in this process, its files removed afterwards); the CPUs it has in all and on its
    largest node."""
    if ray.is_initialized():  # the caller's own Ray: used as it is, and left running
        yield _cpus(ray)
        return
    folder = None
    with contextlib.ExitStack() as stack:
        try:
            if address == "":
                # stopping the actors and Ray's own processes takes 1.5-2.5 s: longer than a signal's grace
                stack.enter_context(scratch.grace(STOP_GRACE_S))
                folder = stack.enter_context(scratch.tracked(_ray_folder()))
                # last: once Ray's processes, which write into it until they end, have ended
                stack.callback(_ended, folder)
            stack.callback(ray.shutdown)  # set before it starts: a signal may stop it half started
            if folder is not None:
                _init(ray, num_cpus=usable_cores(), include_dashboard=False, log_to_driver=False,
                      logging_level=logging.ERROR, _temp_dir=str(folder),
                      runtime_env={"env_vars": {"TMPDIR": tempfile.gettempdir()}})
            else:
                _init(ray, address=address, log_to_driver=False, logging_level=logging.ERROR)
        except (ConnectionError, OSError, RuntimeError, ValueError) as err:  # the stack stops what it started
            where = f"a Ray cluster at {address}" if address else "a local Ray instance"
            raise GraphAuditError(f"expected {where} to start, found {_cause(err)}") from None
        yield _cpus(ray)


def _init(ray: Any, **options: Any) -> None:
    """`ray.init(**options)`, the signal handlers set before it set again after it: it makes SIGTERM
    a `sys.exit(15)` of its own, where graphaudit's (graphaudit.files.scratch) stops the command in
    one line with status 143. A SIGTERM while it starts is handed to the handler it replaced."""
    signals = scratch.SIGNALS if threading.current_thread() is threading.main_thread() else ()
    handlers = {s: signal.getsignal(s) for s in signals}
    try:
        ray.init(**options)
    except SystemExit as stop:  # only Ray's own SIGTERM handler exits inside ray.init
        previous = handlers.get(signal.SIGTERM)
        if stop.code != signal.SIGTERM or not callable(previous):
            raise
        _restore(handlers)
        previous(signal.SIGTERM, None)
        raise
    finally:
        _restore(handlers)


def _restore(handlers: dict) -> None:
    for s, handler in handlers.items():
        if handler is not None:
            signal.signal(s, handler)


def _ended(folder: Path, timeout: float = ENDED_S) -> None:
    """Ray's processes for `folder` ended: they name it on their command lines (an embedded Ray's
    session folder), and may write their logs there until they end. `ray.shutdown` stops them;
    those it cannot (a Ray that a signal stopped half started is not yet its to stop) are killed
    after `timeout` seconds. Nothing to do where there is no /proc."""
    if not Path("/proc").is_dir():
        return
    deadline = time.monotonic() + timeout
    while (left := _naming(folder)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(OSError):  # ended meanwhile
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while _naming(folder) and time.monotonic() < deadline:
        time.sleep(0.05)


def _naming(folder: Path) -> list[int]:
    """The processes whose command line names `folder` (this one's never does)."""
    name, found = os.fsencode(folder), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if name in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # ended meanwhile, or not ours to read
                continue
    return found


def _ray_folder() -> Path:
    """A new folder for an embedded Ray's files: in the temporary folder (graphaudit's own, under
    the CLI), or where that path is too long for the Unix sockets Ray makes in it (107 bytes with
    Ray's own names), in /tmp (the caller tracks it for removal, `scratch.tracked`)."""
    base = tempfile.gettempdir()
    if len(base) > RAY_FOLDER_ROOM:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix="ray-", dir=base))


def _cpus(ray: Any) -> tuple[int, int]:
    total = int(ray.cluster_resources().get("CPU", 1))
    nodes = [int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive", True)]
    return max(1, total), max(1, max(nodes, default=total))


def _crash_spec() -> tuple[int, int, int] | None:
    """(shard, batches, workers) from CRASH_VARIABLE: that shard's first `workers` workers kill
    themselves after `batches` batches of the replay."""
    value = os.environ.get(CRASH_VARIABLE)
    if not value:
        return None
    try:
        shard, batches, *times = (int(part) for part in value.split(":"))
        if len(times) > 1:
            raise ValueError(value)
    except ValueError:
        raise GraphAuditError(f"expected {CRASH_VARIABLE}=SHARD:BATCHES[:WORKERS], found {value!r}") from None
    return shard, batches, times[0] if times else 1


def _cause(err: Exception) -> str:
    return " ".join(str(err).split())[:300]


def _note(address: str, shards: Sequence[Shard], asked: int, batch_size: int, threads: int, retries: int) -> str:
    where = f"the Ray cluster at {address}" if address else "a local Ray instance"
    fewer = f" ({asked} asked: the evaluation inputs make {len(shards)} batch{'es' if len(shards) != 1 else ''} of {batch_size})" \
        if len(shards) < asked else ""
    again = f"; {counted(retries, 'shard')} done again on a new worker after one died" if retries else ""
    each = "its shard" if len(shards) == 1 else "each a shard"
    return (f"captured and replayed on {counted(len(shards), 'worker')} of {where}{fewer}, {each} of whole "
            f"batches, with {counted(threads, 'ONNX Runtime thread')} each; their statistics were added up (the "
            f"same sums as one process, in another order){again}")


