"""Reading .npz archives that no one vouches for: headers first, then arrays, never pickles.

`npz_headers` gives back the dtype and shape each member declares, from the zip's directory
and the .npy headers alone; `read_npz` every array, once every header has passed. Nothing is
decompressed past a header until each member is found readable and bounded: not encrypted,
compressed with a method Python's zipfile reads, expanding no more than its method can (a
Deflate stream at most 1032-fold), with a header whose shape is no negative or oversized one
(graphaudit.limits), whose array fits in memory, and whose bytes the member holds. A damaged
archive, a member that is no .npy array and pickled objects are refused too; each as a
GraphAuditError that names what was expected and what was found.
"""

from __future__ import annotations

import importlib.util
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from graphaudit.errors import GraphAuditError, brief
from graphaudit.files.path_kinds import path_kind
from graphaudit.limits import check_shape, in_words, memory_bytes

_MAGIC = b"\x93NUMPY"
# What reading a damaged archive or member raises, from zipfile, zlib and numpy's header parser
_DAMAGED = (OSError, zipfile.BadZipFile, EOFError, ValueError, KeyError, zlib.error)
# The compression methods zipfile reads, and how many times its input one can expand to at most:
# Deflate codes a 258-byte match in 2 bits at best (1032-fold); bzip2 and LZMA (read where
# Python has their modules) have no small bound, and numpy never writes them (a member's
# header is still held to what the member holds)
# zipfile's own names of the compression methods (not in typeshed's zipfile).
_COMPRESSOR_NAMES: dict[int, str] = zipfile.compressor_names  # type: ignore[attr-defined]
_METHODS = {zipfile.ZIP_STORED: 1, zipfile.ZIP_DEFLATED: 1032,
            **{method: None for method, module in ((zipfile.ZIP_BZIP2, "bz2"), (zipfile.ZIP_LZMA, "lzma"))
               if importlib.util.find_spec(module) is not None}}
_RATIO_SLACK = 4096  # bytes past the ratio a stream's own framing may give a tiny member
# Flag bits of a zip member that zipfile cannot read past
_FLAGS = ((0x1, "encrypted"), (0x40, "encrypted (strong encryption)"), (0x20, "stored as compressed patch data"))


def npz_headers(path: Path) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The dtype and shape of each array in the .npz at `path`, by key, from the headers alone."""
    require_zip(path)
    try:
        with zipfile.ZipFile(path) as archive:
            return {key: _header(archive, info, key, path)[:2] for key, info in _members(archive, path).items()}
    except _DAMAGED as err:
        raise GraphAuditError(f"expected a readable .npz archive at {path}, found a damaged one ({brief(err)})") from None


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of the .npz at `path`, by key, once every member's header has passed (pickles refused)."""
    require_zip(path)
    try:
        with zipfile.ZipFile(path) as archive:
            members = _members(archive, path)
            headers = {key: _header(archive, info, key, path) for key, info in members.items()}
            total, memory = sum(nbytes for _, _, nbytes in headers.values()), memory_bytes()
            if memory is not None and total > memory:
                raise GraphAuditError(f"expected arrays that fit in memory ({in_words(memory)} here) in {path}, found "
                                      f"{len(headers)} arrays declaring {in_words(total)} together")
            return {key: _array(archive, info, key, path) for key, info in members.items()}
    except _DAMAGED as err:
        raise GraphAuditError(f"expected a readable .npz archive at {path}, found a damaged one ({brief(err)})") from None


def _members(archive: zipfile.ZipFile, path: Path) -> dict[str, zipfile.ZipInfo]:
    """The members of `archive` by key (the name less `.npy`, as numpy keys them), each found
    readable and bounded from the zip's directory alone."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        if info.is_dir():
            continue
        key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        if key in members:
            raise GraphAuditError(f"expected each key once in {path}, found {key!r} twice "
                                  f"({members[key].filename!r} and {info.filename!r})")
        flag = next((what for bit, what in _FLAGS if info.flag_bits & bit), None)
        if flag is not None:
            raise GraphAuditError(f"expected .npz members that are not encrypted (as numpy writes them) in {path}, "
                                  f"found {info.filename!r} {flag}")
        if info.compress_type not in _METHODS:
            name = _COMPRESSOR_NAMES.get(info.compress_type, "unknown")
            raise GraphAuditError(f"expected .npz members stored or compressed with Deflate (as numpy writes them), "
                                  f"bzip2 or LZMA in {path}, found {info.filename!r} compressed with {name} "
                                  f"(method {info.compress_type}), which Python's zipfile cannot read")
        ratio = _METHODS[info.compress_type]
        if ratio is not None and info.file_size > info.compress_size * ratio + (_RATIO_SLACK if ratio > 1 else 0):
            raise GraphAuditError(f"expected .npz members whose declared size their compressed bytes can hold in "
                                  f"{path}, found {info.filename!r} declaring {in_words(info.file_size)} from "
                                  f"{in_words(info.compress_size)} ({_COMPRESSOR_NAMES[info.compress_type]} "
                                  f"expands at most {ratio}-fold)")
        members[key] = info
    return members


def _header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, key: str,
            path: Path) -> tuple[np.dtype, tuple[int, ...], int]:
    """The dtype, shape and bytes the .npy header of `info` declares, once checked: no pickles,
    a shape graphaudit.limits bounds, an array that fits in memory and that the member holds."""
    with archive.open(info) as f:
        magic = f.read(len(_MAGIC) + 2)  # the magic string, then the format's major and minor version
        if magic[:len(_MAGIC)] != _MAGIC:  # numpy hands such a member back as its bytes
            raise GraphAuditError(f"expected every member of {path} to be a NumPy .npy array, found {key!r} holding "
                                  f"{info.file_size} bytes without the .npy header")
        version = tuple(magic[len(_MAGIC):])
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise GraphAuditError(f"expected .npy format version 1.0, 2.0 or 3.0 for {key!r} in {path}, found "
                                  f"{'.'.join(map(str, version)) or 'none'}")
        try:  # version 3.0 differs from 2.0 only in allowing UTF-8 in the header's field names
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
        except ValueError as err:
            if "max_header_size" in str(err):  # numpy's guard against headers built to exhaust memory
                raise GraphAuditError(f"expected .npy headers of at most 10 kB in {path} (numpy's limit for files it "
                                      "does not trust), found a larger one") from None
            found = brief(err)
            if "<ast." in found:  # numpy names only the syntax node of a header that is no plain literal
                found = (f"the header {_quoted(_raw_header(archive, info))}, which is not a plain literal (numpy "
                         "reads a .npy header as a dict of literals only)")
            raise GraphAuditError(f"expected a readable .npy header for {key!r} in {path}, found: {found}") from None
        start = f.tell()
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise GraphAuditError(f"expected numeric arrays in {path}, found {key!r} holding pickled Python objects; "
                              "graphaudit never loads pickles (they can run code)")
    shape = check_shape(shape, f"the array {key!r} in {path.name}", itemsize=dtype.itemsize)
    nbytes = math.prod(shape) * dtype.itemsize
    declared = f"a declared shape {shape} of {dtype} ({nbytes} bytes) for key {key!r}"
    memory = memory_bytes()
    if memory is not None and nbytes > memory:  # numpy allocates what a header declares before reading
        raise GraphAuditError(f"expected arrays that fit in memory ({in_words(memory)} here) in {path}, found {declared}")
    if start + nbytes > info.file_size:
        raise GraphAuditError(f"expected each array in {path} to hold what its header declares, found {declared} "
                              f"in a member of {info.file_size - start} bytes past its header")
    return dtype, shape, nbytes


def _array(archive: zipfile.ZipFile, info: zipfile.ZipInfo, key: str, path: Path) -> np.ndarray:
    """The array in the member `info`, whose header `_header` has checked."""
    try:
        with archive.open(info) as f:
            return np.lib.format.read_array(f, allow_pickle=False)
    except MemoryError:
        raise GraphAuditError(f"expected arrays that fit in memory in {path}, found {key!r} too large to "
                              "allocate") from None
    except _DAMAGED as err:
        raise GraphAuditError(f"expected a readable array {key!r} in {path}, found a damaged one ({brief(err)})") from None


def require_zip(path: Path) -> None:
    """Refuse a `path` that is no file or no zip archive."""
    if not path.is_file():
        raise GraphAuditError(f"expected a data file (.npz) at {path}, found {path_kind(path)}")  # never opened
    if not zipfile.is_zipfile(path):
        raise GraphAuditError(
            f"expected a NumPy .npz archive (a zip of .npy arrays) at {path}, found a file that is not a zip archive"
        )


def _raw_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    """The header text of an .npy member as written, unparsed (empty for one without the magic)."""
    with archive.open(info) as f:
        start = f.read(8)
        if not start.startswith(b"\x93NUMPY"):
            return ""
        size = int.from_bytes(f.read(2 if start[6] == 1 else 4), "little")
        return f.read(min(size, 10_000)).decode("latin1", "replace").strip()


def _quoted(text: str, most: int = 160) -> str:
    return repr(text if len(text) <= most else text[:most] + "…")
