"""A thread's reads and writes of a ref view in GPU interpret mode: resolved to the copy
it names (another device's through ``plgpu.remote_ref``, another block's through
``plgpu.cluster_ref``), bounds-checked, and logged for the race detector. Helpers of the
rule modules (``rules_*``), which import them and never each other.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.interpret.devices import resolve
from pallas_mosaic_gpu._src.interpret.memory import (
    Buffer,
    access_region,
    describe_region,
    fill_value,
    get_view,
    set_view,
)


def _region(th, buf: Buffer, flat, tree, kind: str):
    region, ok = access_region(buf.shape, flat, tree)
    if not ok and (kind == "write" or th.launch.params.out_of_bounds_reads == "raise"):
        raise IndexError(
            f"GPU interpret mode: out-of-bounds {kind} of {buf.name} (shape {buf.shape}) at "
            f"{describe_region(region)} by {th.name}, at {th.site}")
    return region, ok



def read(th, buf: Buffer, flat, tree):
    """The value a ref view reads (logged; bounds-checked; another device's memory
    through a ``plgpu.remote_ref`` view)."""
    buf, flat, tree = resolve(th, buf, flat, tree, "a read")
    region, ok = _region(th, buf, flat, tree, "read")
    th.access(buf, "read", region)
    value = jc.get_view(buf.value, flat, tree) if not ok else get_view(buf, flat, tree)
    if not ok:  # out_of_bounds_reads="uninitialized": the fill value, not clamped data
        value = jnp.full(value.shape, fill_value(value.dtype,
                                                 th.launch.params.uninitialized_memory))
    return value



def write(th, buf: Buffer, flat, tree, value) -> None:
    buf, flat, tree = resolve(th, buf, flat, tree, "a write")
    region, _ = _region(th, buf, flat, tree, "write")
    th.access(buf, "write", region)
    buf.value = set_view(buf, value, flat, tree)
