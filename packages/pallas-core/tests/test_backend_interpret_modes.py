"""A backend's own interpret mode: params passed as ``interpret=`` that implement
``pallas.plugins.InterpretMode`` receive the kernel (a backend's mesh receives
``core_map``); forcing a mode applies it to kernels written without ``interpret``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import pallas as pl
from pallas.plugins import CoreMesh, InterpretMode, forced_interpret_mode, lower_with_interpreter


@dataclasses.dataclass(frozen=True)
class Recording(InterpretMode):
    """Runs kernels with the reference interpreter and records what it was handed."""

    seen: list = dataclasses.field(default_factory=list, compare=False, hash=False)

    def lower_pallas_call(self, ctx, *in_nodes, jaxpr, grid_mapping, compiler_params,
                          name):
        self.seen.append(("pallas_call", name, grid_mapping.mesh))
        return lower_with_interpreter(ctx, *in_nodes, jaxpr=jaxpr, grid_mapping=grid_mapping)


class SimulatedMesh(CoreMesh):
    """A backend's mesh whose core_map runs in a made-up simulator (adds one)."""

    def discharge_core_map(self, interpret):
        if not isinstance(interpret, Recording):
            return None

        def simulate(in_avals, args, params):
            interpret.seen.append(("core_map", params["name"], self))
            return [a + 1 for a in args]

        return simulate


def _add_one(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1


def test_params_implementing_the_protocol_get_the_pallas_call():
    mode = Recording()
    assert isinstance(mode, InterpretMode)
    x = jnp.arange(8, dtype=jnp.int32)
    f = pl.pallas_call(_add_one, out_shape=x, interpret=mode, name="add_one")
    np.testing.assert_array_equal(jax.jit(f)(x), x + 1)
    assert mode.seen == [("pallas_call", "add_one", None)]


def test_pl_kernel_passes_its_mesh_on_the_grid_mapping():
    mode = Recording()
    mesh = CoreMesh(core=2)

    def body(x_ref, o_ref):
        @pl.when(jax.lax.axis_index("core") == 0)
        def _():
            o_ref[...] = x_ref[...] * 2

    x = jnp.arange(4, dtype=jnp.int32)
    y = pl.kernel(body, out_type=x, mesh=mesh, interpret=mode)(x)
    np.testing.assert_array_equal(y, x * 2)
    assert mode.seen[0][2] is mesh


def test_core_map_outside_a_kernel_is_discharged_by_the_mode():
    mode = Recording()

    @pl.run_state
    def f(ref):
        @pl.core_map(SimulatedMesh(core=2), interpret=mode, name="bump")
        def _():
            ref[...] = ref[...] * 10

    np.testing.assert_array_equal(f(jnp.zeros((3,), jnp.int32)), np.ones(3))
    assert mode.seen[0][:2] == ("core_map", "bump")


def test_a_forced_mode_applies_to_kernels_written_without_interpret():
    mode = Recording()
    x = jnp.arange(8, dtype=jnp.int32)
    f = pl.pallas_call(_add_one, out_shape=x, name="forced")
    with forced_interpret_mode(mode):
        np.testing.assert_array_equal(jax.jit(f)(x), x + 1)
    assert [s[1] for s in mode.seen] == ["forced"]


def _interpret_params_of_kernels(jaxpr) -> list:
    """The ``interpret`` parameter of every pallas_call in ``jaxpr`` (inner jits too)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append(eqn.params["interpret"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _interpret_params_of_kernels(sub)
    return found


def test_an_inner_jit_traced_under_a_forced_mode_is_traced_again_outside_it():
    """A jitted library function (upstream's kernels are ``jax.jit``s) run under a forced
    mode and then lowered for a real backend must not reuse the forced trace."""
    mode = Recording()
    x = jnp.arange(8, dtype=jnp.int32)
    inner = jax.jit(pl.pallas_call(_add_one, out_shape=x, name="inner"))
    with forced_interpret_mode(mode):
        forced = jax.make_jaxpr(lambda v: inner(v))(x).jaxpr
    plain = jax.make_jaxpr(lambda v: inner(v))(x).jaxpr
    assert _interpret_params_of_kernels(forced) == [mode]
    assert _interpret_params_of_kernels(plain) == [False]
