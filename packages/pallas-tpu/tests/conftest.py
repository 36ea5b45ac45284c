"""Shared fixtures of pallas-tpu's tests (CPU only: lowering for TPU needs no TPU)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu

jax.config.update("jax_platforms", "cpu")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def lower_tpu():
    """``lower_tpu(f, *args)`` -> (lowered, [Mosaic modules]) for TPU, on this CPU machine."""
    from pallas_tpu.inspect import mosaic_modules

    def lower(f, *args):
        lowered = jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",))
        return lowered, mosaic_modules(lowered)

    return lower


@pytest.fixture
def ops():
    """``ops(module)`` -> the multiset (list) of operation names in a Mosaic module."""
    from pallas_tpu.inspect import op_names

    return op_names


@pytest.fixture
def export_tpu():
    """``export_tpu(f, *args)``: ``jax.export`` for TPU, serialised (flatbuffers comes with
    pallas-core); returns the Exported."""

    def export(f, *args):
        exported = jax.export.export(jax.jit(f), platforms=["tpu"])(*args)
        assert len(exported.serialize()) > 0
        return exported

    return export


def _copy_start(x_ref, _aliased_x, o_ref, sem):
    pltpu.make_async_copy(x_ref, o_ref, sem).start()


def _copy_done(x_ref, o_ref, sem, _aliased_o):
    pltpu.make_async_copy(x_ref, o_ref, sem).wait()


def _async_copy_across_calls(x):
    """A copy started by one pallas_call and waited for by the next: the DMA semaphore is
    an output in SEMAPHORE memory, then an input (as upstream's tpu_pallas_async_test)."""
    anys = pl.BlockSpec(memory_space=pltpu.MemorySpace.ANY)
    sem_spec = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
    x, out, sem = pl.pallas_call(
        _copy_start, in_specs=[anys], out_specs=(anys, anys, sem_spec),
        out_shape=(jax.ShapeDtypeStruct.like(x), jax.ShapeDtypeStruct.like(x),
                   pltpu.SemaphoreType.DMA(())),
        input_output_aliases={0: 0})(x)
    return pl.pallas_call(
        _copy_done, in_specs=[anys, anys, sem_spec], out_specs=anys,
        out_shape=jax.ShapeDtypeStruct.like(x), input_output_aliases={1: 0})(x, out, sem)


@pytest.fixture
def async_copy_across_calls():
    """A copy started by one pallas_call and waited for by the next (see above)."""
    return _async_copy_across_calls
