"""Shared fixtures of pallas-tpu's tests (CPU only: lowering for TPU needs no TPU)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

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
