"""The folder ONNX Runtime writes a profile's files into: its profiler's JSON and its optimised model.

A fresh folder each time, so that ONNX Runtime, which writes to the names it is given without
asking, never writes over anything: a temporary folder, removed after; or, with
`--keep-profiles DIR`, one inside DIR whose files are moved into DIR when the profile is done,
none onto one of the inputs (the model, its weights, the data, the baseline) or onto anything
but a file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from graphaudit.errors import GraphAuditError
from graphaudit.files import scratch
from graphaudit.files.write import make_folders, refuse_input, settle_folders, shown, target_kind
from graphaudit.load.model import LoadedModel

OPTIMISED = "optimised.onnx"  # ORT's optimised model; its weights go beside it, as OPTIMISED + ".data"
BASELINE_OPTIMISED = "baseline-optimised.onnx"  # the baseline's, alike
_WHAT = "the profiles"


@contextlib.contextmanager
def workdir(keep: str | os.PathLike | None, inputs: Sequence[Path]) -> Iterator[Path]:
    """A fresh folder for ONNX Runtime's files, removed after; with `keep`, inside `keep` (created
    if missing, and removed again if the profile fails), its files moved into `keep` at the end.
    A name ONNX Runtime will write that is one of `inputs` in `keep` is refused before anything
    runs; one it chose (the profiler's, dated) at the end."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="graphaudit-profile-") as folder:
            yield Path(folder)
        return
    keep = Path(keep)
    made: list[Path] = []  # the folders made for `keep`: removed again, while empty, if the profile fails
    failed = True
    try:
        try:
            made = make_folders(keep)
            for name in (OPTIMISED, OPTIMISED + ".data", BASELINE_OPTIMISED, BASELINE_OPTIMISED + ".data"):
                _check(keep / name, inputs)
            stage = tempfile.mkdtemp(prefix=".graphaudit-profile-", dir=keep)
        except OSError as err:
            raise GraphAuditError(f"expected --keep-profiles to name a folder graphaudit can write into, found "
                                  f"{shown(keep)} ({err.strerror})") from None
        with scratch.tracked(stage) as folder:
            yield folder
            written = sorted(folder.iterdir())
            for entry in written:
                _check(keep / entry.name, inputs)
            for entry in written:
                os.replace(entry, keep / entry.name)
        failed = False
    finally:
        settle_folders(made, failed)


def input_files(*models: LoadedModel | None) -> list[Path]:
    """The files `models` were read from: each model and its external weights."""
    return [path for loaded in models if loaded is not None for path in loaded.source_files]


def _check(target: Path, inputs: Sequence[Path]) -> None:
    refuse_input(target, inputs, f"--keep-profiles to name a folder where {target.name} (which ONNX Runtime "
                                 "writes) is not one of the inputs")
    target_kind(target, _WHAT, stream=False)
