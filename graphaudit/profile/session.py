"""ONNX Runtime sessions for profiling: optimisation level, profiler files, unique node names.

The profiler names events after nodes, so every node (inside If / Loop bodies too) must
have a unique, non-empty name. `runnable_model` keeps the user's file when that already
holds, and otherwise gives a renamed copy whose names are the ModelGraph's node ids; either way,
where the file holds large weights inline, the sessions get the graph alone, each weight
referring to its bytes in the file.
Profiler files and the optimised model ORT saves are written under a folder the caller
owns (a temporary one), never beside the user's model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import onnx
import onnxruntime as ort

from graphaudit.errors import GraphAuditError
from graphaudit.load.model import LoadedModel
from graphaudit.load.node_ids import unique_ids
from graphaudit.load.protos import all_nodes
from graphaudit.profile.settings import OPT_LEVEL_NAMES
from graphaudit.runtime.handed_weights import graph_in_file, holds_weights, without_weights
from graphaudit.runtime.sessions import check_threads, configured, create_session

# --opt-level's names (profile.settings, in order) -> ONNX Runtime's levels, in the same order
_LEVELS = ort.GraphOptimizationLevel
OPT_LEVELS = dict(zip(OPT_LEVEL_NAMES, (_LEVELS.ORT_DISABLE_ALL, _LEVELS.ORT_ENABLE_BASIC, _LEVELS.ORT_ENABLE_EXTENDED,
                                         _LEVELS.ORT_ENABLE_LAYOUT, _LEVELS.ORT_ENABLE_ALL), strict=True))
ORT_LEVEL_NAMES = {k: v.name for k, v in OPT_LEVELS.items()}
_PROTOBUF_LIMIT = 2**31 - 1
# Weights past this many bytes reach the profile's sessions as references to their bytes in the
# model's file; smaller ones (a Reshape's shape, which inference reads) stay in the graph. The
# same as the side file's threshold, so no larger weight is written into a saved optimised model
IN_FILE_OVER = 1024


@dataclass(frozen=True)
class RunnableModel:
    """What ORT is given (a file path, or serialised bytes) and the graph whose names it runs."""

    source: str | bytes
    model: onnx.ModelProto
    renamed: int  # nodes given a new name so that events name them uniquely
    weights_folder: Path | None = None  # where external weights left on disk lie
    # the source holds weights past IN_FILE_OVER bytes itself: ORT parses and copies them, and
    # writes them into an optimised model it saves (to a side file: `session_options`)
    holds_weights: bool = False


def reads_its_file(loaded: LoadedModel) -> bool:
    """Whether the profile's sessions of `loaded` read its file: every node name is unique, and
    nothing was inlined or repaired at load (the file is still as written). Then its proto is
    only read, never handed to ORT, and needs no weight (`runtime.handed_weights.without_weights`)."""
    if loaded.path is None or loaded.inlined_calls or loaded.repairs:
        return False
    counts = Counter(n.name for n in all_nodes(loaded.model.graph))
    return all(name and count == 1 for name, count in counts.items())


def held_for_profile(loaded: LoadedModel) -> LoadedModel:
    """`loaded` as a profile holds it: where its sessions read its file (`reads_its_file`), its
    graph alone, the large inline weights left as stubs (`without_weights`), since the proto is
    then only read (held with them, they were 650 MB at Pythia-160M's shape, through the whole
    profile); else `loaded` itself, whose proto the sessions are handed."""
    return replace(loaded, model=without_weights(loaded.model)) if reads_its_file(loaded) else loaded


def runnable_model(loaded: LoadedModel) -> RunnableModel:
    """The model to hand ORT: its file where the sessions can read it (`reads_its_file`), else a
    copy whose nodes are renamed. Where the file holds its weights inline, the sessions get the
    graph alone, each weight referring to its own bytes in the file (`graph_in_file`), which ORT
    maps instead of parsing and copying, and which an optimised model it saves refers to in turn
    instead of holding a copy of: at Pythia-160M's shape the profile's session opened in
    0.32-0.38 s this way, against 1.1-3.6 s from the file, writing 646 MiB beside its optimised
    model (benchmarks/NOTES.md)."""
    own = reads_its_file(loaded)
    path = loaded.path.resolve() if loaded.path is not None else None
    in_file = graph_in_file(loaded.model, path, IN_FILE_OVER) if path is not None else None
    if path is not None and in_file is not None:  # a copy already, without the weights: renamed in place where it must be
        renamed = 0 if own else _name_nodes(in_file)
        return RunnableModel(in_file.SerializeToString(), loaded.model if own else in_file, renamed, path.parent)
    holds = holds_weights(loaded.model, IN_FILE_OVER)
    if own:
        return RunnableModel(str(loaded.path), loaded.model, 0, loaded.weights_folder, holds)
    copy = onnx.ModelProto()
    copy.CopyFrom(loaded.model)
    renamed = _name_nodes(copy)
    if copy.ByteSize() > _PROTOBUF_LIMIT:
        raise GraphAuditError(
            f"expected unique node names in {loaded.name} (the profiler names events after nodes), found "
            f"{renamed} unnamed or repeated ones in a model too large (over 2 GiB) to rename in memory; "
            "give its nodes unique names first"
        )
    return RunnableModel(copy.SerializeToString(), copy, renamed, loaded.weights_folder, holds)


def session_options(
    opt_level: str,
    threads: int | None = None,
    profile_prefix: Path | None = None,
    optimised_path: Path | None = None,
    spinning: bool = True,
    side_file: bool = True,
) -> ort.SessionOptions:
    """SessionOptions at `opt_level`, sequential, profiling into `profile_prefix` when given.

    `spinning` False: the intra-op threads block when a run ends instead of spinning for more
    work, as sessions timed in alternation need: each has its own threads, and one session's
    idle threads spinning took the cores the other's next run needed (on two cores, at the
    70M shape, a run after a switch took 1.5x one after the same session's, and the latency
    ratio's interval came out 7 times as wide).

    `side_file` False: the optimised model saved at `optimised_path` holds its weights as the
    session does: those it maps from a file stay references to it, and nothing is copied. True:
    they go to a side file beside it, the weights the session was handed inline among them (ORT
    copies every weight there, those it maps too)."""
    if opt_level not in OPT_LEVELS:
        raise GraphAuditError(
            f"expected an optimisation level among {', '.join(OPT_LEVELS)}, found {opt_level!r}", exit_code=2
        )
    if threads is not None:
        check_threads(threads)
    so = configured(ort.SessionOptions(), threads, spinning=spinning, profile_prefix=profile_prefix)
    so.graph_optimization_level = OPT_LEVELS[opt_level]
    # Sequential execution: node events do not overlap, so node time adds up to busy time.
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if optimised_path is not None:
        so.optimized_model_filepath = str(optimised_path)
    if optimised_path is not None and side_file:
        # Weights go to a side file, so the saved graph stays small and under protobuf's limit.
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                    optimised_path.name + ".data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    return so


def open_session(model: RunnableModel, providers: list[str], options: ort.SessionOptions) -> ort.InferenceSession:
    """An InferenceSession on `providers`, refusing a silent fall-back from CUDA to CPU."""
    session = create_session(model.source, providers, options, weights_folder=model.weights_folder)
    if providers[0] not in session.get_providers():
        raise GraphAuditError(
            f"expected ONNX Runtime to run the model on {providers[0]}, found it fell back to "
            f"{', '.join(session.get_providers())} (are the CUDA libraries installed?)"
        )
    return session


def load_optimised(path: Path) -> onnx.ModelProto | None:
    """The optimised graph ORT saved at `path` (weights left unread), or None if none was saved."""
    if not path.is_file():
        return None
    return onnx.load(str(path), load_external_data=False)


def _name_nodes(model: onnx.ModelProto) -> int:
    """Give the nodes of `model` (a copy) the ids ModelGraph gives them; return how many changed."""
    nodes = list(all_nodes(model.graph))
    ids = unique_ids((n.name, n.op_type) for n in nodes)
    changed = 0
    for node, node_id in zip(nodes, ids):
        if node.name != node_id:
            node.name = node_id
            changed += 1
    return changed
