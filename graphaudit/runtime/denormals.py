"""Denormal numbers flushed to zero while graphaudit's own ONNX Runtime runs compute.

On x86-64, arithmetic whose result or input is a denormal float (below about 1.2e-38 in
magnitude) takes a slow microcode path unless the thread's SSE control register (MXCSR)
sets flush-to-zero (FTZ) and denormals-are-zero (DAZ). ONNX Runtime's CPU `Exp` and
`Softmax` kernels meet such values at every masked position of a causal attention (its
score is -inf or the float minimum, so its exponential underflows). On an Intel Xeon here
(`benchmarks/denormals.py`, benchmarks/NOTES.md) a (16, 4, 64, 64) causally masked softmax took
1.0 ms, 0.2 ms with FTZ/DAZ set, and the zoo's frozen graphs 1.46x (FeatureGate) and
1.35x (MUDD) as long per batch of 16; setting and restoring the bits costs about 15 us a
run. What flushing changes are values below 1.2e-38, which a float32 sum of anything
larger does not see: those outputs, and the zoo's replay figures, came out the same to
the bit.

ONNX Runtime's session option `session.set_denormal_as_zero` sets FTZ/DAZ on its intra-op
pool threads, but its session constructor also sets or clears them on the thread that
creates the session, and a run on one intra-op thread computes in the calling thread. So
graphaudit keeps the calling thread's own setting around every session it creates
(`kept`) and sets FTZ/DAZ itself on the thread that calls `run`, for that run only
(`FlushingSession`): the caller's own arithmetic (scoring, statistics) is untouched.
Both change the FTZ/DAZ bits of MXCSR alone, through the C library's `fegetenv` /
`fesetenv`, where the layout of `fenv_t` is known: glibc on x86-64. Elsewhere they do
nothing, and the pool threads still get ONNX Runtime's option.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import platform
import sys
from collections.abc import Iterator

import onnxruntime as ort

# ONNX Runtime's session option that flushes denormals on its intra-op pool threads
SESSION_OPTION = "session.set_denormal_as_zero"
_FTZ_DAZ = 0x8000 | 0x0040  # MXCSR bit 15: flush to zero; bit 6: denormals are zero


class _Environment(ctypes.Structure):
    """glibc's fenv_t on x86-64: the x87 environment (28 bytes), then MXCSR."""

    _fields_ = [("x87", ctypes.c_uint8 * 28), ("mxcsr", ctypes.c_uint32)]


@functools.cache
def _libm() -> ctypes.CDLL | None:
    """The C maths library whose fegetenv / fesetenv graphaudit may use; None where the
    layout of fenv_t is not known (anything but glibc on x86-64)."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libm = ctypes.CDLL("libm.so.6")
    except OSError:
        return None
    for name in ("fegetenv", "fesetenv"):
        getattr(libm, name).argtypes, getattr(libm, name).restype = [ctypes.POINTER(_Environment)], ctypes.c_int
    return libm


def supported() -> bool:
    """Whether this thread's FTZ/DAZ can be set here (glibc on x86-64)."""
    return _libm() is not None


def _bits() -> int | None:
    """This thread's FTZ/DAZ bits of MXCSR; None where they cannot be read."""
    libm = _libm()
    if libm is None:
        return None
    env = _Environment()
    return env.mxcsr & _FTZ_DAZ if libm.fegetenv(env) == 0 else None


def _set_bits(bits: int) -> int | None:
    """Set this thread's FTZ/DAZ bits to `bits`, the rest of its floating-point environment
    (the x87 state, the exception flags a run raised) as it is; return the bits they had."""
    libm = _libm()
    if libm is None:
        return None
    env = _Environment()
    if libm.fegetenv(env) != 0:
        return None
    had = env.mxcsr & _FTZ_DAZ
    if had != bits:
        env.mxcsr = (env.mxcsr & ~_FTZ_DAZ) | bits
        libm.fesetenv(env)
    return had


def flushing() -> bool:
    """Whether this thread flushes denormals now (FTZ and DAZ both set); False where unknown."""
    return _bits() == _FTZ_DAZ


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Give this thread back its FTZ/DAZ bits as they were (ONNX Runtime's session
    constructor sets or clears them on the thread that creates a session)."""
    had = _bits()
    try:
        yield
    finally:
        if had is not None:
            _set_bits(had)


@contextlib.contextmanager
def flushed() -> Iterator[None]:
    """Within: this thread flushes denormals to zero; after: its FTZ/DAZ bits as they were."""
    had = _set_bits(_FTZ_DAZ)
    try:
        yield
    finally:
        if had is not None:
            _set_bits(had)


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
