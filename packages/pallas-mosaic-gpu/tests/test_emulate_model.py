"""The executor's machine model: flat memory, TMA boxes and swizzling, mbarrier phases."""

from __future__ import annotations

import numpy as np
import pytest

from pallas_mosaic_gpu._src.executor import EmulationError
from pallas_mosaic_gpu._src.executor import mbarrier as MB
from pallas_mosaic_gpu._src.executor import tma as TMA
from pallas_mosaic_gpu._src.executor.engine import Compiler, Machine
from pallas_mosaic_gpu._src.executor.memory import Memory
from pallas_mosaic_gpu._src.executor.types import llvm_layout


def test_memory_reads_back_what_was_stored_per_lane():
    mem = Memory()
    base = mem.put(np.arange(8, dtype=np.float32), "x")
    got = mem.gather(base + 4 * np.arange(4)[:, None] * 2, np.float32)
    np.testing.assert_array_equal(got[:, 0], [0, 2, 4, 6])
    mem.scatter(base + 4 * np.arange(2), np.asarray([10, 11], np.float32))
    np.testing.assert_array_equal(mem.read(base, (8,), np.float32)[:3], [10, 11, 2])


def test_masked_off_lanes_neither_read_nor_write():
    mem = Memory()
    base = mem.put(np.zeros(2, np.int32), "x")
    mask = np.asarray([True, False])
    mem.scatter(np.asarray([base, 1 << 40]), np.asarray([7, 8], np.int32), mask)
    got = mem.gather(np.asarray([base, 1 << 40]), np.int32, mask)
    np.testing.assert_array_equal(got, [7, 0])


def test_an_access_past_a_region_is_an_error_not_a_neighbours_data():
    mem = Memory()
    a = mem.put(np.zeros(4, np.float32), "a")
    mem.put(np.ones(4, np.float32), "b")
    with pytest.raises(EmulationError, match="outside a"):
        mem.gather(np.asarray([a + 12]), np.float64)
    with pytest.raises(EmulationError, match="unmapped"):
        mem.gather(np.asarray([a + 4096]), np.float32)


def test_llvm_struct_layout_aligns_fields():
    size, align, kind, fields = llvm_layout("!llvm.struct<(ptr, i32, i64, array<2 x i64>)>")
    assert kind == "struct"
    assert [off for off, _ in fields] == [0, 8, 16, 24]
    assert (size, align) == (40, 8)


def _machine():
    mem = Memory()
    return Machine(mem, Compiler.__new__(Compiler))


def test_a_tma_box_is_clipped_at_the_tensor_edge_and_laid_out_row_major():
    desc = dict(base=1000, esize=4, sizes=[5, 8], strides=[8, 1], swizzle=16, window=[2, 4])
    gaddr, inside, soff, es = TMA.box(desc, [6, 4])  # coords innermost first: col 6, row 4
    assert inside.tolist() == [True, True, False, False, False, False, False, False]
    assert gaddr[0] == 1000 + (4 * 8 + 6) * 4
    assert soff.tolist() == [0, 4, 8, 12, 16, 20, 24, 28]


def test_tma_128_byte_swizzle_permutes_16_byte_chunks_by_row():
    offs = np.arange(0, 1024, 16)
    sw = TMA._swizzle(offs, 128)
    assert sw[:8].tolist() == offs[:8].tolist()  # row 0 unchanged
    assert sw[8] == 128 + 16  # row 1: chunk 0 goes to chunk 1
    assert sorted(sw.tolist()) == offs.tolist()


def test_an_mbarrier_phase_completes_after_arrivals_and_transaction_bytes():
    m = _machine()
    m.mbarriers[64] = dict(count=1, pending=1, tx=0, phase=0)
    MB.arrive_state(m.mbarriers[64], tx=4096)
    assert m.mbarriers[64]["phase"] == 0  # the bytes have not landed
    MB.complete_tx(m, 64, 4096)
    assert m.mbarriers[64]["phase"] == 1
    assert m.mbarriers[64]["pending"] == 1  # re-armed for the next phase


def test_an_mbarrier_used_before_init_is_an_error():
    with pytest.raises(EmulationError, match="before nvvm.mbarrier.init"):
        MB.complete_tx(_machine(), 64, 16)
