"""glibc malloc thresholds for the processes that pass multi-megabyte buffers: the diffusion service and the gateway.

10 s of stereo float32 audio is 3.5 MB, and on its way out of the diffusion service it is copied four times (bytes,
protobuf field, serialized message, gRPC slice), then again into the gateway. glibc's default, dynamic thresholds
serve a block that large from the heap once one has been freed, but give the heap's top back to the system as soon
as more than two such blocks lie free there, as the copies of one clip do once it is sent: every clip's copies then
fault their pages in afresh, 3576 page faults in the service and 800-2500 in the gateway, half the time between the end
of decode and the gateway's Final on loopback (14 → 7 ms on a 2-core CPU). With the thresholds below the pages stay
mapped, for ~15 MB more resident memory per process.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
# The ceiling of glibc's own dynamic thresholds on 64-bit: blocks under 32 MiB (a 16 MiB message, a whole 47.55 s
# window of 16.8 MB) come from the heap, and up to twice that may stay free there before it is given back.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES


def keep_large_buffers_mapped() -> bool:
    """Sets the thresholds above for this process; False where they cannot be set (no glibc)."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        log.debug("no glibc mallopt: large buffers keep the libc's default allocation")
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
