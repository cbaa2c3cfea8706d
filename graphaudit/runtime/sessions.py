"""ONNX Runtime sessions: providers chosen by name, failures explained in one line.

Every part of graphaudit that runs a model (capture, replay, profile) creates its session
through `create_session`, so that a model with an operator ONNX Runtime lacks, or a CUDA
request on a machine without CUDA, gives the same clear error everywhere. ONNX Runtime's
own log lines are silenced: every failure it reports also comes back as an exception,
which graphaudit words as one line. A model whose weights lie in external files is handed
over without them, with the folder they are in, and ONNX Runtime maps them itself. `running` does the same for a run that the user's
inputs make fail (an index past a table, a sequence longer than the model takes).
Capture and replay leave out `slow_fusions`, fusions measured slower on CPU; the profile
keeps ONNX Runtime's own choices, since it measures the model as ONNX Runtime runs it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as _ort_state

from graphaudit.errors import GraphAuditError
from graphaudit.limits import MAX_THREADS
from graphaudit.load.protos import node_lists
from graphaudit.runtime import denormals
from graphaudit.runtime.handed_weights import is_stub, weights_apart
from graphaudit.wording import TRACED_SIZES

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
# What ONNX Runtime raises when a run fails on the inputs it was given.
RUN_ERRORS = (_ort_state.Fail, _ort_state.InvalidArgument, _ort_state.RuntimeException)
_FATAL_ONLY = 4  # ORT log severity: only fatal errors, which end the process anyway
_WARNINGS = 2  # ORT log severity: warnings and errors (`-v`)
_severity = [_FATAL_ONLY]  # what graphaudit's sessions log: set by show_runtime_logs


def show_runtime_logs() -> None:
    """Let ONNX Runtime's own log lines (warnings and errors) reach stderr from now on (`-v`): they
    are silenced by default, since every failure it reports also comes back as an exception."""
    _severity[0] = _WARNINGS
    ort.set_default_logger_severity(_WARNINGS)


def runtime_log_severity() -> int:
    """The log severity graphaudit's ONNX Runtime sessions are made with."""
    return _severity[0]
# Session option: the folder external-data locations are relative to, for a model given as bytes
EXTERNAL_WEIGHTS_FOLDER = "session.model_external_initializers_file_folder_path"
# Fusions graphaudit's own CPU sessions leave out, each measured slower than what it fuses:
# ONNX Runtime 1.32's CPU SkipLayerNormalization ran Add + LayerNormalization 3-7x slower than
# the two unfused kernels (hidden 64-2048, 1 and 2 threads), and FeatureGate's frozen graph
# 17% faster without it (benchmarks/NOTES.md, replay). Outputs differ by rounding only.
SLOW_CPU_FUSIONS = ("SkipLayerNormFusion",)
# Session option: whether intra-op threads spin between runs ("0": they sleep)
NO_SPINNING = "session.intra_op.allow_spinning"
NO_QDQ_FUSIONS = "session.disable_quant_qdq"  # QuantizeLinear / DequantizeLinear left unfused
# Operator domains ONNX Runtime implements kernels for (everything else is custom).
RUNTIME_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc",
                             "com.ms.internal.nhwc", "ai.onnx.preview.training", "com.microsoft.experimental"})


def resolve_providers(provider: str) -> list[str]:
    """Return ONNX Runtime's provider list for `provider` (cpu, cuda or auto).

    `auto` is CUDA where a CUDA session really runs (`cuda_usable`, probed once), else the CPU,
    with one note (logged to "graphaudit") saying why when ONNX Runtime offers CUDA but cannot
    use it; `cuda` where it cannot run is an error.
    """
    available = ort.get_available_providers()
    if provider == "auto":
        if PROVIDERS["cuda"] not in available:
            return [PROVIDERS["cpu"]]
        problem = cuda_problem()
        if problem is None:
            return [PROVIDERS["cuda"], PROVIDERS["cpu"]]
        _note_once(f"CUDA is not usable here ({problem}): running on the CPU")
        return [PROVIDERS["cpu"]]
    if provider not in PROVIDERS:
        raise GraphAuditError(
            f"expected a provider among cpu, cuda, auto, found {provider!r}", exit_code=2
        )
    name = PROVIDERS[provider]
    if name not in available:
        hint = (" (install graphaudit[gpu], not [cpu]: an environment holds one ONNX Runtime)"
                if provider == "cuda" else "")
        raise GraphAuditError(
            f"expected ONNX Runtime with the {name}{hint}, found only {', '.join(available)}"
        )
    if provider == "cuda" and (problem := cuda_problem()) is not None:
        raise GraphAuditError(f"expected ONNX Runtime to run on CUDA, found {problem}")
    return [name] + ([PROVIDERS["cpu"]] if provider == "cuda" else [])


# One node, one input: a session of it on CUDA runs only where the CUDA libraries and a device are.
_PROBE = onnx.helper.make_model(
    onnx.helper.make_graph([onnx.helper.make_node("Neg", ["x"], ["y"])], "cuda_probe",
                           [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                           [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]),
    opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=8)


@functools.cache
def cuda_problem() -> str | None:
    """Why a CUDA session cannot run here, in a few words; None where one runs. Probed once per
    process, by creating a session of a one-node model on CUDA and running it, with ONNX
    Runtime's log lines silenced (a missing library is otherwise logged in colour on stderr)."""
    ort.set_default_logger_severity(_severity[0])  # loading the CUDA provider's library logs its failure
    options = ort.SessionOptions()
    options.log_severity_level = _severity[0]
    try:
        with denormals.kept(), warnings.catch_warnings():  # ONNX Runtime warns of a provider it lacks
            warnings.simplefilter("ignore")
            session = ort.InferenceSession(_PROBE.SerializeToString(), sess_options=options,
                                           providers=[PROVIDERS["cuda"], PROVIDERS["cpu"]])
        if session.get_providers()[0] != PROVIDERS["cuda"]:
            return "ONNX Runtime fell back to the CPU (are the CUDA libraries installed?)"
        session.run(None, {"x": np.ones(1, np.float32)})
    except Exception as err:  # noqa: BLE001 - whatever stops a CUDA session is the reason
        return " ".join(str(err).split())[:200] or type(err).__name__
    return None


_noted: set[str] = set()


def _note_once(message: str) -> None:
    if message not in _noted:
        _noted.add(message)
        logging.getLogger("graphaudit").warning(message)


def custom_operators(model: onnx.ModelProto) -> list[str]:
    """`domain.op` of every operator (bodies and functions included) outside ONNX Runtime's domains."""
    local = {(f.domain, f.name) for f in model.functions}
    found: list[str] = []
    for nodes in node_lists(model):
        for node in nodes:
            if node.domain not in RUNTIME_DOMAINS and (node.domain, node.op_type) not in local:
                label = f"{node.domain}.{node.op_type}"
                if label not in found:
                    found.append(label)
    return found


def create_session(
    model: onnx.ModelProto | bytes | str,
    providers: list[str] | None = None,
    options: ort.SessionOptions | None = None,
    disabled_optimizers: Sequence[str] = (),
    weights_folder: Path | None = None,
    threads: int | None = None,
    flush_denormals: bool = False,
    spinning: bool = True,
    weights: Mapping[str, np.ndarray] | None = None,
    qdq_fusions: bool = True,
    profile_prefix: Path | None = None,
) -> ort.InferenceSession:
    """Return an InferenceSession for `model`, or a GraphAuditError saying why there is none.

    `weights_folder`: where the external weights `model` refers to lie (`LoadedModel.weights_folder`);
    ONNX Runtime maps them from there, so they never pass through the serialised proto.
    `threads`: ONNX Runtime's intra-op threads (None: its own choice, one per physical core).
    `flush_denormals`: the session's runs flush denormals to zero, on ONNX Runtime's intra-op
    pool threads and on the thread that calls `run` (a `denormals.FlushingSession` is returned).
    Whatever ONNX Runtime's constructor does to the calling thread's floating-point environment
    is undone.
    `spinning` False: the intra-op threads sleep as soon as a run ends instead of spinning for
    the next (a session that runs now and then beside another, whose threads it would slow).
    A ModelProto's large inline weights reach ONNX Runtime as arrays (`weights_apart`) when the
    options are create_session's own; should that session fail, the whole serialised model is tried.
    `weights`: arrays for the weights `model` holds as `weights_apart`'s stubs (taken out of a
    larger model once, and shared, unread and uncopied, by the sessions of its parts).
    `qdq_fusions` False: QuantizeLinear / DequantizeLinear pairs run as written instead of fused
    into integer kernels (`quantized_pairs`).
    `profile_prefix`: ONNX Runtime's profiler on, its file written at this prefix (the path
    `end_profiling` gives back).
    """
    if threads is not None:
        check_threads(threads)
    providers = providers or [PROVIDERS["cpu"]]
    disabled = list(disabled_optimizers) or None

    def opened(payload: bytes | str, options: ort.SessionOptions) -> ort.InferenceSession:
        with denormals.kept():  # ONNX Runtime's constructor sets or clears FTZ/DAZ on this thread
            session = ort.InferenceSession(payload, sess_options=options, providers=providers,
                                           disabled_optimizers=disabled)
        return denormals.FlushingSession(session) if flush_denormals else session

    if isinstance(model, onnx.ModelProto) and options is None:
        # Weights handed over sit in the options until the session is made: only in options of
        # our own, since a caller's may make a second session, which would be handed them twice.
        skeleton, names, arrays = weights_apart(model)
        if weights:
            stubs = [t.name for t in model.graph.initializer if t.name in weights and is_stub(t)]
            names, arrays = names + stubs, arrays + [weights[n] for n in stubs]
        if names:
            mine = configured(ort.SessionOptions(), threads, weights_folder, flush_denormals, spinning, qdq_fusions,
                            profile_prefix)
            mine.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays])
            try:
                return opened(skeleton.SerializeToString(), mine)
            except Exception:  # noqa: BLE001 - whatever ONNX Runtime objects to, the whole model below tells
                pass
    payload = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    options = configured(options or ort.SessionOptions(), threads, weights_folder, flush_denormals, spinning,
                       qdq_fusions, profile_prefix)
    try:
        return opened(payload, options)
    except Exception as err:  # noqa: BLE001 - ORT raises its own Fail/NotImplemented types
        message = " ".join(str(err).split())
        custom = custom_operators(model) if isinstance(model, onnx.ModelProto) else []
        missing = re.findall(r"([\w.]*:\w+)\(-?\d+\) is not a registered function/op", message)
        missing += [op + _typed(model, op.split("(")[0], name or node) for op, name, node in re.findall(
            r"(?:Could not find an implementation|Failed to find kernel) for (\w+\(\d+\))"
            r"(?: node with name '([^']*)'|\s*\(node:'([^']*)')?", message)]
        if custom or missing:
            ops = ", ".join(custom or [m.replace(":", ".") for m in missing])
            raise GraphAuditError(
                f"expected operators ONNX Runtime implements, found {ops}, which it lacks; "
                "the static audit (graphaudit static) still works, the runtime parts cannot run"
            ) from None
        opset = re.search(r"Opset (\d+) is under development.*?till opset (\d+)", message)
        if opset:
            raise GraphAuditError(
                f"expected an ONNX opset ONNX Runtime supports (up to {opset.group(2)}), found opset {opset.group(1)}"
            ) from None
        raise GraphAuditError(f"expected a model ONNX Runtime can load, found its objection: {message[:400]}") from None


def _typed(model, op: str, name: str) -> str:
    """" on <types> inputs" for the node ONNX Runtime found no kernel for (named `name`, else the
    first `op` node), from the element types `model` declares or inferred; "" when unknown.
    ONNX Runtime implements many operators for some element types only."""
    if not isinstance(model, onnx.ModelProto):
        return ""
    nodes = [n for nodes in node_lists(model) for n in nodes if n.op_type == op]
    node = next((n for n in nodes if name and n.name == name), nodes[0] if nodes else None)
    if node is None:
        return ""
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info, *graph.output)
             if v.type.HasField("tensor_type")}
    types.update((t.name, t.data_type) for t in graph.initializer)
    found = [onnx.helper.tensor_dtype_to_string(types[i]).removeprefix("TensorProto.").lower()
             for i in node.input if types.get(i)]
    return f" on {'/'.join(dict.fromkeys(found))} inputs" if found else ""


def configured(options: ort.SessionOptions, threads: int | None, weights_folder: Path | None = None,
               flush_denormals: bool = False, spinning: bool = True, qdq_fusions: bool = True,
               profile_prefix: Path | None = None) -> ort.SessionOptions:
    """`options` with the threads, the external weights' folder, the denormals' flushing, the
    threads' spinning, the QDQ fusions, the profiler and ORT's logging create_session sets (and
    the profile's sessions, through profile.session.session_options)."""
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    if not qdq_fusions:
        options.add_session_config_entry(NO_QDQ_FUSIONS, "1")
    if flush_denormals:
        options.add_session_config_entry(denormals.SESSION_OPTION, "1")
    if not spinning:
        options.add_session_config_entry(NO_SPINNING, "0")
    if threads is not None:
        options.intra_op_num_threads = threads
    if weights_folder is not None:
        options.add_session_config_entry(EXTERNAL_WEIGHTS_FOLDER, str(weights_folder))
    options.log_severity_level = _severity[0]  # failures come back as exceptions, worded once
    return options


def detached(value: np.ndarray) -> np.ndarray:
    """`value`, an output of a session's `run`, as an array of its own, to keep past the run.

    ONNX Runtime's `run` hands back views of the memory its arena allocated: one kept view
    holds the whole arena, after the session is gone too (a detector's trace session, 1.7 GB
    at 12 images of 736 x 736 pixels, stayed while the frozen graph's sessions ran; benchmarks/NOTES.md)."""
    return np.array(value, copy=True)


def check_threads(threads: int) -> None:
    """Refuse an intra-op thread count outside 1..MAX_THREADS (a usage error)."""
    if not 1 <= threads <= MAX_THREADS:
        raise GraphAuditError(f"expected threads in 1..{MAX_THREADS}, found {threads}", exit_code=2)


def usable_threads(threads: int | None) -> tuple[int | None, str | None]:
    """`threads` (checked: `check_threads`) capped at the CPU cores this process may use, and a
    note saying so when it was capped (None: ONNX Runtime's choice, kept). Intra-op threads past
    the cores only wait on each other: 1024 on 2 cores ran 60 times slower, a time that is the
    machine's, not the model's, so the run takes the cores and the report says why."""
    if threads is None:
        return None, None
    check_threads(threads)
    cores = usable_cores()
    if threads <= cores:
        return threads, None
    return cores, (f"--threads {threads} was capped at the {cores} CPU cores this process may use: intra-op threads "
                   "past the cores only wait on each other, and the times would be the machine's, not the model's")


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def spare_core(session: ort.InferenceSession) -> bool:
    """Whether `session` leaves the calling thread a CPU core of this process's own: it runs
    on an accelerator first, or on fewer intra-op threads than the cores the process may use.
    ONNX Runtime's default (0) takes one thread per physical core, leaving none."""
    if session.get_providers()[0] != PROVIDERS["cpu"]:
        return True
    threads = session.get_session_options().intra_op_num_threads
    return 0 < threads < usable_cores()


def quantized_pairs(model: onnx.ModelProto) -> int:
    """How many DequantizeLinear nodes a quantized model in QDQ form has in its main graph.

    ONNX Runtime fuses a DequantizeLinear → op → QuantizeLinear group into one integer kernel
    where the group's values stay inside it. Cutting a graph (the trace graph's exposed
    coefficients, the frozen graph's fed ones, its prefix cut) changes which groups stay whole,
    so the live and frozen graphs would round apart (0.15 on logits of 19 on a QDQ FeatureGate)
    where the model's own definition, the pairs as written, gives both the same values.
    """
    return sum(1 for node in model.graph.node if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"))


def slow_fusions(providers: list[str] | None = None) -> tuple[str, ...]:
    """The optimisers graphaudit's own sessions (capture, replay) leave out on `providers`."""
    return SLOW_CPU_FUSIONS if (providers or [PROVIDERS["cpu"]])[0] == PROVIDERS["cpu"] else ()


@contextlib.contextmanager
def running(what: str) -> Iterator[None]:
    """Turn ONNX Runtime's objection to running `what` on the user's inputs into a GraphAuditError."""
    try:
        yield
    except RUN_ERRORS as err:
        raise GraphAuditError(f"expected inputs that {what} can run on, found {describe_run_error(err)}") from None


class FrozenRunError(GraphAuditError):
    """ONNX Runtime would not run the frozen graph on some condition's coefficients: a fact
    about the model (its graph fits only the coefficients it was exported with), not bad input.
    `cause`: ONNX Runtime's objection in a few words (`describe_run_error`)."""

    def __init__(self, message: str, cause: str = "") -> None:
        super().__init__(message)
        self.cause = cause


@contextlib.contextmanager
def replaying(condition: str, rows: slice) -> Iterator[None]:
    """Turn ONNX Runtime's objection to running the frozen graph on a condition's coefficients
    into a FrozenRunError that names the condition and the inputs."""
    try:
        yield
    except RUN_ERRORS as err:
        cause = describe_run_error(err).rstrip(".")
        raise FrozenRunError(
            f"expected the frozen graph to run on the {condition} coefficients of evaluation inputs "
            f"{rows.start}..{rows.stop - 1}, found {cause}; {TRACED_SIZES}", cause
        ) from None


def describe_run_error(err: BaseException) -> str:
    """ONNX Runtime's run error in a few words: the node, its operator and the message."""
    message = " ".join(str(err).split())
    node = re.search(r"running (\w+) node\. Name:'([^']*)' Status Message: (.*)", message)
    if node:
        op, name, detail = node.groups()
        detail = re.sub(r"^/\S+:\d+ \S+ ", "", detail)  # the C++ source location
        return f"ONNX Runtime's error in node {name!r} ({op}): {detail[:300]}"
    message = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", message)
    return f"ONNX Runtime's error: {message[:400]}"
