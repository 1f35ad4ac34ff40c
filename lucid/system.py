"""Process-wide settings that make the CPU update faster without touching its maths.

glibc's malloc hands every block above a moving threshold (128 KB at start, 32 MB at most)
to `mmap` and gives it back with `munmap` when it is freed. An update allocates and frees
hundreds of such blocks (activations of 4,096 imagined states, 255-bin logits, the feature
maps of 1,024 images), so every update pays the kernel for fresh zeroed pages on first touch,
a share of the update that grows with the model (docs/performance.md has the measured share).
`tune_malloc` turns `mmap` off for malloc, so every block lives in malloc's own heap where
freed memory is reused, and returns free memory at the top of the heap to the OS only above
1 GB. The cost: the process keeps the memory of its largest update (a higher peak RSS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt(3) parameters.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
MMAP_MAX = 0  # no block is served by mmap, however large
TRIM_THRESHOLD = 1 << 30

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
    _tuned = bool(mallopt(_M_MMAP_MAX, MMAP_MAX)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _tuned
