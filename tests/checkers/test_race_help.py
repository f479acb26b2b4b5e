"""A race finding says what orders its two accesses on a TPU (issue 36, item 2)."""

from __future__ import annotations

from pallas_check.checkers.race_help import race_help
from pallas_check.findings.finding import Access, SourceFrame

FRAME = (SourceFrame("k.py", 46, "kernel", "y = buf[slot] * 2.0"),)
START = (SourceFrame("k.py", 39, "kernel", "copy.start()"),)


def access(operation: str, actor: str, frames=FRAME) -> Access:
    return Access(operation, actor, "buf", "VMEM", ((0, 8), (0, 128)), frames, (0,))


DMA = "DMA #3 started by core 0 at k.py:39"


def test_a_read_before_the_dma_landed_names_the_wait_and_the_read():
    text = race_help(access("DMA write", DMA, START), access("read", "core 0"))
    assert text == ("wait for DMA #3 (`.wait()` on its descriptor) before the read of buf at"
                    " line 46, or read the other slot (a buffer no DMA in flight is filling)")
    # either order of the two accesses, and an atomic DMA add writes too
    assert race_help(access("read", "core 0"), access("DMA add", DMA, START)) == text


def test_a_write_of_a_dma_source_names_the_wait_before_it():
    text = race_help(access("write", "core 0"), access("DMA read", DMA, START))
    assert text is not None and text.startswith("DMA #3 still reads buf: wait for it")
    assert "before the write of buf at line 46" in text


def test_two_dmas_and_two_cores_name_what_orders_them():
    both = race_help(access("DMA write", DMA), access("DMA write", "DMA #4 started by core 0"))
    assert both is not None and both.startswith("DMA #3 and DMA #4 are in flight on buf")
    cores = race_help(access("write", "core 1"), access("read", "core 0"))
    assert cores == ("order core 1's write (line 46) and core 0's read (line 46) of buf: a"
                     " semaphore signal and wait, or a barrier, between them")


def test_a_pipeline_copy_gets_no_guess():
    assert race_help(access("write", "core 0"),
                     access("DMA read", "pipeline copy-in of x_ref block (1, 0)")) is None
