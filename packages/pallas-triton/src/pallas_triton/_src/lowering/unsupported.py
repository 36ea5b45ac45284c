"""Primitives pallas-triton does not lower, each with what to do instead (quoted in the
"not supported" error). Every primitive of ``pallas.plugins.PRIMITIVES`` has a rule or
an entry here (tested)."""

from __future__ import annotations

from jax import lax

from pallas import plugins
from pallas_triton._src.lowering.engine import RULES

_SEMAPHORES = "semaphores need the Mosaic backends (pallas-tpu, pallas-mosaic-gpu)"

RULES.unsupported(lax.gather_p, reason="index with pl.ds or load whole blocks")
RULES.unsupported(lax.scatter_p, reason="write with pl.ds or masked pl.store")
RULES.unsupported(lax.scatter_add_p,
                  reason="use pallas.atomics.atomic_add (pltriton.atomic_add)")
RULES.unsupported(lax.sort_p, reason="sort outside the kernel")
RULES.unsupported(lax.pad_p, reason="use a larger BlockSpec; edge blocks are masked")
RULES.unsupported(lax.dynamic_slice_p, reason="load the slice from a ref with pl.ds")
RULES.unsupported(lax.dynamic_update_slice_p, reason="store into a ref with pl.ds")
RULES.unsupported(plugins.semaphore_signal_p, plugins.semaphore_wait_p,
                  plugins.semaphore_read_p, plugins.get_global_p, reason=_SEMAPHORES)
RULES.unsupported(lax.cumprod_p, reason="use a fori_loop over the axis, or jnp.cumsum of "
                                        "logarithms")
RULES.unsupported(lax.cummax_p, lax.cummin_p, reason="use a fori_loop over the axis")
RULES.unsupported(plugins.core_map_p,
                  reason="pl.core_map/pl.kernel over a core mesh needs a Mosaic backend; "
                         "use pallas_call with a grid")
RULES.unsupported(plugins.axis_index_p,
                  reason="use pl.program_id for grid axes; kernels under shard_map take "
                         "their device index as an input")
