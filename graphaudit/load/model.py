"""Load an ONNX model safely, with or without its external weights.

`load_model` gives back a LoadedModel: the ModelProto after the ONNX checker and shape
inference (graphaudit.load.inference; symbolic dimensions kept; free ones written as -1, "?",
"" or no size each given a symbol of its own: graphaudit.load.free_dims), where it came from,
and whether its weights were read. A graph-only load (`weights=False`) never opens an external-data file, so a
multi-GB model can be audited from its graph alone. External-data locations that escape
the model's folder (absolute paths, `..`, links pointing outside) are refused before any
of them is opened.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from graphaudit.errors import GraphAuditError, brief
from graphaudit.limits import MAX_MODEL_BYTES, in_words
from graphaudit.load import external_data, repair
from graphaudit.load.checker import Unsorted, check_model, handed, in_order, order_problem, sort_nodes
from graphaudit.load.free_dims import name_free_dims
from graphaudit.load.inference import INFER_WEIGHTS_OVER, typed_outputs, with_inferred_shapes
from graphaudit.load.inline import inline_functions
from graphaudit.load.protos import Walked, node_lists, walk_graphs


@dataclass(frozen=True)
class LoadedModel:
    """A checked ONNX model and the facts about how it was loaded."""

    model: onnx.ModelProto = field(repr=False)
    path: Path | None
    weights_loaded: bool
    external_files: tuple[str, ...]
    shape_inference_ok: bool
    shape_inference_error: str | None = None
    weights_checked: bool = False  # external weights found whole on disk (sizes only, bytes not read)
    inlined_calls: int = 0  # calls of local functions replaced by their bodies (graphaudit.load.inline)
    inlined_functions: tuple[str, ...] = ()  # the functions they called, as `domain.name`
    repairs: tuple[str, ...] = ()  # what was repaired in memory for the ONNX checker (graphaudit.load.repair), in words

    @property
    def repair_note(self) -> str | None:
        """The one note saying what was repaired at load; None when nothing was."""
        return repair.repair_note(self.repairs)

    @property
    def name(self) -> str:
        return self.path.name if self.path is not None else (self.model.graph.name or "<model>")

    @property
    def weights(self) -> str:
        """What became of the weights: inline, read (from their files), checked (found whole, unread) or unread."""
        if not self.external_files:
            return "inline"
        if self.weights_loaded:
            return "read"
        return "checked" if self.weights_checked else "unread"

    @property
    def weights_folder(self) -> Path | None:
        """The folder ONNX Runtime reads the external weights from, when they were left on disk."""
        if self.weights_loaded or self.path is None:
            return None
        return self.path.resolve().parent

    @property
    def source_files(self) -> list[Path]:
        """The files this model is read from: the model and its external weights left on disk (what
        graphaudit's outputs must never land on)."""
        files = [self.path] if self.path is not None else []
        if self.weights_folder is not None:
            files += [self.weights_folder / location for location in self.external_files]
        return files


def load_model(
    source: str | os.PathLike | onnx.ModelProto,
    *,
    weights: bool = True,
    check: bool = True,
    infer_shapes: bool = True,
    inline: bool = True,
) -> LoadedModel:
    """Return the model at `source`, checked and shape-inferred, as a LoadedModel.

    `weights=False` leaves external initializers as references and never opens their
    files. `inline` replaces each call of a local function by its body (graphaudit.load.inline);
    without it, the analyses read through the calls, but a coefficient inside a body can be
    neither exposed nor fed. The argument (a path or a ModelProto) is never modified.
    """
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
        path = None
        base = None
        data = None
    else:
        path = Path(source)
        model, data = _parse_file(path)
        base = path.resolve().parent
    _require_graph(model, path)
    _check_versions(model, path)
    # The graph and its bodies, listed once for the passes below that read each (one walk of
    # every node: ten of them were a sixth of a static audit at 18,000 nodes), and listed again
    # wherever nodes are moved, added or copied.
    walked = walk_graphs(model.graph)
    every = walked.graphs
    _check_text(model, path, walked)
    imports = repair.add_runtime_imports(model, every, walked.domains())
    dropped = repair.drop_untyped_value_info(model, every)
    moved = 0
    typed: tuple[str, ...] = ()
    if repair.untyped_outputs(model.graph):  # ONNX Runtime types them by inference: so does this, in order
        if not in_order(model.graph) and not order_problem(model):
            moved = sort_nodes(model.graph)
        model, typed = typed_outputs(model)
        walked = walk_graphs(model.graph)
        every = walked.graphs
    if imports or dropped or moved or typed:
        data = None  # the file's bytes are no longer the model's encoding
    tensors, nested = external_data.scan(model, data)
    external = external_data.locations(tensors, path)
    if external and base is not None:
        for location in external:
            external_data.check_location(location, base, path)
    if weights and external:
        external_data.require_files(external, base, path)
    # The checker and shape inference see the graph with its external weights still on disk:
    # they need only the weights' types and shapes, and the proto stays far below protobuf's
    # 2 GiB limit however large the weights are.
    # What the checker was handed and its encoding, kept for shape inference while the model
    # stays as it was checked: the graph is not encoded again, and inference runs a fifth faster
    # with the external weights typed inputs (load 1.73 -> 1.54 s at 100,000 nodes).
    checked: tuple[onnx.ModelProto, bytes] | None = None
    if check:
        try:
            checked = _checked(model, data, path, external if nested else ())
        except Unsorted:  # a DAG written out of order (as some converters do): put in order, here only
            moved = sort_nodes(model.graph)
            walked = walk_graphs(model.graph)
            every = walked.graphs
            checked = _checked(model, None, path, external if nested else ())
    del data  # what follows works on the parsed model
    if name_free_dims(model, every):  # -1, "?", "" or no size: each free on its own, as ONNX Runtime runs them
        checked = None
    inlined_calls = 0
    inlined_functions: tuple[str, ...] = ()
    if inline and model.functions:  # before inference, which then types the inlined bodies' values too
        checked = None  # what it holds (the file's bytes, maybe) goes before an inlined copy is made
        found = inline_functions(model)
        if found is not None:
            inlined_functions = tuple(f"{f.domain}.{f.name}" if f.domain else f.name for f in model.functions)
            model, inlined_calls = found
            walked = walk_graphs(model.graph)
            every = walked.graphs
    inferred_ok, inferred_error = True, None
    if infer_shapes:
        model, inferred_ok, inferred_error = with_inferred_shapes(model, every, checked, fields=walked.fields[0])
    if weights and external:
        assert base is not None  # require_files above refused external weights without a folder
        _load_external(model, base, path)
    return LoadedModel(
        model=model,
        path=path,
        weights_loaded=weights or not external,
        external_files=tuple(external),
        shape_inference_ok=inferred_ok,
        shape_inference_error=inferred_error,
        inlined_calls=inlined_calls,
        inlined_functions=inlined_functions,
        repairs=tuple(repair.describe(imports, moved, dropped, typed)),
    )


def load_for_runtime(source: str | os.PathLike | onnx.ModelProto | LoadedModel) -> LoadedModel:
    """The model as ONNX Runtime sessions take it: external weights left on disk for ORT to map.

    Their files must exist, but are never read into the proto, so a model whose weights pass
    protobuf's 2 GiB limit still runs (`LoadedModel.weights_folder` tells ORT where they are).
    """
    return check_external_weights(source if isinstance(source, LoadedModel) else load_model(source, weights=False))


def load_for_audit(source: str | os.PathLike, *, graph_only: bool = False) -> LoadedModel:
    """The model as the commands that read only its graph take it (`static`, `inspect`): weights
    never read; their files checked on disk (`check_external_weights`) unless `graph_only`."""
    loaded = load_model(source, weights=False)
    return loaded if graph_only else check_external_weights(loaded)


def check_external_weights(loaded: LoadedModel) -> LoadedModel:
    """`loaded`, once each external tensor's bytes are found in its file; no byte is read.

    A graph-only load says nothing of the weight files. This checks, from the files' sizes
    alone, that every external tensor lies inside its file and that a declared length is what
    its type and shape take, so a missing or truncated weight file is reported before anything
    runs, at the cost of one `stat` per file, however large the weights are.
    """
    if loaded.weights_loaded or loaded.weights_checked:
        return loaded
    folder = loaded.weights_folder
    external_data.require_files(list(loaded.external_files), folder, loaded.path)
    assert folder is not None  # require_files refused a model without one
    external_data.check_extents(external_data.external_tensors(loaded.model), folder, loaded.path)
    return replace(loaded, weights_checked=True)


def _checked(model: onnx.ModelProto, data: bytes | None, path: Path | None,
             nested: Sequence[str]) -> tuple[onnx.ModelProto, bytes] | None:
    """What the ONNX checker was handed of `model` (`checker.handed`; `data`: the file's bytes
    where they are still its encoding) and its encoding, once the checker has passed it; None
    where no encoding was made (past protobuf's limit). `nested`: the files of external tensors
    outside the main graph's initializers."""
    checkable, payload = handed(model, data, INFER_WEIGHTS_OVER)
    check_model(checkable, path, nested, payload=payload)
    return (checkable, payload) if payload is not None else None


def _parse_file(path: Path) -> tuple[onnx.ModelProto, bytes]:
    """The model in the file at `path`, and the file's bytes."""
    if not path.exists():
        raise GraphAuditError(f"expected an ONNX model file, found no file at {path}")
    if path.is_dir():
        raise GraphAuditError(f"expected an ONNX model file, found a directory at {path}")
    try:
        found = path.stat()
        if not stat.S_ISREG(found.st_mode):
            # Reading a device or a pipe may never end (/dev/zero) or never start (a FIFO).
            raise GraphAuditError(f"expected an ONNX model file, found {_file_kind(found.st_mode)} at {path}")
        if found.st_size > MAX_MODEL_BYTES:  # refused before a byte is read: it could never parse
            raise GraphAuditError(
                f"expected an ONNX model file of at most 2 GiB (protobuf's limit; a larger model keeps its weights "
                f"in external-data files beside it), found {in_words(found.st_size)} at {path}")
        data = path.read_bytes()
    except OSError as err:
        raise GraphAuditError(f"expected a readable ONNX model file at {path}, found {brief(err)}") from None
    if not data:
        raise GraphAuditError(f"expected an ONNX model in {path}, found an empty file")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise GraphAuditError(
            f"expected an ONNX model (protobuf ModelProto) in {path}, found {len(data)} bytes "
            f"that do not parse ({brief(err)}); the file may be truncated or not ONNX"
        ) from None
    return model, data


def _file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "something that is not a regular file")


def _require_graph(model: onnx.ModelProto, path: Path | None) -> None:
    where = f" in {path}" if path else ""
    if not model.HasField("graph") or (
        not model.graph.node and not model.graph.output and not model.graph.input
    ):
        raise GraphAuditError(
            f"expected an ONNX model with a graph{where}, found a protobuf message with no "
            "graph (ir_version {}, {} opset imports); it may be another kind of file".format(
                model.ir_version, len(model.opset_import)
            )
        )
    if model.ir_version <= 0:
        raise GraphAuditError(
            f"expected an ONNX model with an IR version{where}, found ir_version "
            f"{model.ir_version}; the file is not a valid ONNX model"
        )


def _check_text(model: onnx.ModelProto, path: Path | None, walked: Walked) -> None:
    """Refuse names and metadata that are not UTF-8: protobuf hands them back as bytes, not text
    (`walked`: the model's graphs and their nodes' fields, as `walk_graphs` reads them)."""
    where = f" in {path}" if path else ""
    try:
        # str.join raises TypeError on bytes: the graphs' nodes as read once, then the functions'.
        for fields in walked.fields:
            "".join(chain.from_iterable(fields))
        for nodes in node_lists(model, []):
            "".join([n.name + n.op_type + n.domain for n in nodes])
        for graph in walked.graphs:
            "".join([v.name for field in (graph.input, graph.output, graph.initializer, graph.value_info)
                     for v in field])
        "".join([p.key for p in model.metadata_props] + [o.domain for o in model.opset_import])
    except TypeError:
        raise GraphAuditError(
            f"expected node and value names that are UTF-8 text{where}, found names that are not "
            "(the file is damaged or not ONNX)"
        ) from None
    try:  # the nodes' metadata is checked where the graph model reads it (graph.build._metadata)
        "".join([p.value for p in model.metadata_props])
    except TypeError:
        raise GraphAuditError(
            f"expected model metadata that is UTF-8 text{where}, found values that are not "
            "(the file is damaged or not ONNX)"
        ) from None


def _check_versions(model: onnx.ModelProto, path: Path | None) -> None:
    """Refuse IR versions and default-domain opsets newer than the installed onnx knows."""
    where = f" in {path}" if path else ""
    if model.ir_version > onnx.IR_VERSION:
        raise GraphAuditError(
            f"expected an ONNX IR version up to {onnx.IR_VERSION} (onnx {onnx.__version__}){where}, "
            f"found {model.ir_version}; upgrade onnx to read this model"
        )
    newest = onnx.defs.onnx_opset_version()
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > newest:
            raise GraphAuditError(
                f"expected an ai.onnx opset up to {newest} (onnx {onnx.__version__}){where}, "
                f"found opset {opset.version}; upgrade onnx or re-export at an older opset"
            )


def _load_external(model: onnx.ModelProto, base: Path, path: Path | None) -> None:
    try:
        external_data_helper.load_external_data_for_model(model, str(base))
    except (OSError, ValueError, onnx.checker.ValidationError) as err:
        raise GraphAuditError(
            f"expected readable external data for {path}, found an error: {brief(err)}"
        ) from None
