"""Facts of this host, other than files, that resolving and planning a build read.

Today one: the host's RAM (the cpu-reference target's memory plan is against it). The resolution memo
(trtpipe.warm) records `facts()` and a warm build compares it, so every fact a plan reads must come
from here: a host whose RAM changed plans again.
"""

from __future__ import annotations

import os

GIB = 2**30
FALLBACK_MEMORY_BYTES = 16 * GIB  # where the OS does not say


def memory_bytes() -> int:
    """This host's physical memory in bytes."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return FALLBACK_MEMORY_BYTES


def facts() -> dict[str, int]:
    """Every host fact a plan reads, by name."""
    return {"memory_bytes": memory_bytes()}
