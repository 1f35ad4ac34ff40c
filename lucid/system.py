"""Process-wide settings that make the CPU update faster without touching its maths.

glibc's malloc hands every block above a moving threshold (128 KB at start) to `mmap` and
gives it back with `munmap` when it is freed. An update allocates and frees hundreds of such
blocks (activations of 4,096 imagined states, 255-bin logits), so every update pays the
kernel for fresh zeroed pages on first touch: about 15% of a `mini` update on this CPU
(docs/performance.md). `tune_malloc` keeps blocks up to 32 MB in malloc's own heap, where
freed memory is reused, and returns free heap memory to the OS only above 256 MB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt(3) parameters.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 256 << 20

_tuned = False


def tune_malloc() -> bool:
    """Apply the malloc thresholds above (once per process). Returns whether they are in
    effect: False where the C library is not glibc (macOS, musl), which keeps its own."""
    global _tuned
    if _tuned:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _tuned
