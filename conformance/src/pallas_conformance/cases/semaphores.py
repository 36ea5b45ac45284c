"""Semaphores: semaphore_signal / semaphore_wait / semaphore_read on semaphore scratch.

Scratch semaphores use the core's backend-neutral ``SemaphoreSpace.REGULAR(shape)``
(backends export their own aliases, e.g. ``pltpu.SemaphoreType.REGULAR``).
"""

from __future__ import annotations

import jax.numpy as jnp

import pallas as pl
from pallas.plugins import SemaphoreSpace
from pallas_conformance.registry import case, randn, sds

C = 128


@case("semaphores/signal_wait_read", tags={"semaphores", "scratch"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: x + 1.0)
def signal_wait_read(pallas_call, x):
    """Signal by 3, wait for 2, read the remaining count (1)."""
    def kernel(x_ref, o_ref, sem):
        pl.semaphore_signal(sem, 3)
        pl.semaphore_wait(sem, 2)
        o_ref[...] = x_ref[...] + pl.semaphore_read(sem).astype(jnp.float32)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       scratch_shapes=[SemaphoreSpace.REGULAR(())])(x)


@case("semaphores/array_of_semaphores", tags={"semaphores", "scratch", "indexing"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: x * 0 + jnp.arange(1, 5, dtype=jnp.int32).sum().astype(jnp.float32))
def array_of(pallas_call, x):
    """A (4,) array of semaphores indexed with sem.at[k]."""
    def kernel(x_ref, o_ref, sems):
        for k in range(4):
            pl.semaphore_signal(sems.at[k], k + 1)
        total = jnp.int32(0)
        for k in range(4):
            total += pl.semaphore_read(sems.at[k])
        for k in range(4):
            pl.semaphore_wait(sems.at[k], k + 1)
        o_ref[...] = x_ref[...] * 0 + total.astype(jnp.float32)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       scratch_shapes=[SemaphoreSpace.REGULAR((4,))])(x)


@case("semaphores/count_across_grid",
      tags={"semaphores", "scratch", "sequential_grid", "carry_across_blocks"},
      inputs=lambda rng: (randn(rng, (32, C)),),
      reference=lambda x: x + jnp.repeat(jnp.arange(1, 5, dtype=jnp.float32), 8)[:, None])
def count_across(pallas_call, x):
    """A semaphore signalled once per program keeps its count across grid steps."""
    def kernel(x_ref, o_ref, sem):
        pl.semaphore_signal(sem, 1)
        o_ref[...] = x_ref[...] + pl.semaphore_read(sem).astype(jnp.float32)

        @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
        def _():
            pl.semaphore_wait(sem, 4)

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,), in_specs=[spec],
                       out_specs=spec, scratch_shapes=[SemaphoreSpace.REGULAR(())])(x)


@case("semaphores/wait_without_decrement", tags={"semaphores", "scratch"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: x + 2.0)
def wait_no_decrement(pallas_call, x):
    """semaphore_wait(decrement=False) leaves the count unchanged."""
    def kernel(x_ref, o_ref, sem):
        pl.semaphore_signal(sem, 2)
        pl.semaphore_wait(sem, 2, decrement=False)
        o_ref[...] = x_ref[...] + pl.semaphore_read(sem).astype(jnp.float32)
        pl.semaphore_wait(sem, 2)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       scratch_shapes=[SemaphoreSpace.REGULAR(())])(x)
