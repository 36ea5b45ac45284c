"""Shared fixtures of pallas-tpu-sparsecore's tests (CPU only: lowering for TPU needs
no TPU; the target chip is the documented default, TPU7x, unless a test picks one)."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

jax.config.update("jax_platforms", "cpu")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def lanes():
    import pallas_tpu_sparsecore as plsc

    return plsc.get_sparse_core_info().num_lanes


@pytest.fixture
def vector_kernel():
    """``vector_kernel(out_type, scratch=(), subcores=1, interpret=True)(body)``: a
    ``pl.kernel`` over a 1-core vector-subcore mesh."""
    import pallas as pl
    import pallas_tpu_sparsecore as plsc

    def make(out_type, scratch=(), subcores=1, interpret=True, **kw):
        mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                      num_cores=1, num_subcores=subcores)
        return functools.partial(pl.kernel, out_type=out_type, mesh=mesh,
                                 scratch_types=list(scratch), interpret=interpret, **kw)

    return make


@pytest.fixture
def lower_tpu():
    """``lower_tpu(f, *args)`` -> (lowered, [Mosaic modules]) for TPU, on this CPU machine."""
    from pallas_tpu.inspect import mosaic_modules

    def lower(f, *args):
        lowered = jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",))
        return lowered, mosaic_modules(lowered)

    return lower
