"""The C heap of this process (glibc): give freed memory back to the OS.

PyTorch on CPU allocates tensors with malloc. glibc serves anything under its mmap threshold
from heap arenas and raises that threshold (up to 32 MB) each time a larger block is freed, so
the many 1-30 MB temporaries of a training step end up in arenas that fragment and never
shrink: DPO on SmolLM2 kept ~0.9 GB more resident than it used (benchmarks/bench_train_memory.py).
Training therefore maps every large block (`map_large_blocks`). Generation is the other way
round: a decode step allocates and frees the same KV and logits blocks again and again, and
with each mapped it pays for fresh zeroed pages every step, so after training the heap serves
them again (`serve_from_heap`; benchmarks/bench_heap.py). Elsewhere than glibc these are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024  # glibc's default, kept fixed
# glibc's highest dynamic threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): where the default
# threshold ends up once a process has freed blocks that large.
HEAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 2 * HEAP_THRESHOLD  # what the dynamic rule pairs with it


@cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - present only in glibc
    except (OSError, AttributeError):
        return None
    return libc


def trim() -> None:
    """Return the heap's free pages to the OS."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def map_large_blocks() -> None:
    """Serve every block over 128 KiB with its own mapping from now on (a fixed mmap threshold),
    so freeing a tensor gives its memory back at once."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def serve_from_heap() -> None:
    """Undo `map_large_blocks` as far as glibc allows: blocks up to 32 MiB come from the heap
    arenas again and are reused (a fixed threshold at the top of the dynamic range; once a
    threshold is set, glibc never adjusts it again), and the heap's top is kept up to 64 MiB
    instead of being handed back after every freed block (glibc's dynamic rule raises the trim
    threshold with the mmap threshold; a fixed one leaves it at 128 KiB). Free pages are
    trimmed first."""
    trim()
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, HEAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
