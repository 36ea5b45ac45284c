"""``pl.debug_check`` with debug checks enabled lowers to a device assertion of its
condition: a kernel whose condition holds computes as without it, one whose condition
fails traps with the check's message (an error of the emulated run); with checks off
the kernel carries no assertion."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
from pallas_mosaic_gpu import compiler
from pallas_mosaic_gpu._src.backend import params
from pallas_mosaic_gpu._src.executor import EmulationError
from pallas_mosaic_gpu._src.executor.launch import module_of
from pallas_mosaic_gpu._src.lowering import build

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")


def _checked_copy(x_ref, o_ref):
    pl.debug_check(jnp.sum(x_ref[...]) > 0, "x.sum() is not positive")
    o_ref[...] = x_ref[...]


F = pl.pallas_call(_checked_copy, out_shape=jax.ShapeDtypeStruct((256,), jnp.int32),
                   backend="mosaic_gpu")


def _module_text(x) -> str:
    (eqn,) = [e for e in jax.make_jaxpr(F)(x).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    return str(module_of(build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k")))


def test_a_check_that_holds_leaves_the_result_alone(emulate):
    x = jnp.arange(256, dtype=jnp.int32)
    with pl.enable_debug_checks(True):
        (got,) = emulate(F, x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x))


def test_a_check_that_fails_traps_with_its_message(emulate):
    x = -jnp.arange(256, dtype=jnp.int32)
    with pl.enable_debug_checks(True), pytest.raises(EmulationError,
                                                      match="x.sum\\(\\) is not positive"):
        emulate(F, x)


def test_a_check_is_a_device_assertion_only_while_checks_are_enabled():
    x = jax.ShapeDtypeStruct((256,), jnp.int32)
    with pl.enable_debug_checks(True):
        assert "cf.assert" in _module_text(x)
    with pl.enable_debug_checks(False):
        assert "cf.assert" not in _module_text(x)


def test_the_assertion_compiles_to_a_call_of_assertfail():
    try:
        compiler.find_toolchain()
    except compiler.ToolchainMissingError as e:
        pytest.skip(str(e))
    with pl.enable_debug_checks(True):
        (k,) = compiler.compile(F, jnp.arange(256, dtype=jnp.int32))
    assert "__assertfail" in k.ptx
