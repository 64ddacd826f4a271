"""Memory a large request used, given back to the system once it is answered.

Python frees a large request's objects at once, but glibc's allocator keeps the freed heap pages for reuse: after a
31 MB prompt was truncated the guard kept ~200 MB of them for good. `malloc_trim(0)` hands the free pages back; it
walks the heap (milliseconds), so it runs in a worker thread, and only after requests whose body was large. On a C
library without it (musl, macOS) nothing happens.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

LARGE_BODY_BYTES = 2**20  # after requests with bodies from this size


def _trimmer() -> Callable[[], None] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


_TRIM = _trimmer()


def give_back_after(body_bytes: int) -> None:
    """After a request with a body of `body_bytes`: return free heap pages to the system (in a worker thread)."""
    if _TRIM is not None and body_bytes >= LARGE_BODY_BYTES:
        asyncio.get_running_loop().run_in_executor(None, _TRIM)
