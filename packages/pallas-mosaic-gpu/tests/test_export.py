"""``jax.export`` of a Mosaic GPU kernel for ``cuda`` on a CPU machine: the artifact
carries the ``mosaic_gpu_v2`` custom call (which ``jax.export`` accepts without a
waiver), survives serialisation, and a caller lowered for ``cuda`` embeds it."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import pallas as pl

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")


def _double(x):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          backend="mosaic_gpu")(x)


def test_an_exported_kernel_round_trips_and_is_called_from_cuda_code():
    x = np.ones((8, 128), np.float32)
    exp = jax.export.export(jax.jit(_double), platforms=["cuda"])(x)
    assert "mosaic_gpu_v2" in exp.mlir_module()
    back = jax.export.deserialize(exp.serialize())
    assert back.platforms == ("cuda",)
    lowered = jax.jit(lambda a: back.call(a) + 1.0).trace(x).lower(
        lowering_platforms=("cuda",))
    assert "mosaic_gpu_v2" in lowered.as_text()

