"""Freed host memory stays in the process (glibc malloc), so a CPU step does not page-fault its
activations in anew every time.

PyTorch's CPU allocator is plain ``malloc``. glibc serves blocks above its mmap threshold (128 KiB,
rising to at most 32 MiB) with a fresh ``mmap`` and returns them to the kernel on ``free``, and
trims the heap's top whenever more than 128 KiB are free there. A forward pass allocates and frees
the same activation sizes again and again, so every one of them is a new mapping whose every 4 KiB
page faults on first touch, which can cost a third of a CPU prefill's time (docs/model.md "Host
memory" has the measurement). A GPU run is spared this by the CUDA caching
allocator; this is the host's equivalent, set the way the glibc manual offers:
``M_MMAP_MAX = 0`` (no block gets its own mapping) and a trim threshold of 2 GiB (freed memory
stays in the heap for the next step). The cost: the process keeps its peak heap.

``keep_freed_memory()`` sets both in this process (``mallopt``); ``freed_memory_env()`` gives the
environment variables that set them in a child at its start (glibc reads them before ``main``). A
user's own ``MALLOC_MMAP_MAX_`` / ``MALLOC_TRIM_THRESHOLD_`` win; ``MESHRL_KEEP_FREED_MEMORY=0`` turns it off.
Outside glibc (macOS, musl, a preloaded jemalloc or tcmalloc) it changes nothing that matters.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h>
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: the largest, 2 GiB
ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}
OPT_OUT = "MESHRL_KEEP_FREED_MEMORY"


def _glibc() -> ctypes.CDLL | None:
    """This process's C library when it is glibc (it has ``mallopt``), else None."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ctypes.CDLL(None).gnu_get_libc_version  # noqa: B018  (glibc only)
        return lib if hasattr(lib, "mallopt") else None
    except (OSError, AttributeError):
        return None


def freed_memory_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The glibc variables a process of this run starts with: the user's where set (``env``, default
    this process's), else ours; {} when opted out."""
    env = os.environ if env is None else env
    if env.get(OPT_OUT, "1") == "0":
        return {}
    return {k: env.get(k, v) for k, v in ENV.items()}


def keep_freed_memory() -> None:
    """Apply ``freed_memory_env()`` to this process now, with ``mallopt`` (glibc read the variables
    only when the process started, perhaps before they were set)."""
    want = freed_memory_env()
    lib = _glibc() if want else None
    if lib is None:
        return
    try:
        mmap_max, trim = int(want["MALLOC_MMAP_MAX_"]), int(want["MALLOC_TRIM_THRESHOLD_"])
    except ValueError:  # the user's odd value: glibc ignored it at start; so do we
        return
    lib.mallopt(M_MMAP_MAX, min(mmap_max, 2**31 - 1))
    lib.mallopt(M_TRIM_THRESHOLD, min(trim, TRIM_THRESHOLD))


def physical_bytes() -> int:
    """This machine's RAM (what a CPU rank's memory is priced against: its share of it)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
