"""Effects of ``pallas_call``: debug prints and callbacks under ``jit``, ``checkify``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import pallas as pl

SDS = jax.ShapeDtypeStruct


def _printed(capsys) -> list[str]:
    jax.effects_barrier()
    return [line for line in capsys.readouterr().out.splitlines() if line]


def _grid_call(kernel, n=4):
    spec = pl.BlockSpec((2,), lambda i: (i,))
    return pl.pallas_call(kernel, SDS((2 * n,), jnp.float32), grid=(n,), in_specs=[spec],
                          out_specs=spec, interpret=True)


def test_pallas_call_carries_its_kernels_effects():
    def kernel(x_ref, o_ref):
        pl.debug_print("i={}", pl.program_id(0))
        o_ref[...] = x_ref[...]

    def quiet(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    x = jnp.zeros(8)
    (eqn,) = jax.make_jaxpr(_grid_call(kernel))(x).jaxpr.eqns
    assert eqn.effects  # the print, not the kernel's ref reads and writes
    (eqn,) = jax.make_jaxpr(_grid_call(quiet))(x).jaxpr.eqns
    assert not eqn.effects


def test_debug_print_and_callback_keep_grid_order_under_jit(capsys):
    def kernel(x_ref, o_ref):
        i = pl.program_id(0)
        pl.debug_print("print {}", i)
        jax.debug.callback(lambda v: print(f"callback {int(v)}"), i)
        o_ref[...] = x_ref[...] + 1

    f = jax.jit(_grid_call(kernel))
    np.testing.assert_array_equal(f(jnp.zeros(8)), jnp.ones(8))
    lines = _printed(capsys)
    # grid points run in order; within one point, unordered effects may be reordered
    points = [int(line.split()[1]) for line in lines]
    assert points == sorted(points) and len(lines) == 8
    assert sorted(lines) == sorted(f"{k} {i}" for i in range(4) for k in ("print", "callback"))


def test_a_printing_call_whose_outputs_are_unused_still_runs(capsys):
    def kernel(x_ref, o_ref):
        pl.debug_print("ran {}", pl.program_id(0))
        o_ref[...] = x_ref[...]

    call = _grid_call(kernel, n=2)
    jax.jit(lambda x: (call(x), x + 1)[1])(jnp.zeros(4))
    assert _printed(capsys) == ["ran 0", "ran 1"]


def test_ordered_callbacks_interleave_with_the_enclosing_program(capsys):
    def kernel(x_ref, o_ref):
        jax.debug.print("kernel {}", pl.program_id(0), ordered=True)
        o_ref[...] = x_ref[...] * 2

    call = _grid_call(kernel, n=2)

    @jax.jit
    def f(x):
        jax.debug.print("start", ordered=True)
        y = call(x)
        jax.debug.print("middle", ordered=True)
        y = call(y)
        jax.debug.print("end", ordered=True)
        return y

    np.testing.assert_array_equal(f(jnp.ones(4)), 4 * jnp.ones(4))
    assert _printed(capsys) == ["start", "kernel 0", "kernel 1", "middle", "kernel 0",
                                "kernel 1", "end"]


def test_prints_under_vmap_run_per_batch_element_in_order(capsys):
    def kernel(x_ref, o_ref):
        jax.debug.print("point {}", pl.program_id(0), ordered=True)
        o_ref[...] = x_ref[...]

    jax.jit(jax.vmap(_grid_call(kernel, n=2)))(jnp.zeros((2, 4)))
    assert _printed(capsys) == ["point 0", "point 1", "point 0", "point 1"]


# --------------------------------------------------------------------------------------
# debug_check with checkify.


def _checked(x):
    def kernel(x_ref, o_ref):
        pl.debug_check(jnp.all(x_ref[...] > 0), "x must be positive")
        o_ref[...] = jnp.sqrt(x_ref[...])

    return _grid_call(kernel)(x)


@pytest.mark.parametrize("jit", [False, True])
def test_debug_check_reports_through_checkify(jit):
    f = checkify.checkify(_checked, errors=checkify.user_checks)
    f = jax.jit(f) if jit else f
    with pl.enable_debug_checks(True):
        err, out = f(jnp.ones(8).at[5].set(-1.0))
        assert err.get() is not None
        assert "x must be positive" in err.get() and "(2,)" in err.get()
        with pytest.raises(checkify.JaxRuntimeError, match="x must be positive"):
            err.throw()
        err, out = f(jnp.full((8,), 4.0))
        assert err.get() is None
        np.testing.assert_allclose(out, 2.0)


def test_debug_check_under_checkify_and_vmap():
    f = jax.vmap(checkify.checkify(_checked, errors=checkify.user_checks))
    with pl.enable_debug_checks(True):
        err, _ = f(jnp.ones((2, 8)).at[1, 0].set(-1.0))
    assert "x must be positive" in err.get()


def test_checkify_without_user_checks_leaves_debug_checks_to_the_interpreter():
    f = checkify.checkify(_checked, errors=checkify.float_checks)
    with pl.enable_debug_checks(True):
        with pytest.raises(pl.InterpreterError, match="x must be positive"):
            f(jnp.ones(8).at[0].set(-1.0))


# ------------------------------------------------------------------------------------
# What stays inside the kernel: a jax.export artifact must serialise and load where the
# backend that made it is not installed (the bundles of pallas-conformance).


def _round_trip(f, *args):
    exp = jax.export.export(jax.jit(f), platforms=["cpu"])(*args)
    return jax.export.deserialize(exp.serialize())


def test_named_axes_of_the_kernels_mesh_do_not_escape_the_call():
    from pallas._src.mesh import CoreMesh  # the backend-neutral mesh of the interpreter

    def f(x):
        def body(x_ref, o_ref):
            c = jax.lax.axis_index("core")

            # A nested core_map binds its own axis, which must not escape either.
            @pl.core_map(CoreMesh(lane=2), interpret=True)
            def _():
                lane = jax.lax.axis_index("lane")
                o_ref[c * 2 + lane] = x_ref[c * 2 + lane] + 1.0

        return pl.kernel(body, SDS((8,), jnp.float32), mesh=CoreMesh(core=4),
                         interpret=True)(x)

    x = jnp.arange(8, dtype=jnp.float32)
    assert not jax.make_jaxpr(f)(x).effects
    exp = _round_trip(f, x)
    assert not exp.ordered_effects and not exp.unordered_effects
    np.testing.assert_array_equal(exp.call(x), np.arange(8) + 1.0)


def test_a_registered_kernel_local_effect_stays_inside_the_call():
    import pallas.plugins
    from pallas._src import jax_compat as jc

    class FenceEffect(jc.effects.Effect):  # as a backend's fences and barriers
        pass

    fence = jc.Primitive("test_fence")
    fence.multiple_results = True
    fence.def_effectful_abstract_eval(lambda: ([], {FenceEffect()}))
    jc.effects.lowerable_effects.add_type(FenceEffect)
    jc.effects.control_flow_allowed_effects.add_type(FenceEffect)

    def kernel(x_ref, o_ref):
        fence.bind()
        o_ref[...] = x_ref[...]

    x = jnp.zeros(8)
    (eqn,) = jax.make_jaxpr(_grid_call(kernel))(x).jaxpr.eqns
    assert any(isinstance(e, FenceEffect) for e in eqn.effects)  # not registered yet
    pallas.plugins.register_kernel_local_effect(FenceEffect)
    (eqn,) = jax.make_jaxpr(_grid_call(kernel))(x).jaxpr.eqns
    assert not eqn.effects


def test_a_core_map_that_nothing_discharges_is_refused_with_upstreams_words():
    # An empty body has no effect on the run_state refs, so nothing turns it into a
    # kernel; lowering it is an error (upstream's message), not JAX's missing-rule one.
    from pallas._src.mesh import CoreMesh

    @jax.jit
    def f(x):
        def inner(refs):
            @pl.core_map(CoreMesh(core=2), interpret=True)
            def _():
                pass

        _, y = pl.run_state(inner)((x, jnp.zeros_like(x)))
        return y

    with pytest.raises(ValueError, match="Attempted to lower core_map without discharging"):
        f(jnp.ones((8,), jnp.float32))
