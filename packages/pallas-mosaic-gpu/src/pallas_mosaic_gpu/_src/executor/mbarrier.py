"""mbarriers (the state the async-copy, cluster and tensor core ops share): a phase
completes when every expected arrival has happened and its transaction count is zero."""

from __future__ import annotations

from pallas_mosaic_gpu._src.executor.types import EmulationError


def mbarrier_state(m, addr: int) -> dict:
    """The state of the mbarrier at ``addr`` (an error before its init)."""
    return state(m, addr)


def state(m, addr: int) -> dict:
    st = m.mbarriers.get(addr)
    if st is None:
        raise EmulationError(f"mbarrier at {addr:#x} used before nvvm.mbarrier.init")
    return st


def _maybe_complete(st):
    if st["pending"] == 0 and st["tx"] == 0:
        st["phase"] += 1
        st["pending"] = st["count"]


def complete_tx(m, addr: int, nbytes: int):
    st = state(m, addr)
    st["tx"] -= nbytes
    _maybe_complete(st)


def arrive_state(st, tx=0):
    st["tx"] += tx
    st["pending"] -= 1
    if st["pending"] < 0:
        raise EmulationError("more arrivals on an mbarrier than its arrival count")
    _maybe_complete(st)


def arrive(m, addr: int, count: int = 1) -> None:
    """``count`` arrivals on the mbarrier at ``addr``."""
    st = state(m, addr)
    for _ in range(count):
        arrive_state(st)
