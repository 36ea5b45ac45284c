"""The emulate level runs the warps of a warpgroup on their own where they wait for each
other (``pl.core_map(plgpu.WarpMesh(...))`` producer/consumer code: one warp issues TMA
copies or MMAs, another waits on the mbarrier the first arrives on): such a kernel runs
again with a strand per warp for that warpgroup instead of failing as lockstep lanes
would, and a wait no warp can satisfy is still reported as a deadlock naming the
warps. (The Blackwell matmul by a TMA warp and an MMA warp is in
``test_lowering_tcgen05.py``, beside the kernel.)"""

from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.executor import EmulationError, EmulationUnsupported, sched

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")
levels = pytest.importorskip("pallas_conformance.levels")
catalogue = pytest.importorskip("pallas_conformance.catalogue")

F32 = jnp.float32


def test_a_producer_warp_and_a_consumer_warp_relay_tiles_through_smem():
    # The catalogue's case: warp 0 loads row tiles into two SMEM slots with TMA once warp
    # 1 has freed them; warp 1 waits for each load, stores the slot and frees it.
    backend = pallas.plugins.get_backend("mosaic_gpu")
    case = catalogue.get_case("gpu/warps_wait_for_each_other")
    r = levels.CaseRunner(backend).run(case, "emulate")
    assert r.status == "pass", r.detail


def test_a_warp_waiting_for_an_arrival_no_warp_makes_is_a_deadlock_naming_the_warps(emulate):
    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((128,), F32),
                       scratch_types=dict(bar=plgpu.Barrier(), other=plgpu.Barrier()))
    def kernel(o_gmem, bar, other):
        @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
        def _():
            warp = jax.lax.axis_index("warp")

            @pl.when(warp == 0)
            def _():
                plgpu.barrier_wait(bar)

            @pl.when(warp == 1)
            def _():
                plgpu.barrier_arrive(other)

    with pytest.raises(EmulationError, match=r"deadlock: .*warp 0 \(of warpgroup 0\) waits: "
                                             r"phase parity 0 of the mbarrier"):
        emulate(kernel)


@pytest.mark.parametrize("is_warp", [False, True], ids=["warpgroup", "warp"])
def test_a_wait_for_parked_lanes_splits_a_warpgroup_but_not_a_warp(is_warp):
    # Lanes 32-127 parked (mask off) while lanes 0-31 wait for something only they could
    # do: a warpgroup strand asks for warp strands (DivergentWait naming warpgroup 1); a
    # warp strand cannot be split further (unsupported, never a wrong result).
    m = types.SimpleNamespace(mask=np.arange(128) < 32, warpgroup=1, is_warp=is_warp)
    block = sched.Block([m], ["warp 4 (of warpgroup 1)" if is_warp else "warpgroup 1"])
    with pytest.raises(EmulationUnsupported, match="parked at a reconvergence point") as e:
        block.wait_until(m, lambda: False, lambda: "an mbarrier phase")
    assert isinstance(e.value, sched.DivergentWait) != is_warp
    if not is_warp:
        assert e.value.warpgroups == {1}
