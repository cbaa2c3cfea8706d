"""The training corpus: the running Python's standard library source, as bytes.

Every machine with Python has it and nobody here wrote it. Files are the `.py` files under
`sysconfig.get_paths()["stdlib"]`, except installed packages (`site-packages`) and test
suites (`test`, `tests`, `idle_test` folders: they hold generated data and odd encodings).
The sorted file list is shuffled with a seed and split by file into train / calib / eval,
so the three never share a file. The stdlib differs slightly between Python versions:
fixtures record the version they were built with.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
CALIB_FILES = 64
EVAL_FILES = 64


@dataclass(frozen=True)
class Split:
    """Files of one split (relative to the stdlib root) and their concatenated bytes."""

    files: tuple[str, ...]
    data: np.ndarray  # uint8, the files' bytes, concatenated in `files` order


@dataclass(frozen=True)
class Corpus:
    root: Path
    train: Split
    calib: Split
    eval: Split


def stdlib_files(root: Path) -> list[str]:
    """Return the corpus's source files under `root`, relative and sorted."""
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if not EXCLUDED_DIRS & set(rel.parts[:-1]) and path.is_file():
            files.append(rel.as_posix())
    return sorted(files)


def load_corpus(seed: int = 0, root: str | Path | None = None) -> Corpus:
    """Return the stdlib corpus split by file: train, then CALIB_FILES and EVAL_FILES held out."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = stdlib_files(root)
    order = np.random.default_rng(seed).permutation(len(files))
    shuffled = [files[i] for i in order]
    calib = shuffled[:CALIB_FILES]
    eval_ = shuffled[CALIB_FILES : CALIB_FILES + EVAL_FILES]
    train = shuffled[CALIB_FILES + EVAL_FILES :]
    return Corpus(root, _split(root, train), _split(root, calib), _split(root, eval_))


def _split(root: Path, files: list[str]) -> Split:
    files = sorted(files)
    data = b"".join((root / f).read_bytes() for f in files)
    return Split(tuple(files), np.frombuffer(data, dtype=np.uint8))


def unigram_entropy(data: np.ndarray) -> float:
    """Return the entropy (nats) of the byte distribution of `data`."""
    counts = np.bincount(data, minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def windows_from_files(
    root: Path, files: tuple[str, ...], n: int, length: int, seed: int
) -> np.ndarray:
    """Return n windows of `length` bytes, (n, length) int64, each from a different file.

    Files shorter than the window are skipped; the files and the offsets are seeded.
    """
    rng = np.random.default_rng(seed)
    long_enough = [f for f in files if (root / f).stat().st_size > length]
    if len(long_enough) < n:
        raise ValueError(f"expected {n} files longer than {length} bytes, found {len(long_enough)}")
    chosen = sorted(rng.choice(len(long_enough), size=n, replace=False))
    rows = []
    for i in chosen:
        data = (root / long_enough[i]).read_bytes()
        start = int(rng.integers(0, len(data) - length + 1))
        rows.append(np.frombuffer(data[start : start + length], dtype=np.uint8))
    return np.stack(rows).astype(np.int64)


def random_windows(data: np.ndarray, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """Return n windows of `length` bytes at random offsets of `data`, (n, length) int64."""
    starts = rng.integers(0, len(data) - length + 1, size=n)
    return np.stack([data[s : s + length] for s in starts]).astype(np.int64)
