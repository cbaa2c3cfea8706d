"""The files of a kept coefficient cache: written without following links, checked before reuse.

A cache's folder under `--cache-dir` holds one .npy file per array, `live.npz` (the live
outputs of the first batch) and `manifest.json`, written last, which records each array's
dtype and shape and each file's size and SHA-256 digest. All of it is input: before a cache
is reused, the manifest's keys and types are checked by hand, each .npy header is read (no
data loaded, never a pickle) and compared with the manifest, each file's size and digest
too, and the coefficients must be finite, as a capture keeps them. A cache that fails any
of these is damaged (`CacheDamage`, with the reason) and captured again.

A file being written (`graphaudit.files.write.MadeFiles`) is tracked until it is renamed onto
its name or removed, so that not even a command killed outright leaves one behind.

Nothing here opens a link or anything but a regular file: entries are checked with lstat
and opened with O_NOFOLLOW (and O_NONBLOCK, so a FIFO never blocks). Every file is written
under a fresh name in the cache's folder (O_EXCL) and renamed onto its own, which replaces a
link or a FIFO left there instead of writing through it. The folder itself must be a folder,
not a link; a folder where a file should be is refused (GraphAuditError), never removed.
`--cache-dir` itself may be a link: the user named it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import mmap
import os
import secrets
import stat
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np

from graphaudit.errors import GraphAuditError
from graphaudit.files.write import MadeFiles, make_folders

FORMAT = 3
MANIFEST = "manifest.json"
LIVE_FILE = "live.npz"
PARTIAL = ".partial-"  # prefix of a file being written, renamed onto its own name when whole
_MANIFEST_LIMIT = 2**24  # bytes: a manifest lists a few entries per coefficient tensor
_KINDS = "biufc"  # numeric dtypes only: an object array would be a pickle
_CHUNK = 2**24
_T = TypeVar("_T")


class CacheDamage(Exception):
    """A kept cache that cannot be reused, and why (one clause, for the report's note)."""


def cache_folder(folder: Path, cache_dir: str | os.PathLike[str]) -> list[Path]:
    """Create the cache's `folder` under `cache_dir`, refusing a path that cannot be a folder of
    its own; return the folders this made, outermost first."""
    try:
        made = make_folders(folder)  # tracked until the capture settles them
    except OSError as err:
        blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        found = f"{blocking} is not a folder" if blocking is not None else f"{err.strerror or err}: {err.filename}"
        raise GraphAuditError(f"expected a folder for the coefficient cache at {cache_dir}, found {found}") from None
    refuse_link(folder)
    return made


def refuse_link(folder: Path) -> None:
    """Refuse a cache folder that is a symbolic link: what is written into it would land elsewhere."""
    if folder.is_symlink():
        raise GraphAuditError(f"expected the coefficient cache folder {folder} to be a folder, found a symbolic "
                              f"link to {os.readlink(folder)}; remove it or choose another --cache-dir")


def refuse_folders(folder: Path, names) -> None:
    """Refuse a folder standing where one of the cache's files goes: it is not the cache's to remove."""
    for name in names:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            raise GraphAuditError(f"expected the coefficient cache file {path} to be a file, found a folder; "
                                  "remove it or choose another --cache-dir")


def partial_name(folder: Path, name: str) -> Path:
    """A fresh name in `folder` for a file that becomes `name` once written whole."""
    return folder / f"{PARTIAL}{secrets.token_hex(8)}-{name}"


def new_npy(path: Path, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, mmap.mmap]:
    """A new .npy file at `path` (which must not exist: never a link followed), memory-mapped for writing.

    Its blocks are reserved on disk before it is mapped: a write through a mapping into a file
    the disk has no room for is not an error but SIGBUS, which ends the process at once (no
    message, its temporary files left behind). Reserved, a full disk is a one-line error here.
    """
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    values = math.prod(shape) * np.dtype(dtype).itemsize

    def mapped(f: BinaryIO) -> tuple[int, mmap.mmap]:
        np.lib.format.write_array_header_2_0(f, header)
        offset = f.tell()
        f.truncate(offset + values)
        _reserve(f.fileno(), offset + values)
        try:
            return offset, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_WRITE)
        except OSError as err:  # the room is there: what is missing is address space
            if err.errno != errno.ENOMEM:
                raise
            raise GraphAuditError(f"expected to map the coefficient cache file {path} ({values:,} bytes) into "
                                  f"memory, found {err.strerror}: the process's address space is limited "
                                  "(ulimit -v); raise the limit") from None

    offset, mapping = _write(path, mapped, f"({values:,} bytes of coefficients)",
                             "another folder (--cache-dir, or TMPDIR for the temporary cache a large capture writes)")
    return np.ndarray(shape, dtype=dtype, buffer=mapping, offset=offset), mapping


# What posix_fallocate answers where the disk, a quota or a size limit leaves no room for the file
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _reserve(fd: int, size: int) -> None:
    """Reserve `size` bytes of disk for the file `fd`; OSError where there is no room. Where the
    system or the file system cannot reserve (macOS has no posix_fallocate), nothing is done."""
    if not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno in _NO_ROOM:
            raise


def seal(folder: Path, key: str, count: int, written: Mapping[str, tuple[str, Path, np.ndarray, mmap.mmap]],
         live: Mapping[str, np.ndarray], partials: MadeFiles) -> None:
    """Write `live` and the manifest of the arrays `written` ({key: (file name, partial path, array,
    mapping)}) and rename every file onto its name, the manifest last: until it is there, no cache.
    `partials`: the files being written, to which this adds its own (the caller removes them on failure)."""
    arrays = {}
    for name, (_file, _partial, array, mapping) in written.items():
        mapping.flush()
        arrays[name] = {"descr": np.lib.format.dtype_to_descr(array.dtype), "shape": list(array.shape),
                        "bytes": len(mapping), "sha256": _digest(mapping)}
        release(mapping)
    live_partial = partials.add(partial_name(folder, LIVE_FILE))
    _write(live_partial, lambda f: _write_npz(f, live))
    with _open(live_partial) as f:
        entry = {"bytes": os.fstat(f.fileno()).st_size, "sha256": _file_digest(f)}
    manifest = {"format": FORMAT, "key": key, "count": count, "arrays": arrays, "live": entry}
    manifest_partial = partials.add(partial_name(folder, MANIFEST))
    _write(manifest_partial, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
    for file, partial in [(file, partial) for file, partial, _, _ in written.values()] + [
            (LIVE_FILE, live_partial), (MANIFEST, manifest_partial)]:
        try:
            os.replace(partial, folder / file)  # replaces a link or FIFO there, never writes through it
        except OSError as err:
            raise GraphAuditError(f"expected to put the coefficient cache file {folder / file} in place, found "
                                  f"{err.strerror or err}") from None
        partials.done(partial)


def clear(folder: Path) -> None:
    """Remove the manifest of a cache about to be written again, and the partial files of a capture
    that was killed (the entries, never what a link names)."""
    try:
        (folder / MANIFEST).unlink()
    except FileNotFoundError:
        pass
    except OSError as err:  # a folder the user may read but not write
        raise GraphAuditError(f"expected to write the coefficient cache in {folder}, found {err.strerror or err}") \
            from None
    for path in folder.glob(f"{PARTIAL}*"):
        with contextlib.suppress(OSError):  # a folder of that name is not the cache's to remove
            path.unlink()


def kept_cache(folder: Path, key: str, files: Mapping[str, str], count: int,
               finite: set[str]) -> tuple[dict[str, np.ndarray], dict[str, mmap.mmap], dict[str, np.ndarray]] | None:
    """The arrays, their mappings and the live outputs of the cache in `folder`, None when there is
    none; CacheDamage when it is there but cannot be reused. `files`: {array key: file name} that
    may be cached (every key but the LiveCheck's must be); `finite`: the keys whose values a
    capture keeps only when finite (the coefficients)."""
    if not folder.exists() and not folder.is_symlink():
        return None
    refuse_link(folder)
    refuse_folders(folder, (MANIFEST, LIVE_FILE, *files.values()))
    manifest = _check_manifest(_manifest(folder), key, files, count, finite)
    mapped: dict[str, tuple[np.ndarray, mmap.mmap]] = {}
    try:
        for name, entry in manifest["arrays"].items():
            mapped[name] = _checked_npy(folder / files[name], entry, name in finite)
        live = _checked_live(folder / LIVE_FILE, manifest["live"])
    except CacheDamage:
        maps = [mapping for _, mapping in mapped.values()]
        mapped.clear()  # the arrays first: a mapping cannot close under an array viewing it
        for mapping in maps:
            _close(mapping)
        raise
    return {k: a for k, (a, _) in mapped.items()}, {k: m for k, (_, m) in mapped.items()}, live


def release(mapping: mmap.mmap) -> None:
    """Drop the mapping's resident pages; their contents stay in the page cache and the file."""
    if hasattr(mmap, "MADV_DONTNEED"):
        mapping.madvise(mmap.MADV_DONTNEED)


def _manifest(folder: Path) -> object:
    path = folder / MANIFEST
    if not path.exists() and not path.is_symlink():
        raise CacheDamage(f"{path} is missing (a capture that did not finish)")
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > _MANIFEST_LIMIT:
            raise CacheDamage(f"{path} is {size} bytes, past the {_MANIFEST_LIMIT} a manifest can be")
        text = f.read(_MANIFEST_LIMIT + 1)
    try:
        return json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, or nested past Python's stack
        raise CacheDamage(f"{path} is not JSON ({type(err).__name__})") from None


def _check_manifest(doc: object, key: str, files: Mapping[str, str], count: int,
                    finite: set[str]) -> dict[str, Any]:
    """Return the manifest `doc` once its keys and types are checked by hand, and that it is this
    cache's: CacheDamage if not."""
    where = "its manifest.json"
    if isinstance(doc, dict) and "format" in doc and (doc["format"] != FORMAT or type(doc["format"]) is not int):
        raise CacheDamage(f"{where} has format {doc['format']!r}, not {FORMAT} (another graphaudit wrote it)")
    doc = _keys(doc, {"format", "key", "count", "arrays", "live"}, where)
    if doc["key"] != key:
        raise CacheDamage(f"{where} has another key than the model, data and settings give")
    if doc["count"] != count or type(doc["count"]) is not int:
        raise CacheDamage(f"{where} has count {doc['count']!r}, not the {count} inputs")
    arrays = doc["arrays"]
    if not isinstance(arrays, dict) or not finite <= set(arrays) or not set(arrays) <= set(files):
        found = sorted(arrays) if isinstance(arrays, dict) else type(arrays).__name__
        raise CacheDamage(f"{where} lists arrays {found}, not the coefficients {sorted(finite)}")
    for name, entry in arrays.items():
        _keys(entry, {"descr", "shape", "bytes", "sha256"}, f"{where}'s entry for {name!r}")
        shape = entry["shape"]
        if not isinstance(entry["descr"], str) or not isinstance(shape, list) or not shape or \
                not all(type(n) is int and n >= 0 for n in shape) or shape[0] != count:
            raise CacheDamage(f"{where}'s entry for {name!r} has no dtype or no shape of {count} inputs")
        _file_entry(entry, f"{where}'s entry for {name!r}")
    _keys(doc["live"], {"bytes", "sha256"}, f"{where}'s entry for {LIVE_FILE}")
    _file_entry(doc["live"], f"{where}'s entry for {LIVE_FILE}")
    return doc


def _keys(value: object, keys: set[str], where: str) -> dict[str, Any]:
    """Return `value` once it is a JSON object with exactly `keys`: CacheDamage if not."""
    if not isinstance(value, dict):
        raise CacheDamage(f"{where} is not a JSON object (found {type(value).__name__})")
    if set(value) != keys:
        raise CacheDamage(f"{where} has keys {sorted(value)}, not {sorted(keys)}")
    return value


def _file_entry(entry: dict, where: str) -> None:
    digest = entry["sha256"]
    if type(entry["bytes"]) is not int or entry["bytes"] < 0 or not isinstance(digest, str) or len(digest) != 64 \
            or not all(ch in "0123456789abcdef" for ch in digest):
        raise CacheDamage(f"{where} has no size in bytes and SHA-256 digest")


def _checked_npy(path: Path, entry: dict, finite: bool) -> tuple[np.ndarray, mmap.mmap]:
    """The array in the .npy file at `path`, memory-mapped, once its header, size, digest (and
    values, when `finite`) agree with its manifest `entry`; CacheDamage if not."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size != entry["bytes"]:
            raise CacheDamage(f"{path} is {size} bytes, where the manifest says {entry['bytes']}"
                              + (" (cut short)" if size < entry["bytes"] else ""))
        try:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            shape, fortran, dtype = read[version](f)
        except Exception:  # noqa: BLE001 - numpy's parser of a damaged header raises ValueError, SyntaxError, TokenError...
            raise CacheDamage(f"{path} has no .npy header graphaudit writes") from None
        offset = f.tell()
        if dtype.hasobject or dtype.kind not in _KINDS or dtype.fields is not None:
            raise CacheDamage(f"{path} holds dtype {dtype.str!r}, not numbers (never loaded)")
        descr = np.lib.format.dtype_to_descr(dtype)
        if descr != entry["descr"] or list(shape) != entry["shape"] or fortran:
            raise CacheDamage(f"{path}'s header holds {descr!r} {list(shape)}{' (Fortran order)' if fortran else ''}, "
                              f"where the manifest says {entry['descr']!r} {entry['shape']}")
        if offset + math.prod(shape) * dtype.itemsize != size:
            raise CacheDamage(f"{path} is {size} bytes, not the {offset} of its header and the data of its shape")
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    array = np.ndarray(shape, dtype=dtype, buffer=mapping, offset=offset)
    if _digest(mapping) != entry["sha256"]:
        damage = f"{path} does not match its SHA-256 digest (changed since it was written)"
    elif finite and dtype.kind in "fc" and not _all_finite(array):
        damage = f"{path} holds NaN or Inf values, which a capture never keeps"
    else:
        release(mapping)
        return array, mapping
    del array
    _close(mapping)
    raise CacheDamage(damage)


def _checked_live(path: Path, entry: dict) -> dict[str, np.ndarray]:
    """The live outputs in `path` once its size and digest agree with its manifest `entry`."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size != entry["bytes"] or _file_digest(f) != entry["sha256"]:
            raise CacheDamage(f"{path} does not match its size and SHA-256 digest (changed since it was written)")
        f.seek(0)
        try:
            with np.load(f, allow_pickle=False) as archive:
                return {k: archive[k] for k in archive.files}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError, RuntimeError) as err:
            raise CacheDamage(f"{path} cannot be read as live outputs ({type(err).__name__})") from None


def _close(mapping: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # a view still held elsewhere: the mapping goes with it
        mapping.close()


def _all_finite(array: np.ndarray) -> bool:
    rows = max(1, _CHUNK // max(1, array[0].nbytes)) if len(array) else 1
    return all(np.isfinite(array[start:start + rows]).all() for start in range(0, len(array), rows))


def _write_npz(f: BinaryIO, arrays: Mapping[str, np.ndarray]) -> None:
    """Write `arrays` to `f` as np.savez does, an uncompressed .npz: not through its keywords, where an
    output named `file` or `allow_pickle` would be taken for its argument."""
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)


def _file_digest(f: BinaryIO) -> str:
    """The SHA-256 digest of the rest of `f`, read in chunks (hashlib.file_digest is Python 3.11's)."""
    digest = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _digest(mapping: mmap.mmap) -> str:
    digest = hashlib.sha256()
    view = memoryview(mapping)
    try:
        for start in range(0, len(view), _CHUNK):
            digest.update(view[start:start + _CHUNK])
    finally:
        view.release()
    return digest.hexdigest()


def _open(path: Path):
    """`path` opened for reading: a regular file only, never a link followed, never a FIFO waited on."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise CacheDamage(f"{path} is missing") from None
    if stat.S_ISLNK(info.st_mode):
        raise CacheDamage(f"{path} is a symbolic link (never followed)")
    if not stat.S_ISREG(info.st_mode):
        raise CacheDamage(f"{path} is not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise CacheDamage(f"{path} cannot be read ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # changed since the lstat
        os.close(fd)
        raise CacheDamage(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def _write(path: Path, write: Callable[[BinaryIO], _T], size: str = "", elsewhere: str = "another --cache-dir") -> _T:
    """What `write(f)` gives, `f` a new file at `path` (`_create`); a disk with no room for it is a
    one-line error naming its `size` and where else it could go, any other failure to write one
    naming what the system said."""
    file = _create(path)
    try:
        with file as f:
            return write(f)
    except OSError as err:
        if err.errno in _NO_ROOM:
            raise GraphAuditError(f"expected room for the coefficient cache file {path}{' ' + size if size else ''},"
                                  f" found {err.strerror}; free space there, or choose {elsewhere}") from None
        raise GraphAuditError(f"expected to write the coefficient cache file {path}, found {err.strerror or err}; "
                              f"choose {elsewhere}") from None


def _create(path: Path):
    """A new file at `path`, open for reading and writing: O_EXCL, so nothing there is written through."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        raise GraphAuditError(f"expected to write the coefficient cache file {path}, found "
                              f"{err.strerror or err}") from None
    return os.fdopen(fd, "r+b")
