"""glibc's malloc told to keep freed memory for the next allocation (`lockstep check`, pytest).

The CPU reference makes many temporaries of megabytes (matmul products, gathered expert weights,
vocabulary-wide rows). glibc serves a block above its mmap threshold with a fresh mapping and
hands it back on free, and trims the top of its heap above the trim threshold, so the next
temporary of that size faults in every 4 KB page again: on the development VM
`generate/long-prompt-window` took 911,000 minor faults and 2.9 s of system time for 21 s of
user time. With these thresholds a freed block stays in the heap and is reused: 108,000 faults,
0.6 s of system time. Where memory lives never changes what
is computed, so no bit depends on this. Where the C library has no mallopt (macOS) it does nothing.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3      # glibc's malloc.h
MMAP_THRESHOLD = 64 << 20          # blocks below this come from the heap (glibc: 128 KB, rising to 32 MB)
TRIM_THRESHOLD = 256 << 20         # free memory kept at the top of the heap before it is returned
TOP_PAD = 64 << 20                 # extra heap asked for at each growth


def keep_freed_memory() -> bool:
    """Set the thresholds above in this process; False where the C library has no mallopt."""
    try:
        mallopt = ctypes.CDLL(None).mallopt          # this process's own C library
    except (OSError, AttributeError, TypeError):     # no C library to ask (Windows: CDLL(None))
        return False
    return all(mallopt(option, value) == 1 for option, value in (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
