"""Hand-made .npz archives: a zip member's headers patched to say what it is not."""

from __future__ import annotations

import struct
from pathlib import Path


def patch_member(path: Path, *, flags: int | None = None, method: int | None = None,
                 file_size: int | None = None, compress_size: int | None = None) -> None:
    """Rewrite the first member's flag bits, method or sizes in both its local and its central header."""
    data = bytearray(path.read_bytes())
    central = data.index(b"PK\x01\x02")
    for start, at in ((0, (6, 8, 18, 22)), (central, (8, 10, 20, 24))):
        for value, offset, fmt in ((flags, at[0], "<H"), (method, at[1], "<H"), (compress_size, at[2], "<I"),
                                   (file_size, at[3], "<I")):
            if value is not None:
                struct.pack_into(fmt, data, start + offset, value)
    path.write_bytes(bytes(data))
