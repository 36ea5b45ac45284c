"""``input_output_aliases`` on Mosaic GPU: the custom call asks XLA to alias the buffers,
an aliased output's blocks start as the input's values (the kernel may read them), and
what the kernel does not write keeps them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
from pallas_mosaic_gpu._src.backend import params
from pallas_mosaic_gpu._src.executor import run_kernel
from pallas_mosaic_gpu._src.lowering import build

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F32 = jnp.float32


def _scale_in_place(acc, x, grid=1):
    """``o = o * 0.5 + x`` on the first ``grid`` row blocks of 8, ``o`` aliasing ``acc``."""
    def kernel(acc_ref, x_ref, o_ref):
        del acc_ref
        o_ref[...] = o_ref[...] * 0.5 + x_ref[...]

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(acc.shape, acc.dtype),
                          grid=(grid,), in_specs=[spec, spec], out_specs=spec,
                          input_output_aliases={0: 0}, backend="mosaic_gpu")(acc, x)


def _built(f, *args):
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    return build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k")


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((16, 128)).astype(np.float32),
            rng.standard_normal((16, 128)).astype(np.float32))


def test_the_custom_call_aliases_the_output_to_its_input():
    acc, x = _inputs()
    hlo = jax.jit(_scale_in_place).trace(acc, x).lower(lowering_platforms=("cuda",)).as_text()
    (call,) = [line for line in hlo.splitlines() if "mosaic_gpu_v2" in line]
    assert "output_operand_aliases" in call
    assert "operand_index = 0" in call


def test_the_kernel_reads_the_input_through_the_aliased_output():
    acc, x = _inputs()
    kernel = _built(lambda a, b: _scale_in_place(a, b, grid=2), acc, x)
    assert kernel.aliases == ((0, 0),)
    (out,) = run_kernel(kernel, [acc, x])
    np.testing.assert_allclose(out, acc * 0.5 + x, rtol=1e-6)


def test_blocks_the_kernel_does_not_write_keep_the_input():
    acc, x = _inputs()
    kernel = _built(lambda a, b: _scale_in_place(a, b, grid=1), acc, x)
    (out,) = run_kernel(kernel, [acc, x])
    np.testing.assert_allclose(out[:8], acc[:8] * 0.5 + x[:8], rtol=1e-6)
    np.testing.assert_array_equal(out[8:], acc[8:])
