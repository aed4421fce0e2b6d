"""The C-heap settings around CPU training (dataengine.heap, train.base.training_heap).

Each check runs in a child process: a glibc mmap threshold, once set, stays for the process,
and the test process must keep its own. glibc's `mallinfo2().hblks` counts the blocks served by
their own mapping, which tells where a 1 MiB malloc came from.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import ctypes, ctypes.util

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]

    def mapped(size=1 << 20):
        before = libc.mallinfo2().hblks
        block = libc.malloc(size)
        after = libc.mallinfo2().hblks
        libc.free(block)
        return after > before
    """
)


def run_child(body: str) -> list[str]:
    code = PROBE + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return out.stdout.split()


def glibc_with_mallinfo2() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2  # noqa: B018
    except (OSError, AttributeError):
        return False
    return True


pytestmark = pytest.mark.skipif(not glibc_with_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")


def test_map_large_blocks_then_serve_from_heap_moves_a_1_mib_block_back_to_the_arena():
    out = run_child(
        """
        from dataengine import heap
        heap.map_large_blocks()
        print(mapped(), mapped())
        heap.serve_from_heap()
        print(mapped(), mapped(), mapped(40 << 20))
        """
    )
    # mapped every time while training's setting holds; from the heap after it, up to 32 MiB
    assert out == ["True", "True", "False", "False", "True"]


def test_a_cpu_trainer_leaves_the_heap_serving_large_blocks_even_when_it_raises():
    out = run_child(
        """
        from dataengine import heap
        from dataengine.config import SFTTrainConfig
        from dataengine.train.base import training_heap

        @training_heap
        def trainer(config):
            heap.map_large_blocks()  # what load_for_training does on CPU
            print(mapped())
            raise RuntimeError("training failed")

        try:
            trainer(SFTTrainConfig(init="m", out_dir="o", device="cpu"))
        except RuntimeError:
            print(mapped())
        """
    )
    assert out == ["True", "False"]
