"""The threads that encode audio in a gateway process.

PyAV releases the GIL while a codec runs, so streams' encoding spreads over cores; but past a few threads per
process more threads cost more than they add. On a 16-core H100 host, one process encoding mp3 on 4 threads made
572 audio seconds a second, on 16 threads 303 (each encode's CPU time grew from 4.1 to 9.0 ms per audio second).
So each gateway process gets its share of the host's cores, not the event loop's default pool (cores + 4).

The threads flush denormal floats to zero. libopus's float filters decay into denormals on silence (leading and
trailing silence, pauses), where each operation costs ~100 cycles: 10 s of silence took 11.5 ms of CPU per audio
second to encode against 1.1 ms with flushing (2-core CPU box; 20.9 ms unflushed on the H100 host, against
5.7 ms for speech). A flushed value is below 1.2e-38, far under the 3e-5 step of 16-bit audio.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import sys
from concurrent.futures import ThreadPoolExecutor

# Where glibc's fenv_t keeps the control register that flushes denormals, and its bits.
_FLUSH_BITS = {
    "x86_64": (28, 0x8040),  # MXCSR at byte 28: flush-to-zero (bit 15) and denormals-are-zero (bit 6)
    "aarch64": (0, 1 << 24),  # FPCR first: FZ (bit 24)
}
_FENV_BYTES = 64  # more than fenv_t on either (32 and 8 bytes)


def default_encoder_threads(num_processes: int) -> int:
    """Threads per gateway process when `num_processes` share this host: its cores divided among them, at least 2
    (one stream's encode never waits behind a single other one)."""
    return max(2, len(os.sched_getaffinity(0)) // max(1, num_processes))


def encoder_threads(num_threads: int) -> ThreadPoolExecutor:
    """A pool of `num_threads` threads that flush denormals to zero, for `StreamingEncoder` and whole-file encodes."""
    if num_threads < 1:
        raise ValueError(f"encoder threads: must be at least 1, got {num_threads}")
    return ThreadPoolExecutor(num_threads, thread_name_prefix="encoder", initializer=flush_denormals_to_zero)


def flush_denormals_to_zero() -> bool:
    """Makes the calling thread's float arithmetic flush denormals to zero; False where this platform is not
    supported (only the speed of silent audio depends on it)."""
    control = _control_register()
    if control is None:
        return False
    env, offset, value, bits = control
    env[offset : offset + 4] = (value | bits).to_bytes(4, "little")
    return _libm().fesetenv(env) == 0


def flushes_denormals() -> bool:
    """Whether the calling thread's float arithmetic flushes denormals to zero."""
    control = _control_register()
    if control is None:
        return False
    _, _, value, bits = control
    return value & bits == bits


def _control_register() -> tuple[ctypes.Array, int, int, int] | None:
    """The calling thread's floating-point environment, the offset of its control register in it, that register's
    value and its flush bits; None where this platform is not supported."""
    if sys.platform != "linux" or platform.machine() not in _FLUSH_BITS:
        return None
    env = ctypes.create_string_buffer(_FENV_BYTES)
    if _libm().fegetenv(env) != 0:
        return None
    offset, bits = _FLUSH_BITS[platform.machine()]
    return env, offset, int.from_bytes(env.raw[offset : offset + 4], "little"), bits


@functools.cache
def _libm() -> ctypes.CDLL:
    """Loaded once: `find_library` runs `ldconfig` in a subprocess."""
    return ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
