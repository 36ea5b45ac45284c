"""Happens-before race detection (pallas.plugins: vector clocks, access logs, reports)."""

import threading

import numpy as np
import pytest

from pallas.plugins import (
    Access,
    AccessLog,
    RaceDetector,
    RaceReport,
    VectorClocks,
    happens_before,
    region,
    regions_overlap,
)


def _access(clocks, thread, kind, reg, site="k.py:1"):
    return Access(thread, clocks.tick(thread), kind, reg, site, f"thread {thread}")


class TestVectorClocks:
    def test_program_order_is_happens_before(self):
        c = VectorClocks(2)
        a, b = c.tick(0), c.tick(0)
        assert happens_before(a, b) and not happens_before(b, a)

    def test_independent_threads_are_concurrent(self):
        c = VectorClocks(2)
        a, b = c.tick(0), c.tick(1)
        assert not happens_before(a, b) and not happens_before(b, a)

    def test_release_then_acquire_orders_the_events(self):
        c = VectorClocks(2)
        before_signal = c.tick(0)
        msg = c.release(0)
        c.acquire(1, msg)
        after_wait = c.tick(1)
        assert happens_before(before_signal, after_wait)

    def test_fork_orders_the_parent_before_the_child_only(self):
        c = VectorClocks(3)
        issued = c.tick(0)
        c.fork(0, 2)  # e.g. a DMA issued by core 0
        dma = c.tick(2)
        later = c.tick(0)
        assert happens_before(issued, dma)
        assert not happens_before(dma, later) and not happens_before(later, dma)

    def test_barrier_joins_every_participant(self):
        c = VectorClocks(3)
        a = c.tick(0)
        b = c.tick(1)
        c.barrier([0, 1, 2])
        after = c.tick(2)
        assert happens_before(a, after) and happens_before(b, after)

    def test_bad_sizes_and_threads_are_errors(self):
        with pytest.raises(ValueError, match="at least one entry"):
            VectorClocks(0)
        with pytest.raises(ValueError, match="thread 5 is out of range .* size 2"):
            VectorClocks(2).tick(5)


class TestRegions:
    def test_boxes(self):
        assert regions_overlap(region(slice(0, 8), slice(0, 128)), region((4, 12), (0, 1)))
        assert not regions_overlap(region(slice(0, 8)), region(slice(8, 16)))
        assert regions_overlap(region(3), region(slice(0, 4)))
        assert not regions_overlap(region(4), region(slice(0, 4)))

    def test_strides(self):
        evens, odds = region((0, 16, 2)), region((1, 16, 2))
        assert not regions_overlap(evens, odds)
        assert regions_overlap(evens, region((6, 7)))
        assert regions_overlap(region((0, 30, 3)), region((0, 30, 5)))  # 0 and 15

    def test_empty_ranges_never_overlap(self):
        assert not regions_overlap(region((5, 5)), region((0, 10)))


class TestAccessLog:
    def test_unordered_write_and_read_race_and_name_both_sites(self):
        c = VectorClocks(2)
        log = AccessLog("scratch[0]")
        assert log.record(_access(c, 0, "write", region((0, 8)), "a.py:3")) == []
        (race,) = log.record(_access(c, 1, "read", region((4, 6)), "a.py:9"))
        assert race.buffer == "scratch[0]"
        assert "a.py:3" in str(race) and "a.py:9" in str(race)
        assert race.first.kind == "write" and race.second.kind == "read"

    def test_reads_never_race_with_reads(self):
        c = VectorClocks(2)
        log = AccessLog("x")
        log.record(_access(c, 0, "read", region((0, 8))))
        assert log.record(_access(c, 1, "read", region((0, 8)))) == []

    def test_disjoint_regions_do_not_race(self):
        c = VectorClocks(2)
        log = AccessLog("x")
        log.record(_access(c, 0, "write", region((0, 8))))
        assert log.record(_access(c, 1, "write", region((8, 16)))) == []

    def test_synchronised_accesses_do_not_race(self):
        c = VectorClocks(2)
        log = AccessLog("x")
        log.record(_access(c, 0, "write", region((0, 8))))
        c.acquire(1, c.release(0))
        assert log.record(_access(c, 1, "write", region((0, 8)))) == []

    def test_every_racing_pair_is_reported(self):
        c = VectorClocks(3)
        log = AccessLog("x")
        log.record(_access(c, 0, "write", region((0, 4))))
        log.record(_access(c, 1, "write", region((4, 8))))
        races = log.record(_access(c, 2, "read", region((0, 8))))
        assert {r.first.thread for r in races} == {0, 1}

    def test_ordered_covered_accesses_are_pruned(self):
        c = VectorClocks(1)
        log = AccessLog("x")
        for _ in range(100):
            log.record(_access(c, 0, "write", region((0, 8))))
        assert len(log) == 1


class TestReportAndDetector:
    def test_report_collects_and_resets(self):
        report = RaceReport()
        det = RaceDetector(report)
        c = VectorClocks(2)
        det.record("buf", _access(c, 0, "write", region((0, 1))), name="o_ref")
        det.record("buf", _access(c, 1, "write", region((0, 1))))
        assert report.races_found and len(report) == 1
        assert "o_ref" in str(report)
        report.reset()
        assert not report.races_found and str(report) == "no data races found"

    def test_on_race_callback_and_forget(self):
        seen = []
        det = RaceDetector(on_race=seen.append)
        c = VectorClocks(2)
        det.record("b", _access(c, 0, "write", region((0, 1))))
        det.forget("b")  # deallocated: a new buffer with the same key starts clean
        det.record("b", _access(c, 1, "write", region((0, 1))))
        assert seen == [] and not det.report.races_found
        det.record("b", _access(c, 0, "read", region((0, 1))))
        assert len(seen) == 1

    def test_threads_may_record_concurrently(self):
        det = RaceDetector()
        c = VectorClocks(8)

        def work(t):
            for i in range(50):
                det.record("b", _access(c, t, "write", region((8 * t + i % 8, 8 * t + i % 8 + 1))))

        ts = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not det.report.races_found  # each thread wrote its own slice

    def test_clock_arrays_are_copies(self):
        c = VectorClocks(2)
        a = c.tick(0)
        a[:] = 99
        assert np.all(c.get(0) <= 1)
