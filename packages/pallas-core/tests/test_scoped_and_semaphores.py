"""Buffers with a lifetime: ``run_scoped``/``with_scoped``, ``empty``/``empty_like``,
and counting semaphores (``semaphore_signal``, ``semaphore_wait``, ``semaphore_read``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
from pallas._src.memory import SemaphoreSpace

SDS = jax.ShapeDtypeStruct
REGULAR = SemaphoreSpace.REGULAR


def _call(kernel, out_shape, *args, **kw):
    return pl.pallas_call(kernel, out_shape, interpret=True, **kw)(*args)


# --------------------------------------------------------------------------------------
# run_scoped / with_scoped


def test_run_scoped_gives_the_body_a_fresh_ref():
    x = jnp.arange(8, dtype=jnp.float32)
    shapes = []

    def kernel(x_ref, o_ref):
        def body(tmp_ref):
            shapes.append((tmp_ref.shape, tmp_ref.dtype))
            tmp_ref[...] = x_ref[...] * 2
            o_ref[...] = tmp_ref[...] + 1

        pl.run_scoped(body, pl.ANY((8,), jnp.float32))

    out = _call(kernel, SDS(x.shape, x.dtype), x)
    assert shapes == [((8,), jnp.float32)]
    np.testing.assert_array_equal(out, x * 2 + 1)


def test_run_scoped_returns_the_bodys_values():
    x = jnp.arange(8, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        def body(a_ref, b_ref):
            a_ref[...] = x_ref[...]
            b_ref[...] = x_ref[...].astype(jnp.int32) * 3
            return jnp.sum(a_ref[...]), b_ref[...]

        total, tripled = pl.run_scoped(body, pl.ANY((8,), jnp.float32),
                                       pl.ANY((8,), jnp.int32))
        o_ref[...] = tripled.astype(jnp.float32) + total

    out = _call(kernel, SDS(x.shape, x.dtype), x)
    np.testing.assert_array_equal(out, np.arange(8) * 3 + 28)


def test_run_scoped_with_keyword_and_pytree_types():
    def kernel(o_ref):
        def body(pair, *, acc):
            a, b = pair
            a[...] = jnp.ones((4,), jnp.float32)
            b[...] = jnp.full((4,), 2.0, jnp.float32)
            acc[...] = a[...] + b[...]
            o_ref[...] = acc[...]

        pl.run_scoped(body, (pl.ANY((4,), jnp.float32), pl.ANY((4,), jnp.float32)),
                      acc=pl.ANY((4,), jnp.float32))

    np.testing.assert_array_equal(_call(kernel, SDS((4,), jnp.float32)), [3, 3, 3, 3])


def test_with_scoped_makes_a_function_whose_calls_get_fresh_refs_after_their_args():
    def kernel(o_ref):
        @pl.with_scoped(pl.ANY((2, 2), jnp.int32), w_ref=pl.ANY((2, 2), jnp.int32))
        def total(scale, tmp_ref, w_ref):
            tmp_ref[...] = jnp.arange(4, dtype=jnp.int32).reshape(2, 2)
            w_ref[...] = jnp.full((2, 2), scale, jnp.int32)
            return jnp.sum(tmp_ref[...] * w_ref[...])

        o_ref[0] = total(1)

    np.testing.assert_array_equal(_call(kernel, SDS((1,), jnp.int32)), [6])


def test_nested_run_scoped_and_run_scoped_inside_loops():
    def kernel(o_ref):
        @pl.loop(0, 3)
        def _(i):
            def outer(a_ref):
                a_ref[...] = jnp.full((4,), i, jnp.int32)

                def inner(b_ref):
                    b_ref[...] = a_ref[...] * 10
                    o_ref[i] = b_ref[...]

                pl.run_scoped(inner, pl.ANY((4,), jnp.int32))

            pl.run_scoped(outer, pl.ANY((4,), jnp.int32))

    out = _call(kernel, SDS((3, 4), jnp.int32))
    np.testing.assert_array_equal(out, np.repeat(np.arange(3) * 10, 4).reshape(3, 4))


def test_run_scoped_buffers_start_uninitialised_at_every_entry():
    def kernel(o_ref):
        @pl.loop(0, 2)
        def _(i):
            def body(t_ref):
                o_ref[i] = t_ref[...]  # read before write: uninitialised (NaN)
                t_ref[...] = jnp.ones((2,), jnp.float32)

            pl.run_scoped(body, pl.ANY((2,), jnp.float32))

    out = np.asarray(_call(kernel, SDS((2, 2), jnp.float32)))
    assert np.isnan(out).all()


def test_run_scoped_rejects_non_buffer_types():
    def kernel(o_ref):
        pl.run_scoped(lambda r: None, (4,))

    with pytest.raises(TypeError, match="run_scoped"):
        _call(kernel, SDS((4,), jnp.float32))


# --------------------------------------------------------------------------------------
# empty / empty_like


def test_empty_has_the_requested_shape_and_dtype_and_can_be_overwritten():
    shapes = []

    def kernel(x_ref, o_ref):
        e = pl.empty((4, 2), jnp.float32)
        shapes.append((e.shape, e.dtype))
        o_ref[...] = jnp.where(jnp.ones((4, 2), bool), x_ref[...], e)

    x = jnp.arange(8, dtype=jnp.float32).reshape(4, 2)
    out = _call(kernel, SDS(x.shape, x.dtype), x)
    assert shapes == [((4, 2), jnp.float32)]
    np.testing.assert_array_equal(out, x)


def test_empty_like_follows_a_pytree_of_arrays():
    tree = {"a": jnp.zeros((2, 3), jnp.bfloat16), "b": (jnp.zeros((4,), jnp.int32),)}
    e = pl.empty_like(tree)
    assert jax.tree_util.tree_structure(e) == jax.tree_util.tree_structure(tree)
    assert e["a"].shape == (2, 3) and e["a"].dtype == jnp.bfloat16
    assert e["b"][0].shape == (4,) and e["b"][0].dtype == jnp.int32


def test_empty_like_inside_a_kernel():
    x = jnp.arange(6, dtype=jnp.int32)

    def kernel(x_ref, o_ref):
        e = pl.empty_like(x_ref[...])
        assert e.shape == (6,) and e.dtype == jnp.int32
        o_ref[...] = jnp.maximum(e, x_ref[...])  # e is unspecified; max with x keeps x
        o_ref[...] = x_ref[...] + 1

    np.testing.assert_array_equal(_call(kernel, SDS((6,), jnp.int32), x), np.arange(6) + 1)


# --------------------------------------------------------------------------------------
# Semaphores


def test_semaphore_buffer_type_is_int32_in_a_semaphore_space():
    t = REGULAR((2,))
    assert isinstance(t, pl.MemoryRef)
    assert t.shape == (2,) and t.dtype == jnp.int32
    assert np.dtype(pl.semaphore.dtype) == np.int32


def test_semaphores_start_at_zero_and_count_signals_and_waits():
    def kernel(o_ref, sem):
        o_ref[0] = pl.semaphore_read(sem)
        pl.semaphore_signal(sem)
        pl.semaphore_signal(sem, 4)
        o_ref[1] = pl.semaphore_read(sem)
        pl.semaphore_wait(sem, 2)
        o_ref[2] = pl.semaphore_read(sem)
        pl.semaphore_wait(sem)
        o_ref[3] = pl.semaphore_read(sem)
        pl.semaphore_wait(sem, 2, decrement=False)
        o_ref[4] = pl.semaphore_read(sem)

    out = _call(kernel, SDS((5,), jnp.int32), scratch_shapes=[REGULAR(())])
    np.testing.assert_array_equal(out, [0, 5, 3, 2, 2])


def test_semaphore_arrays_are_indexed_with_at():
    def kernel(o_ref, sems):
        for i in range(3):
            pl.semaphore_signal(sems.at[i], i + 1)
        pl.semaphore_signal(sems.at[pl.program_id(0) % 3], 10)
        pl.semaphore_wait(sems.at[0], 1)
        for i in range(3):
            o_ref[i] = pl.semaphore_read(sems.at[i])

    out = _call(kernel, SDS((3,), jnp.int32), grid=(1,), scratch_shapes=[REGULAR((3,))])
    np.testing.assert_array_equal(out, [10, 2, 3])


def test_semaphore_counts_persist_across_grid_points():
    def kernel(o_ref, sem):
        pl.semaphore_signal(sem, pl.program_id(0) + 1)
        o_ref[0] = pl.semaphore_read(sem)

    out = pl.pallas_call(kernel, SDS((4,), jnp.int32), grid=(4,), in_specs=[],
                         out_specs=pl.BlockSpec((1,), lambda i: (i,)),
                         scratch_shapes=[REGULAR(())], interpret=True)()
    np.testing.assert_array_equal(out, np.cumsum([1, 2, 3, 4]))


def test_semaphore_in_run_scoped():
    def kernel(o_ref):
        def body(sem):
            pl.semaphore_signal(sem, 3)
            pl.semaphore_wait(sem, 1)
            o_ref[0] = pl.semaphore_read(sem)

        pl.run_scoped(body, REGULAR(()))

    np.testing.assert_array_equal(_call(kernel, SDS((1,), jnp.int32)), [2])


class _BareSemaphore:
    """A buffer type offering only upstream's contract, ``get_ref_aval()`` (as a bare
    ``plgpu.SemaphoreType.REGULAR`` does): one semaphore."""

    def get_ref_aval(self):
        return REGULAR(()).get_ref_aval()


def test_a_type_with_only_get_ref_aval_is_a_buffer_type_for_scratch_and_run_scoped():
    def kernel(o_ref, scratch_sem):
        pl.semaphore_signal(scratch_sem, 2)
        o_ref[0] = pl.semaphore_read(scratch_sem)

        def body(sem):
            pl.semaphore_signal(sem, 5)
            o_ref[1] = pl.semaphore_read(sem)

        pl.run_scoped(body, _BareSemaphore())

    out = _call(kernel, SDS((2,), jnp.int32), scratch_shapes=[_BareSemaphore()])
    np.testing.assert_array_equal(out, [2, 5])


def test_a_wait_that_can_never_be_satisfied_is_reported_with_debug_checks():
    def kernel(o_ref, sem):
        pl.semaphore_signal(sem, 1)
        pl.semaphore_wait(sem, 2)
        o_ref[0] = 0

    with pl.enable_debug_checks(True):
        with pytest.raises(Exception, match="semaphore_wait.*block forever"):
            jax.block_until_ready(
                _call(kernel, SDS((1,), jnp.int32), scratch_shapes=[REGULAR(())]))


def test_signal_to_another_device_needs_a_multi_device_interpreter():
    def kernel(o_ref, sem):
        pl.semaphore_signal(sem, 1, device_id=0)
        o_ref[0] = 0

    # (An installed backend such as pallas-tpu may extend this rule; either way the
    # message points at shard_map.)
    with pytest.raises(NotImplementedError, match="shard_map"):
        _call(kernel, SDS((1,), jnp.int32), scratch_shapes=[REGULAR(())])


def test_get_global_is_a_backend_feature_that_the_core_interpreter_refuses():
    """``pl.get_global`` lives for a whole launch; pallas-core's interpreter (one grid
    point at a time) says to use a backend's interpret mode. Bad types fail at trace
    time naming the argument."""

    def kernel(o_ref):
        pl.semaphore_signal(pl.get_global(REGULAR(())))

    with pytest.raises(NotImplementedError, match="get_global.*backend's interpret mode"):
        _call(kernel, SDS((1,), jnp.int32))
    with pytest.raises(TypeError, match=r"get_global\(what=3\)"):
        _call(lambda o_ref: pl.get_global(3), SDS((1,), jnp.int32))


def test_refs_a_kernel_allocates_with_jax_empty_ref_and_new_ref_are_scratch():
    """``jax.empty_ref``/``jax.new_ref`` inside a kernel allocate scratch (as
    ``run_scoped``): the call has no effect outside (it runs eagerly and under jit)."""
    def kernel(x_ref, y_ref):
        acc = jax.empty_ref(jax.ShapeDtypeStruct(y_ref.shape, y_ref.dtype))
        ones = jax.new_ref(jnp.ones(y_ref.shape, y_ref.dtype))
        for i in range(4):
            acc[:, i] = x_ref[...] + i
        y_ref[...] = acc[...] * ones[...]

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 4), jnp.int32),
                       interpret=True)
    x = jnp.arange(8, dtype=jnp.int32)
    expected = jnp.arange(8)[:, None] + jnp.arange(4)[None, :]
    np.testing.assert_array_equal(f(x), expected)
    np.testing.assert_array_equal(jax.jit(f)(x), expected)
    assert not jax.make_jaxpr(f)(x).effects


def test_run_scoped_discharges_the_captured_refs_asked_for():
    # Regression: JAX's state discharge of a jaxpr calling run_scoped raised "No state
    # discharge rule implemented for primitive: run_scoped" (upstream's
    # test_run_scoped_partial_discharge). A discharged ref is a value inside the scope and
    # its final value a result; the other stays a ref, written by the scope.
    from pallas._src import jax_compat as jc

    def f(a_ref, b_ref):
        def scope():
            a_ref[...] = jnp.ones(4, jnp.float32)
            b_ref[...] = b_ref[...] * 2

        pl.run_scoped(scope)
        return []

    # (two aval objects: JAX's discharge tells refs apart by their avals' identity)
    avals = [jc.AbstractRef(jax.core.ShapedArray((4,), jnp.float32)) for _ in range(2)]
    jaxpr, _, _ = jc.trace_kernel_to_jaxpr(f, avals, "f")
    out = jc.discharge_state(jc.ClosedJaxpr(jaxpr, ()), should_discharge=[False, True])
    assert isinstance(out.jaxpr.invars[0].aval, jc.AbstractRef)
    assert not isinstance(out.jaxpr.invars[1].aval, jc.AbstractRef)
    assert len(out.jaxpr.outvars) == 1  # b's final value
    assert out.effects == {jc.WriteEffect(out.jaxpr.invars[0])}
    (eqn,) = out.jaxpr.eqns
    assert eqn.primitive.name == "run_scoped" and len(eqn.outvars) == 1
