"""Capture: run the trace graph over a data set and cache the complete coefficient tensors.

`capture` gives back a CoefficientCache: every coefficient tensor of every input along the
unperturbed trajectory, stored with the batch axis first (`(inputs, ...)`) so that the
rows of any inputs can be read in one slice. A cache that fits under `memory_limit` bytes
(DEFAULT_MEMORY_LIMIT, 16 MiB) stays in memory; a larger one is written to `.npy` files and
memory-mapped, in a temporary folder that goes away on `close()` (each file removed from it
once mapped, so that not even a SIGKILL leaves its blocks on disk), or under `cache_dir`, where
it stays and is reused by a later capture of the same trace graph, data and batch size once
its files are checked (graphaudit.replay.cache_files: a damaged cache is captured again, and
`rebuilt` says why); until it is sealed, its files and the folders made for it are tracked
(graphaudit.files.scratch), so that a command killed outright leaves none of them. The pages
of a mapped cache are released after every batch written and every rows read, so the
process's resident memory does not grow with the number of inputs
(the data stays in the OS page cache and on disk). The live outputs of the first batch are
kept beside the coefficients for the parity check, and so, given a LiveCheck, is a small
per-input summary of every input's live outputs (the replay keeps each target's
log-probability), stored and mapped like the coefficients.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.errors import GraphAuditError
from graphaudit.files.write import MadeFiles, settle_folders
from graphaudit.load.data import InputData
from graphaudit.load.external_data import external_tensors, locations
from graphaudit.replay.cache_files import (
    FORMAT,
    CacheDamage,
    cache_folder,
    clear,
    kept_cache,
    new_npy,
    partial_name,
    release,
    seal,
)
from graphaudit.runtime.handed_weights import STUB_LOCATION
from graphaudit.runtime.sessions import create_session, detached, running, slow_fusions
from graphaudit.vocabulary import BATCH, MERGED

# A data set's cache past this many bytes is written to files and mapped, its pages let go after
# every batch: held in memory, the cache made the audit's peak grow with the inputs (a 70M-parameter
# FeatureGate's coefficients are 1.5 MB an input: 368 MiB more at 128 + 128 inputs than mapped;
# mapped took within 1% of the time, benchmarks/NOTES.md). Below it, a file would save little and
# cost a few system calls.
DEFAULT_MEMORY_LIMIT = 16 * 2**20
_CHECK = "graphaudit.live_check"  # key of the LiveCheck summary among the cache's arrays
_CHECK_FILE = "live_check.npy"
_NUMERIC = "biufc"  # numpy's kinds of the live outputs kept: booleans, integers, floats, complex numbers


@dataclass(frozen=True)
class LiveCheck:
    """A per-input summary of the live outputs, kept for every input beside the coefficients.

    `summarise(outputs, feeds, rows)` gives one batch's summary, inputs first (float32), or
    None when there is nothing to keep; `name` says what it is (part of the cache key).
    """

    name: str
    summarise: Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray], slice], np.ndarray | None]


@dataclass
class CoefficientCache:
    """The coefficient tensors of one data set, batch axis first, in memory or memory-mapped."""

    coefficients: tuple[Coefficient, ...]
    arrays: Mapping[str, np.ndarray] = field(repr=False)
    count: int
    live: Mapping[str, np.ndarray] = field(repr=False)  # live outputs of the first batch
    location: Path | None = None  # folder of the .npy files; None in memory
    reused: bool = False
    rebuilt: str | None = None  # why the cache kept in `location` was damaged and captured again
    _owned: Path | None = field(default=None, repr=False)  # temporary folder removed on close
    _maps: dict[str, mmap.mmap] = field(default_factory=dict, repr=False)

    def rows(self, c: Coefficient, rows: np.ndarray | slice) -> np.ndarray:
        """The cached values of `c` for the inputs at `rows`, batch axis first."""
        if isinstance(rows, np.ndarray) and len(rows) > 0 and np.all(np.diff(rows) == 1):
            rows = slice(int(rows[0]), int(rows[-1]) + 1)  # consecutive inputs: a view, not a copy
        if c.tensor not in self._maps:
            return np.asarray(self.arrays[c.tensor][rows])
        values = np.array(self.arrays[c.tensor][rows])
        release(self._maps[c.tensor])
        return values

    def shape(self, c: Coefficient) -> tuple[int, ...]:
        return tuple(self.arrays[c.tensor].shape)

    @property
    def checked(self) -> bool:
        """True when the LiveCheck summary of every input was kept."""
        return _CHECK in self.arrays

    def check_rows(self, rows: slice) -> np.ndarray:
        """The LiveCheck summary of the inputs at `rows`."""
        values = np.array(self.arrays[_CHECK][rows])
        if _CHECK in self._maps:
            release(self._maps[_CHECK])
        return values

    def chunks(self, size: int) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Yield (row indices, {tensor: values}) over the whole cache, `size` inputs at a time."""
        for start in range(0, self.count, size):
            rows = np.arange(start, min(start + size, self.count))
            yield rows, {c.tensor: self.rows(c, slice(rows[0], rows[-1] + 1)) for c in self.coefficients}

    def parity_checked(self) -> None:
        """Let go of the first batch's live outputs once the parity check has read them: nothing
        after it does, and at a 50k vocabulary they are a batch of logits (257 MB at 10 x 128
        tokens) held through the whole replay loop. The kept cache's copy on disk stays."""
        self.live = {}

    @property
    def temporary(self) -> bool:
        """True when the arrays live in a temporary folder that `close()` removes."""
        return self._owned is not None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def close(self) -> None:
        """Drop the arrays and remove a temporary folder (a `cache_dir` folder stays)."""
        self.arrays = {}
        for mapping in self._maps.values():
            with contextlib.suppress(BufferError):  # a caller still holds a view; the mapping goes with it
                mapping.close()
        self._maps = {}
        if self._owned is not None:
            shutil.rmtree(self._owned, ignore_errors=True)
            self._owned = None

    def __enter__(self) -> CoefficientCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def batch_first(c: Coefficient, values: np.ndarray, count: int) -> np.ndarray:
    """`values` of `count` inputs in `c`'s own layout, with its batch axis moved to the front
    (a `batch*token` axis split into batch, token)."""
    first = np.moveaxis(values, batch_axis(c), 0)
    if MERGED not in c.axes:
        return first
    if count <= 0 or first.shape[0] % count:
        raise GraphAuditError(
            f"expected coefficient {c.tensor!r} to hold {count} inputs' tokens on its {MERGED!r} axis "
            f"{batch_axis(c)}, found shape {values.shape}"
        )
    return first.reshape(count, first.shape[0] // count, *first.shape[1:])


def native(c: Coefficient, values: np.ndarray) -> np.ndarray:
    """Batch-first `values` back in `c`'s own layout, contiguous, ready to feed."""
    axis = batch_axis(c)
    if MERGED in c.axes:
        values = values.reshape(values.shape[0] * values.shape[1], *values.shape[2:])
    return np.ascontiguousarray(values if axis == 0 else np.moveaxis(values, 0, axis))


def capture(
    trace: onnx.ModelProto,
    coefficients: Sequence[Coefficient],
    data: InputData,
    *,
    batch_size: int,
    cache_dir: str | os.PathLike[str] | None = None,
    memory_limit: int = DEFAULT_MEMORY_LIMIT,
    label: str = "data",
    providers: list[str] | None = None,
    weights_folder: Path | None = None,
    check: LiveCheck | None = None,
    validate: Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], object] | None = None,
    threads: int | None = None,
    open_session: Callable[[], ort.InferenceSession] | None = None,
    keep_live: bool = True,
    span: slice | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
) -> CoefficientCache:
    """Run `trace` over `data` in batches and return the cache of its coefficient tensors.

    `weights_folder`: where the external weights `trace` refers to lie (see `create_session`).
    `check`: a summary of the live outputs to keep for every input (see LiveCheck).
    `validate(outputs, feeds)`: called on the first batch's live outputs (coefficients left out),
    before anything is kept, to refuse outputs the caller cannot use (GraphAuditError).
    `threads`: ONNX Runtime's intra-op threads (None: its choice).
    `open_session()`: the session of `trace` to run, where the caller shares one between captures
    (called only when the cache is not reused); by default one made here from the arguments above.
    `keep_live` False: the first batch's live outputs are not kept (`live` is empty), where
    nothing compares with them (the calibration inputs: a batch of logits at a 50k vocabulary
    is 412 MB at 16 x 128 tokens).
    `span`: capture the inputs there only (a shard's, graphaudit.replay.shards), numbered in the
    whole data in every message; the cache holds them from row 0. No `cache_dir` with it.
    `weights`: the arrays of the weights `trace` holds as stubs (`runtime.handed_weights.weights_apart`),
    handed to its session and digested into a kept cache's key.
    """
    coefficients = tuple(coefficients)
    if span is not None and cache_dir is not None:
        raise ValueError("a capture of a span of the inputs keeps no cache")
    inputs = range(data.count)[span] if span is not None else range(data.count)
    count, offset = len(inputs), inputs.start
    for c in coefficients:
        batch_axis(c)
    key: str | None = None
    folder: Path | None = None
    made = _Made()  # what this call writes, removed again if it fails
    rebuilt = None
    if cache_dir is not None:
        # The key digests the whole trace graph, weights included: made only for a cache kept for reuse.
        key = _key(trace, coefficients, data, batch_size, weights_folder, check.name if check else None, weights)
        folder = Path(cache_dir) / f"{label}-{key[:16]}"
        files = {c.tensor: _file(c) for c in coefficients}
        try:
            found = kept_cache(folder, key, {**files, _CHECK: _CHECK_FILE}, count, set(files))
        except CacheDamage as damage:
            found, rebuilt = None, str(damage)
        if found is not None:
            arrays, maps, live = found
            return CoefficientCache(coefficients, arrays, count, live, folder, True, _maps=maps)
        created = cache_folder(folder, cache_dir)
        made.folders = [p for p in created if p == folder]
        made.parents = [p for p in created if p != folder]
        clear(folder)  # a cache being rewritten is no cache until sealed again
    arrays, maps, written = made.arrays, made.maps, {}
    with made:
        session = open_session() if open_session is not None else create_session(
            trace, providers, disabled_optimizers=slow_fusions(providers), weights_folder=weights_folder,
            threads=threads, weights=weights)
        names = [o.name for o in session.get_outputs()]
        wanted = {c.tensor for c in coefficients}
        missing = wanted - set(names)
        if missing:
            raise GraphAuditError(
                f"expected the trace graph to output every coefficient, found {sorted(missing)} missing"
            )
        live = {}
        owned = None
        for rows, feeds in data.batches(batch_size, span):
            with running(f"the model ({label} inputs {rows.start}..{rows.stop - 1})"):
                outputs = dict(zip(names, session.run(names, feeds)))
            live_outputs = {n: v for n, v in outputs.items() if n not in wanted}
            if not arrays and validate is not None:
                validate(live_outputs, feeds)
            _check_finite(coefficients, outputs, rows, label)
            summary = check.summarise(live_outputs, feeds, rows) if check is not None else None
            if not arrays:
                # numeric tensors (the parity check compares numbers; strings would be pickled in a kept
                # cache, which is never read back), not sequences; copied, as a view of the run's outputs
                # would hold the session's memory
                live = {n: detached(v) for n, v in live_outputs.items()
                        if isinstance(v, np.ndarray) and v.dtype.kind in _NUMERIC} if keep_live else {}
                # batch-first rows of every array kept, by its key and file name
                kept = {c.tensor: (_file(c), batch_first(c, outputs[c.tensor], rows.stop - rows.start))
                        for c in coefficients}
                if summary is not None:
                    kept[_CHECK] = (_CHECK_FILE, summary)
                else:
                    check = None  # nothing to keep for these outputs: not asked again
                per_input = sum(v.nbytes for _, v in kept.values()) / (rows.stop - rows.start)
                if folder is None and per_input * count > memory_limit:
                    owned = folder = Path(tempfile.mkdtemp(prefix="graphaudit-cache-"))
                    made.folders.append(owned)
                for name, (file, first) in kept.items():
                    shape = (count, *first.shape[1:])
                    if folder is None:
                        arrays[name] = np.empty(shape, dtype=first.dtype)
                        continue
                    # a kept cache's files are written under fresh names, renamed onto theirs when sealed
                    path = made.partials.add(partial_name(folder, file) if key is not None else folder / file)
                    arrays[name], maps[name] = new_npy(path, shape, first.dtype)
                    if key is None:
                        # A temporary cache is read through its mappings alone: its files go now,
                        # their blocks freed when the process ends, however it ends (an
                        # out-of-memory kill included, which no cleanup code outlives).
                        path.unlink()
                        made.partials.done(path)
                        continue
                    written[name] = (file, path, arrays[name], maps[name])
            kept_rows = slice(rows.start - offset, rows.stop - offset)
            for c in coefficients:
                arrays[c.tensor][kept_rows] = _rows_of(c, outputs[c.tensor], rows)
            if summary is not None:
                arrays[_CHECK][kept_rows] = summary
            for mapping in maps.values():
                release(mapping)
        if folder is not None and key is not None:  # kept for reuse (a temporary folder is not)
            seal(folder, key, count, written, live, made.partials)
        made.settled()
        return CoefficientCache(coefficients, arrays, count, live, folder, False, rebuilt, owned, maps)


@dataclass
class _Made:
    """What a capture has made so far: its arrays and their mappings, the files it is writing,
    the folders it created whole (the cache's folder, a temporary one) and the parent folders it
    created for them. As a context manager, it discards them all when the block fails."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    maps: dict[str, mmap.mmap] = field(default_factory=dict)
    partials: MadeFiles = field(default_factory=MadeFiles)
    folders: list[Path] = field(default_factory=list)
    parents: list[Path] = field(default_factory=list)  # outermost first

    def __enter__(self) -> _Made:
        return self

    def __exit__(self, failed, *exc) -> None:
        if failed is not None:
            self.discard()

    def discard(self) -> None:
        """Drop the arrays and mappings and remove the files and folders (a parent only while empty)."""
        self.arrays.clear()
        for mapping in self.maps.values():
            with contextlib.suppress(BufferError):  # a view still held elsewhere: it goes with that view
                mapping.close()
        self.partials.discard()
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)
        settle_folders(self.parents + self.folders, failed=True)

    def settled(self) -> None:
        """The folders are kept (the cache sealed) or removed: no longer for the reaper to remove."""
        settle_folders(self.parents + self.folders, failed=False)


def _check_finite(coefficients: Sequence[Coefficient], outputs: Mapping[str, np.ndarray], rows: slice,
                  label: str) -> None:
    """Refuse NaN/Inf coefficients and NaN outputs: no figure computed from them would mean anything."""
    wanted = {c.tensor: c for c in coefficients}
    for name, values in sorted(outputs.items(), key=lambda item: item[0] not in wanted):  # coefficients first
        if not isinstance(values, np.ndarray) or not np.issubdtype(values.dtype, np.floating):  # a sequence, ints
            continue
        c = wanted.get(name)
        if c is None and (values.size == 0 or not np.isnan(values.min())):
            # an output holds a NaN only where its minimum is one: one pass over a batch of 50k-class
            # logits, with no mask of its size (a third of the time)
            continue
        values = batch_first(c, values, rows.stop - rows.start) if c is not None else values
        bad = ~np.isfinite(values) if c is not None else np.isnan(values)
        if not bad.any():
            continue
        where = np.argwhere(bad)
        if c is None:  # an output's axes are not declared: name the batch
            raise GraphAuditError(
                f"expected no NaN in the output {name!r}, found {len(where)} NaN values for {label} inputs "
                f"{rows.start}..{rows.stop - 1}; the model produces them from these inputs, so no replay "
                "figure would mean anything"
            )
        inputs = sorted({rows.start + int(i) for i in where[:, 0]})
        shown = ", ".join(map(str, inputs[:5])) + (" ..." if len(inputs) > 5 else "")
        raise GraphAuditError(
            f"expected finite values in the coefficient {name!r}, found {len(where)} NaN/Inf values for {label} "
            f"input{'s' if len(inputs) > 1 else ''} {shown} (first at index {tuple(int(i) for i in where[0][1:])}); "
            "the controller produces them from these inputs, so no replay figure would mean anything"
        )



def _rows_of(c: Coefficient, values: np.ndarray, rows: slice) -> np.ndarray:
    first = batch_first(c, values, rows.stop - rows.start)
    if first.shape[0] != rows.stop - rows.start:
        raise GraphAuditError(
            f"expected coefficient {c.tensor!r} to have the batch ({rows.stop - rows.start} inputs) on its "
            f"{BATCH!r} axis {batch_axis(c)}, found shape {values.shape}"
        )
    return first





def batch_axis(c: Coefficient) -> int:
    """Position of `c`'s batch axis (else its batch*token one); GraphAuditError when it has neither."""
    axis = c.axis(BATCH) if BATCH in c.axes else c.axis(MERGED)
    if axis is None:
        raise GraphAuditError(
            f"expected coefficient {c.tensor!r} to name a {BATCH!r} axis (or a {MERGED!r} one), found axes "
            f"{list(c.axes)}"
        )
    return axis


def _file(c: Coefficient) -> str:
    return hashlib.sha1(c.tensor.encode()).hexdigest()[:12] + ".npy"


def _key(trace: onnx.ModelProto, coefficients, data: InputData, batch_size: int,
         weights_folder: Path | None = None, check: str | None = None,
         weights: Mapping[str, np.ndarray] | None = None) -> str:
    """A digest of everything the cached values depend on (`weights`: those `trace` holds as stubs)."""
    digest = hashlib.sha256()
    digest.update(trace.SerializeToString(deterministic=True))
    for name, values in sorted((weights or {}).items()):  # a stub says where a weight went, not what it holds
        array = np.ascontiguousarray(values)
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.reshape(-1).view(np.uint8).data)  # the bytes as they are, not copied
    if weights_folder is not None:
        # The proto holds only where external weights lie; a rewritten file must not reuse a cache.
        # Those whose bytes are digested above (`weights`) are not: re-saving the same model would be.
        read = [t for t in external_tensors(trace) if t.name not in (weights or {})]
        for location in (x for x in locations(read, None) if x != STUB_LOCATION):
            stat = (weights_folder / location).stat()
            digest.update(f"{location}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    digest.update(json.dumps([c.to_json() for c in coefficients], sort_keys=True).encode())
    digest.update(f"batch={batch_size};format={FORMAT};check={check}".encode())
    for name, array in sorted({**data.arrays, **data.fixed}.items()):
        array = np.ascontiguousarray(array)
        # how it was fed, where it is not rows on axis 0
        fed = ":whole" if name in data.fixed else f":axis {data.axes[name]}" if data.axes.get(name) else ""
        digest.update(f"{name}:{array.dtype}:{array.shape}{fed}".encode())
        digest.update(array.data)
    return digest.hexdigest()
