"""Denormal numbers flushed to zero while graphaudit's own ONNX Runtime runs compute.

On x86-64, arithmetic whose result or input is a denormal float (below about 1.2e-38 in
magnitude) takes a slow microcode path unless the thread's SSE control register (MXCSR)
sets flush-to-zero (FTZ) and denormals-are-zero (DAZ). ONNX Runtime's CPU `Exp` and
`Softmax` kernels meet such values at every masked position of a causal attention (its
score is -inf or the float minimum, so its exponential underflows): on an Intel Xeon here
a (16, 4, 64, 64) half-masked softmax took 0.94 ms, 0.16 ms with FTZ/DAZ set, and the
replay loop of the zoo's FeatureGate and MUDD at batch 16 took 105 and 138 ms instead of
150 and 183 (BENCHMARKS.md, replay). What flushing changes are values below 1.2e-38,
which a float32 sum of anything larger does not see: the zoo's replay figures came out
the same to the bit.

ONNX Runtime's session option `session.set_denormal_as_zero` sets FTZ/DAZ on its intra-op
pool threads, but its session constructor also sets or clears them on the thread that
creates the session, and a run on one intra-op thread computes in the calling thread. So
graphaudit keeps the calling thread's own setting around every session it creates
(`kept`) and sets FTZ/DAZ itself on the thread that calls `run`, for that run only
(`FlushingSession`): the caller's own arithmetic (scoring, statistics) is untouched. Both read and write MXCSR through the C library's `fegetenv` / `fesetenv`,
where the layout of `fenv_t` is known: glibc on x86-64. Elsewhere they do nothing, and
the pool threads still get ONNX Runtime's option.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import platform
import sys
from typing import Iterator

import onnxruntime as ort

# ONNX Runtime's session option that flushes denormals on its intra-op pool threads
SESSION_OPTION = "session.set_denormal_as_zero"
# glibc's x86-64 fenv_t: the x87 environment (28 bytes), then MXCSR (4 bytes)
_FENV_SIZE, _MXCSR_OFFSET = 32, 28
_FTZ_DAZ = 0x8000 | 0x0040  # MXCSR bit 15: flush to zero; bit 6: denormals are zero


@functools.cache
def _libm() -> ctypes.CDLL | None:
    """The C maths library whose fegetenv / fesetenv graphaudit may use; None where the
    layout of fenv_t is not known (anything but glibc on x86-64)."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libm.so.6", use_errno=True)
    except OSError:
        return None


def supported() -> bool:
    """Whether this thread's FTZ/DAZ can be set here (glibc on x86-64)."""
    return _libm() is not None


def _environment() -> ctypes.Array | None:
    libm = _libm()
    if libm is None:
        return None
    env = (ctypes.c_uint8 * _FENV_SIZE)()
    return env if libm.fegetenv(env) == 0 else None


def _mxcsr(env: ctypes.Array) -> int:
    return int.from_bytes(bytes(env[_MXCSR_OFFSET:_MXCSR_OFFSET + 4]), "little")


def flushing() -> bool:
    """Whether this thread flushes denormals now (FTZ and DAZ both set); False where unknown."""
    env = _environment()
    return env is not None and _mxcsr(env) & _FTZ_DAZ == _FTZ_DAZ


def set_flushing() -> None:
    """Set FTZ/DAZ on this thread for good (a worker thread of graphaudit's own, at its start)."""
    env = _environment()
    if env is not None:
        env[_MXCSR_OFFSET:_MXCSR_OFFSET + 4] = list((_mxcsr(env) | _FTZ_DAZ).to_bytes(4, "little"))
        _libm().fesetenv(env)


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Give this thread back its floating-point environment as it was (ONNX Runtime's session
    constructor sets or clears FTZ/DAZ on the thread that creates a session)."""
    env = _environment()
    try:
        yield
    finally:
        if env is not None:
            _libm().fesetenv(env)


@contextlib.contextmanager
def flushed() -> Iterator[None]:
    """Within: this thread flushes denormals to zero; after: as it was."""
    with kept():
        set_flushing()
        yield


class FlushingSession:
    """An ONNX Runtime session whose `run` computes with denormals flushed to zero in the
    thread that calls it (and only during the run); everything else is the session's own.
    Where FTZ/DAZ cannot be set here (`supported`), `run` is the session's."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session

    def run(self, *args, **kwargs):
        with flushed():
            return self.session.run(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.session, name)
