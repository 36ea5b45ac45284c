"""Planted races: kernels with a data race that an interpret mode must report, each with
a race-free twin that it must not.

They run for every backend that claims ``semaphores`` and offers DMAs through a race kit
(``backend.race_kit()``: memory spaces, DMA descriptors, the interpret-mode params and
its race report; pallas-tpu's is ``pallas_tpu``'s ``TpuRaceKit``). A case is
``build(kit, racy) -> (fn, args)``; the runner calls ``fn(*args)`` and reads
``kit.races_found()``.

    from pallas_conformance.races import RACE_CASES, race_backends, run_race_case
    for backend in race_backends():
        for case in RACE_CASES:
            assert run_race_case(case, backend, racy=True)       # reported
            assert not run_race_case(case, backend, racy=False)  # not reported
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import pallas as pl
from pallas.plugins import list_backends

C = 128


@dataclasses.dataclass(frozen=True)
class RaceCase:
    """One planted race: ``build(kit, racy)`` returns ``(fn, args, expected)``."""

    name: str
    build: Callable
    description: str


def _missing_dma_wait(kit, racy):
    """A kernel reads a DMA's destination before waiting for the DMA (racy) or after."""
    def kernel(x_hbm, o_ref, buf, sem):
        copy = kit.async_copy(x_hbm, buf, sem)
        copy.start()
        if not racy:
            copy.wait()
        o_ref[...] = buf[...]
        if racy:
            copy.wait()

    x = jnp.arange(8 * C, dtype=jnp.float32).reshape(8, C)
    fn = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=kit.any_space)],
        scratch_shapes=[kit.vmem(x.shape, x.dtype), kit.dma_semaphore()],
        interpret=kit.interpret())
    return fn, (x,), None if racy else x


def _two_cores_one_block(kit, racy):
    """Two cores each run one point of a parallel grid; both write output block 0
    (racy), or each its own block."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    x = jnp.arange(16 * C, dtype=jnp.float32).reshape(16, C)
    out_map = (lambda i: (0, 0)) if racy else (lambda i: (i, 0))
    fn = pl.pallas_call(
        kernel, grid=(2,), out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec((8, C), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, C), out_map),
        compiler_params=kit.parallel(1),
        interpret=kit.interpret(num_cores=2))
    return fn, (x,), None if racy else x * 2.0


def _remote_copy_without_semaphore(kit, racy):
    """A device copies its input into the output of the next device (itself on a one-
    device machine) and reads that output; racy: it reads it without waiting for the
    incoming copy's receive semaphore."""
    n = jax.device_count()

    def kernel(x_hbm, o_hbm, buf, send, recv):
        me = jax.lax.axis_index("d")
        copy = kit.remote_copy(x_hbm, o_hbm, send, recv, device_id=(me + 1) % n)
        copy.start()
        copy.wait_send()
        if not racy:
            copy.wait_recv()
        local = kit.async_copy(o_hbm, buf, send)  # read what arrived
        local.start()
        local.wait()
        if racy:
            copy.wait_recv()

    mesh = jax.make_mesh((n,), ("d",))
    x = jnp.arange(8 * n * C, dtype=jnp.float32).reshape(8 * n, C)
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, C), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=kit.any_space)],
        out_specs=pl.BlockSpec(memory_space=kit.any_space),
        scratch_shapes=[kit.vmem((8, C), jnp.float32), kit.dma_semaphore(),
                        kit.dma_semaphore()],
        interpret=kit.interpret())
    spec = jax.sharding.PartitionSpec("d")
    x = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
    fn = jax.jit(jax.shard_map(call, mesh=mesh, in_specs=spec, out_specs=spec,
                               check_vma=False))
    # Device d's block lands on device d + 1 (computed on the host: x is sharded).
    expected = None if racy else np.roll(np.asarray(x).reshape(n, 8, C), 1, axis=0).reshape(
        8 * n, C)
    return fn, (x,), expected


RACE_CASES = (
    RaceCase("races/missing_dma_wait", _missing_dma_wait,
             "reading a DMA's destination before its wait"),
    RaceCase("races/two_cores_one_block", _two_cores_one_block,
             "two cores of a parallel grid writing one output block"),
    RaceCase("races/remote_copy_without_semaphore", _remote_copy_without_semaphore,
             "reading a remote copy's destination without waiting on its semaphore"),
)


def race_backends() -> list:
    """The installed backends that claim ``semaphores`` and offer a race kit."""
    return [b for b in list_backends()
            if "semaphores" in b.capabilities and b.race_kit() is not None]


def run_race_case(case: RaceCase, backend, *, racy: bool) -> bool:
    """Runs ``case`` (its racy or race-free version) on ``backend``'s interpret mode;
    returns whether a race was reported. The race-free version's output is checked."""
    kit = backend.race_kit()
    fn, args, expected = case.build(kit, racy)
    out = jax.block_until_ready(fn(*args))
    if expected is not None:
        np.testing.assert_allclose(np.asarray(out), np.asarray(expected))
    return bool(kit.races_found())
