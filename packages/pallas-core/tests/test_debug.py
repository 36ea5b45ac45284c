"""Debugging aids: ``debug=True``, ``pl.debug_print``, ``pl.debug_check``, ``pl.delay``."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl

SDS = jax.ShapeDtypeStruct


def _printed(capsys) -> str:
    jax.effects_barrier()
    return capsys.readouterr().out


# --------------------------------------------------------------------------------------
# debug=True


def test_debug_prints_the_kernel_jaxpr_and_the_grid_mapping(capsys):
    x = jnp.arange(16, dtype=jnp.float32).reshape(2, 8)

    def scale_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 3.0

    spec = pl.BlockSpec((1, 8), lambda i: (i, 0))
    out = pl.pallas_call(scale_kernel, SDS(x.shape, x.dtype), grid=(2,), in_specs=[spec],
                         out_specs=spec, debug=True, interpret=True)(x)
    np.testing.assert_array_equal(out, x * 3)
    text = _printed(capsys)
    # the kernel jaxpr: ref-typed inputs, the multiply and the store
    assert "The kernel jaxpr for pallas_call scale_kernel" in text
    assert "Ref<default>{f32[1,8]}" in text
    assert "mul" in text and "<-" in text
    # the grid mapping: grid, operands by path, array shapes and block dims
    assert "The grid mapping for pallas_call scale_kernel" in text
    assert "grid=(2,)" in text
    assert "args[0]" in text and "outputs" in text
    assert "float32[2,8]" in text
    assert "Blocked(1)" in text and "Blocked(8)" in text


def test_debug_false_prints_nothing(capsys):
    x = jnp.arange(4, dtype=jnp.float32)
    pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                   SDS(x.shape, x.dtype), interpret=True)(x)
    assert _printed(capsys) == ""


# --------------------------------------------------------------------------------------
# debug_print


def test_debug_print_formats_values_from_inside_the_kernel(capsys):
    x = jnp.arange(4, dtype=jnp.int32)

    def kernel(x_ref, o_ref):
        pl.debug_print("sum={} first={}", jnp.sum(x_ref[...]), x_ref[0])
        o_ref[...] = x_ref[...]

    jax.block_until_ready(pl.pallas_call(kernel, SDS(x.shape, x.dtype), interpret=True)(x))
    assert "sum=6 first=0" in _printed(capsys)


def test_jax_debug_print_of_a_ref_prints_its_current_contents(capsys):
    """jax.debug.print / jax.debug.callback given refs see their contents at that point."""
    x = jnp.array([4.2, 2.4], jnp.float32)
    seen = []

    def kernel(x_ref, o_ref):
        jax.debug.print("x = {}", x_ref)
        o_ref[...] = x_ref[...] + 1
        jax.debug.print("o = {}", o_ref)
        jax.debug.callback(lambda v: seen.append(np.asarray(v)), o_ref)

    jax.block_until_ready(pl.pallas_call(kernel, SDS(x.shape, x.dtype), interpret=True)(x))
    text = _printed(capsys)
    assert "x = [4.2 2.4]" in text and "o = [5.2 3.4]" in text
    np.testing.assert_allclose(seen[-1], [5.2, 3.4])


def test_debug_print_runs_once_per_grid_point_in_grid_order(capsys):
    def kernel(o_ref):
        pl.debug_print("point {} {}", pl.program_id(0), pl.program_id(1))
        o_ref[...] = jnp.zeros_like(o_ref)

    jax.block_until_ready(pl.pallas_call(
        kernel, SDS((2, 3), jnp.int32), grid=(2, 3), in_specs=[],
        out_specs=pl.BlockSpec((1, 1), lambda i, j: (i, j)), interpret=True)())
    points = re.findall(r"point (\d) (\d)", _printed(capsys))
    assert points == [(str(i), str(j)) for i in range(2) for j in range(3)]


def test_values_without_placeholders_are_printed_after_the_format(capsys):
    # upstream's TPU behaviour (tpu_sparsecore_pallas_test test_effect_discharge:
    # pl.debug_print("test", vec)); jax.debug.print refused it ("Unused positional
    # arguments").
    x = jnp.arange(4, dtype=jnp.int32)

    def kernel(x_ref, o_ref):
        pl.debug_print("values:", x_ref[...] + 1)
        o_ref[...] = x_ref[...]

    jax.block_until_ready(pl.pallas_call(kernel, SDS(x.shape, x.dtype), interpret=True)(x))
    assert "values: [1 2 3 4]" in _printed(capsys)


def test_debug_print_without_arguments(capsys):
    def kernel(o_ref):
        pl.debug_print("hello from the kernel")
        o_ref[0] = 1

    jax.block_until_ready(pl.pallas_call(kernel, SDS((1,), jnp.int32), interpret=True)())
    assert _printed(capsys).count("hello from the kernel") == 1


def test_debug_print_inside_control_flow(capsys):
    def kernel(o_ref):
        @pl.loop(0, 3)
        def _(i):
            @pl.when(i != 1)
            def _():
                pl.debug_print("i={}", i)

        o_ref[0] = 0

    jax.block_until_ready(pl.pallas_call(kernel, SDS((1,), jnp.int32), interpret=True)())
    assert re.findall(r"i=(\d)", _printed(capsys)) == ["0", "2"]


def test_debug_print_rejects_a_non_string_format():
    def kernel(o_ref):
        pl.debug_print(1, 2)

    with pytest.raises(TypeError, match="format"):
        pl.pallas_call(kernel, SDS((1,), jnp.int32), interpret=True)()


# --------------------------------------------------------------------------------------
# debug_check


def _check_kernel(x_ref, o_ref):
    pl.debug_check(jnp.all(x_ref[...] >= 0), "inputs must be non-negative")
    o_ref[...] = jnp.sqrt(x_ref[...])


def test_debug_check_fails_with_its_message_when_debug_checks_are_on():
    x = jnp.array([1.0, -4.0, 9.0, 16.0], jnp.float32)
    with pl.enable_debug_checks(True):
        with pytest.raises(Exception, match="inputs must be non-negative"):
            jax.block_until_ready(
                pl.pallas_call(_check_kernel, SDS(x.shape, x.dtype), interpret=True)(x))


def test_debug_check_names_the_grid_iteration():
    x = jnp.array([1.0, 4.0, -9.0, 16.0], jnp.float32)
    spec = pl.BlockSpec((1,), lambda i: (i,))
    with pl.enable_debug_checks(True):
        with pytest.raises(pl.InterpreterError, match=r"non-negative.*grid iteration \(2,\)"):
            jax.block_until_ready(pl.pallas_call(
                _check_kernel, SDS(x.shape, x.dtype), grid=(4,), in_specs=[spec],
                out_specs=spec, interpret=True)(x))


def test_debug_check_passes_silently_when_the_condition_holds():
    x = jnp.array([1.0, 4.0, 9.0, 16.0], jnp.float32)
    with pl.enable_debug_checks(True):
        out = pl.pallas_call(_check_kernel, SDS(x.shape, x.dtype), interpret=True)(x)
    np.testing.assert_array_equal(out, [1, 2, 3, 4])


def test_debug_check_is_ignored_when_debug_checks_are_off():
    x = jnp.array([1.0, -4.0, 9.0, 16.0], jnp.float32)
    out = np.asarray(pl.pallas_call(_check_kernel, SDS(x.shape, x.dtype), interpret=True)(x))
    np.testing.assert_array_equal(out[[0, 2, 3]], [1, 3, 4])
    assert np.isnan(out[1])


def test_debug_checks_via_interpret_params():
    x = jnp.array([-1.0], jnp.float32)
    with pl.enable_debug_checks(True):  # the check must be traced in ...
        f = pl.pallas_call(_check_kernel, SDS(x.shape, x.dtype),
                           interpret=pl.InterpretParams(debug_checks=False))
        # ... but the interpreter is told not to enforce it
        out = f(x)
    assert np.isnan(out[0])


def test_enable_debug_checks_context_restores_the_previous_value():
    assert not pl.enable_debug_checks.value
    with pl.enable_debug_checks(True):
        assert pl.enable_debug_checks.value
        with pl.enable_debug_checks(False):
            assert not pl.enable_debug_checks.value
        assert pl.enable_debug_checks.value
    assert not pl.enable_debug_checks.value


def test_debug_check_inside_a_conditional_only_fires_where_taken():
    x = jnp.array([-1.0, 4.0], jnp.float32)

    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 1)
        def _():
            pl.debug_check(x_ref[0] >= 0, "negative")

        o_ref[...] = x_ref[...]

    spec = pl.BlockSpec((1,), lambda i: (i,))
    with pl.enable_debug_checks(True):
        out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(2,), in_specs=[spec],
                             out_specs=spec, interpret=True)(x)
    np.testing.assert_array_equal(out, x)


# --------------------------------------------------------------------------------------
# delay


def test_delay_does_not_change_results():
    def kernel(o_ref):
        pl.delay(1000)
        o_ref[0] = 3

    np.testing.assert_array_equal(
        pl.pallas_call(kernel, SDS((1,), jnp.int32), interpret=True)(), [3])


def test_debug_checks_turned_on_between_two_calls_of_the_same_pallas_call_apply():
    x = jnp.array([-1.0], jnp.float32)
    f = pl.pallas_call(_check_kernel, SDS(x.shape, x.dtype), interpret=True)
    jax.block_until_ready(f(x))  # off: no error
    with pl.enable_debug_checks(True):
        with pytest.raises(Exception, match="non-negative"):
            jax.block_until_ready(f(x))


def test_debug_checks_inside_loops_report_the_failing_condition():
    def kernel(x_ref, o_ref):
        @pl.loop(0, 4)
        def _(i):
            pl.debug_check(x_ref[i] < 3, "too big in loop")
            o_ref[i] = x_ref[i]

        def body(c):
            pl.debug_check(x_ref[c] >= 0, "negative in while")
            return c + 1

        jax.lax.while_loop(lambda c: c < 4, body, 0)

    f = pl.pallas_call(kernel, SDS((4,), jnp.float32), interpret=True)
    with pl.enable_debug_checks(True):
        np.testing.assert_array_equal(f(jnp.array([0.0, 1, 2, 2])), [0, 1, 2, 2])
        with pytest.raises(pl.InterpreterError, match="too big in loop"):
            jax.block_until_ready(f(jnp.array([0.0, 1, 5, 2])))
        with pytest.raises(pl.InterpreterError, match="negative in while"):
            jax.block_until_ready(f(jnp.array([0.0, -1, 2, 2])))


def test_debug_check_failure_surfaces_under_jit():
    x = jnp.array([1.0, -4.0, 9.0, 16.0], jnp.float32)
    with pl.enable_debug_checks(True):
        f = jax.jit(pl.pallas_call(_check_kernel, SDS(x.shape, x.dtype), interpret=True))
        with pytest.raises(Exception, match="inputs must be non-negative"):
            jax.block_until_ready(f(x))
