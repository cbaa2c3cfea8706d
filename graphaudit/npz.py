"""Reading .npz archives that no one vouches for: headers alone, or arrays, never pickles.

`read_npz` gives back every array of an archive; `npz_headers` the dtype and shape each
member declares, without reading values. A damaged archive, a member that is no .npy array, a
header past numpy's size limit or declaring more than fits in memory, and pickled objects each
raise a GraphAuditError that names what was expected and what was found.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from graphaudit.errors import GraphAuditError
from graphaudit.path_kinds import path_kind


def npz_headers(path: Path) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The dtype and shape of each array in the .npz at `path`, from the headers alone."""
    require_zip(path)
    headers: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if member.endswith(".npy"):
                    headers[member[:-4]] = _header(archive, member)
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as err:
        raise GraphAuditError(f"expected a readable .npz archive at {path}, found a damaged one "
                              f"({_reason(err, path)})") from None
    return headers


def _header(archive: zipfile.ZipFile, member: str) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape an .npy member of `archive` declares, read from its header alone."""
    with archive.open(member) as f:
        version = np.lib.format.read_magic(f)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(f)
    return np.dtype(dtype), tuple(shape)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of the .npz at `path`, by key (pickles refused)."""
    require_zip(path)
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(path, allow_pickle=False) as archive:
            for key in archive.files:
                try:
                    arrays[key] = archive[key]
                    if isinstance(arrays[key], bytes):  # numpy hands back a member that is not .npy as its bytes
                        raise GraphAuditError(
                            f"expected every member of {path} to be a NumPy .npy array, found {key!r} holding "
                            f"{len(arrays[key])} bytes without the .npy header"
                        )
                except MemoryError:  # a header may declare any shape: numpy allocates it before reading
                    raise GraphAuditError(
                        f"expected arrays that fit in memory in {path}, found {_declared(archive.zip, key)} "
                        f"for key {key!r}"
                    ) from None
        return arrays
    except ValueError as err:
        if "max_header_size" in str(err):  # numpy's guard against headers built to exhaust memory
            raise GraphAuditError(
                f"expected .npy headers of at most 10 kB in {path} (numpy's limit for files it does not trust), "
                "found a larger one"
            ) from None
        if "allow_pickle" in str(err) or "Object arrays" in str(err):
            raise GraphAuditError(
                f"expected numeric arrays in {path}, found pickled Python objects; graphaudit never "
                "loads pickles (they can run code)"
            ) from None
        raise GraphAuditError(f"expected readable .npy arrays in {path}, found: {_reason(err, path)}") from None
    except (OSError, zipfile.BadZipFile, EOFError, KeyError) as err:
        raise GraphAuditError(f"expected a readable .npz archive at {path}, found a damaged one ({err})") from None


def _declared(archive: zipfile.ZipFile, key: str) -> str:
    """What the header of `key` in `archive` declares, in words: its shape, dtype and bytes."""
    try:
        dtype, shape = _header(archive, key + ".npy" if key + ".npy" in archive.namelist() else key)
    except (OSError, zipfile.BadZipFile, EOFError, KeyError, ValueError):
        return "an array too large to allocate"
    size = int(np.prod(shape, dtype=object)) * dtype.itemsize
    return f"a declared shape {shape} of {dtype} ({size} bytes)"


def require_zip(path: Path) -> None:
    """Refuse a `path` that is no file or no zip archive."""
    if not path.is_file():
        raise GraphAuditError(f"expected a data file (.npz) at {path}, found {path_kind(path)}")  # never opened
    if not zipfile.is_zipfile(path):
        raise GraphAuditError(
            f"expected a NumPy .npz archive (a zip of .npy arrays) at {path}, found a file that is not a zip archive"
        )


def _reason(err: Exception, path: Path) -> str:
    """numpy's complaint about `path` in one line; where it is about a header that is no plain
    literal, that header quoted as written, since numpy names only its syntax node
    (`malformed node or string on line 1: <ast.Call object at 0x7f...>`)."""
    text = " ".join(str(err).split())
    if "<ast." not in text:
        return text
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                try:
                    _header(archive, member)
                except ValueError as bad:
                    if "<ast." in str(bad):
                        header = _quoted(_raw_header(archive, member))
                        return (f"{member.removesuffix('.npy')!r} with the header {header}, which is not a plain "
                                "literal (numpy reads a .npy header as a dict of literals only)")
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, RuntimeError, NotImplementedError):
        pass  # an archive numpy could open but zipfile cannot: numpy's words, without the node
    return text.split(": <ast.")[0] + ": a header that is not a plain literal"


def _raw_header(archive: zipfile.ZipFile, member: str) -> str:
    """The header text of an .npy member as written, unparsed (empty for one without the magic)."""
    with archive.open(member) as f:
        start = f.read(8)
        if not start.startswith(b"\x93NUMPY"):
            return ""
        size = int.from_bytes(f.read(2 if start[6] == 1 else 4), "little")
        return f.read(min(size, 10_000)).decode("latin1", "replace").strip()


def _quoted(text: str, most: int = 160) -> str:
    return repr(text if len(text) <= most else text[:most] + "…")
