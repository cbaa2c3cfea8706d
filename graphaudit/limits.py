"""The sizes graphaudit accepts before it reads or counts anything: files, dimensions, arrays.

A size past one of these bounds can only exhaust memory or overflow a count, so it is
refused in one line before anything is read or allocated. One check, `check_shape`, holds
for every shape a user gives: an .npz header's (every command), `--shape` (static) and the
shapes handed to the FLOP count from Python.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from graphaudit.errors import GraphAuditError

# Most intra-op threads: ONNX Runtime takes a C int and starts every thread it is given
MAX_THREADS = 1024

# protobuf cannot hold a message past 2 GiB, so no ONNX file larger parses (weights past it
# go in external-data files, which are never the .onnx itself)
MAX_MODEL_BYTES = 2**31 - 1
# One dimension at most: ONNX Runtime's kernels index many axes with 32-bit integers
MAX_DIM = 2**31 - 1
# One array at most: 2^47 bytes (128 TiB) is all a 64-bit process can address on x86-64 and
# arm64 (48-bit virtual addresses, half for the kernel); below int64's 2^63 too
MAX_ARRAY_BYTES = 2**47


def check_shape(shape: Sequence[object], where: str, *, itemsize: int = 1, least: int = 0,
                exit_code: int = 1) -> tuple[int, ...]:
    """`shape` as a tuple of ints, once each dimension is an integer from `least` to MAX_DIM and
    the array it shapes (of `itemsize`-byte elements) takes at most MAX_ARRAY_BYTES."""
    given = tuple(shape)
    ints: list[int] = []
    for axis, size in enumerate(given):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not least <= size <= MAX_DIM:
            kind = "positive" if least > 0 else "non-negative"
            raise GraphAuditError(f"expected {where} to have {kind} integer dimensions of at most {MAX_DIM} (2^31-1), "
                                  f"found {size!r} on axis {axis} of {_show(given)}", exit_code=exit_code)
        ints.append(int(size))
    dims = tuple(ints)
    elements = math.prod(dims)
    if elements * max(itemsize, 1) > MAX_ARRAY_BYTES:
        raise GraphAuditError(f"expected {where} to take at most 2^47 bytes (128 TiB, all a 64-bit process can "
                              f"address), found shape {_show(dims)}: {elements:.3g} elements"
                              + (f" of {itemsize} bytes" if itemsize > 1 else ""),
                              exit_code=exit_code)
    return dims


def memory_bytes() -> int | None:
    """Bytes of physical memory this machine has; None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def in_words(size: int) -> str:
    """A number of bytes in words: `2.5 GiB (2684354560 bytes)`."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit} ({size} bytes)"
    return f"{size} bytes"


def _show(dims: tuple) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"
