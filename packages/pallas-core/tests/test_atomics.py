"""``pallas.atomics``: atomic read-modify-write and compare-and-swap, run by the interpreter.

The interpreter is the reference semantics: each atomic returns the previous values,
masked-out elements are untouched, and programs contending for the same elements give
the exact combined result.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
from pallas import atomics, plugins

SDS = jax.ShapeDtypeStruct
ALL = (slice(None), slice(None))


def _one_program(kernel, acc, x):
    """Runs ``kernel(acc_in, x, out, old)`` once, ``out`` starting as ``acc``."""
    return pl.pallas_call(kernel, out_shape=(SDS(acc.shape, acc.dtype),) * 2,
                          input_output_aliases={0: 0}, interpret=True)(acc, x)


@pytest.mark.parametrize("op, combine", [
    ("add", np.add), ("max", np.maximum), ("min", np.minimum), ("and", np.bitwise_and),
    ("or", np.bitwise_or), ("xor", np.bitwise_xor), ("xchg", lambda a, b: b),
])
def test_each_op_combines_into_the_ref_and_returns_the_previous_values(op, combine):
    acc = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) * 3 - 20
    x = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)[::-1] * 5 - 30

    def kernel(a_ref, x_ref, o_ref, old_ref):
        old_ref[...] = getattr(atomics, f"atomic_{op}")(o_ref, ALL, x_ref[...])

    out, old = _one_program(kernel, acc, x)
    np.testing.assert_array_equal(out, combine(np.asarray(acc), np.asarray(x)))
    np.testing.assert_array_equal(old, acc)


def test_masked_elements_are_left_untouched():
    acc, x = jnp.zeros((2, 8), jnp.float32), jnp.arange(16.0).reshape(2, 8) - 8

    def kernel(a_ref, x_ref, o_ref, old_ref):
        old_ref[...] = atomics.atomic_add(o_ref, ALL, x_ref[...], mask=x_ref[...] > 0)

    out, _ = _one_program(kernel, acc, x)
    np.testing.assert_array_equal(out, np.where(x > 0, x, 0))


def test_an_index_selects_the_view_the_atomic_applies_to():
    acc, x = jnp.zeros((4, 8), jnp.int32), jnp.ones((2, 8), jnp.int32)

    def kernel(a_ref, x_ref, o_ref, old_ref):
        atomics.atomic_add(o_ref, (pl.ds(2, 2), slice(None)), x_ref[...])
        atomics.atomic_add(o_ref.at[0], (3,), 7)
        old_ref[...] = o_ref[...]

    out, _ = pl.pallas_call(kernel, out_shape=(SDS((4, 8), jnp.int32),) * 2,
                            input_output_aliases={0: 0}, interpret=True)(acc, x)
    expected = np.zeros((4, 8), np.int32)
    expected[2:] = 1
    expected[0, 3] = 7
    np.testing.assert_array_equal(out, expected)


def test_contending_programs_give_the_exact_combined_result():
    x = jnp.arange(8 * 16, dtype=jnp.int32).reshape(8, 16) % 11

    def kernel(z_ref, c_ref, x_ref, s_ref, n_ref):
        atomics.atomic_add(s_ref, (slice(None),), x_ref[0])
        atomics.atomic_add(n_ref, (0,), 1)

    shared = pl.BlockSpec((16,), lambda i: (0,))
    s, n = pl.pallas_call(
        kernel, out_shape=(SDS((16,), jnp.int32), SDS((16,), jnp.int32)), grid=(8,),
        in_specs=[shared, shared, pl.BlockSpec((1, 16), lambda i: (i, 0))],
        out_specs=(shared, shared), input_output_aliases={0: 0, 1: 1}, interpret=True,
    )(jnp.zeros((16,), jnp.int32), jnp.zeros((16,), jnp.int32), x)
    np.testing.assert_array_equal(s, np.sum(np.asarray(x), axis=0))
    assert n.tolist() == [8] + [0] * 15  # one increment per program


def test_compare_and_swap_writes_only_where_the_ref_equals_cmp():
    acc = jnp.array([[0, 1, 2, 1, 0, 1, 2, 1]], jnp.int32)
    val = jnp.full((1, 8), 9, jnp.int32)

    def kernel(a_ref, v_ref, o_ref, old_ref):
        old_ref[...] = atomics.atomic_cas(o_ref, 1, v_ref[...])

    out, old = _one_program(kernel, acc, val)
    np.testing.assert_array_equal(out, np.where(acc == 1, 9, acc))
    np.testing.assert_array_equal(old, acc)


def test_a_scalar_compare_and_swap_on_a_view_takes_a_lock_once():
    def kernel(l_ref, o_ref, got_ref):
        first = atomics.atomic_cas(o_ref.at[0], 0, 1)   # takes the free lock
        second = atomics.atomic_cas(o_ref.at[0], 0, 1)  # finds it taken
        got_ref[0] = first
        got_ref[1] = second

    lock, got = pl.pallas_call(
        kernel, out_shape=(SDS((1,), jnp.int32), SDS((2,), jnp.int32)),
        input_output_aliases={0: 0}, interpret=True)(jnp.zeros((1,), jnp.int32))
    assert lock.tolist() == [1] and got.tolist() == [0, 1]


def test_an_atomic_on_uninitialised_output_memory_is_reported_with_poison_buffers():
    def kernel(x_ref, o_ref):
        atomics.atomic_add(o_ref, (slice(None),), x_ref[...])  # output never zeroed

    with pl.enable_poison_buffers(True):
        with pytest.raises(Exception, match="atomic on uninitialised memory"):
            jax.block_until_ready(pl.pallas_call(
                kernel, out_shape=SDS((8,), jnp.float32), interpret=True)(jnp.ones((8,))))


@pytest.mark.parametrize("op, dtype", [
    ("add", jnp.bfloat16), ("add", jnp.int8), ("add", jnp.bool_), ("max", jnp.float16),
    ("and", jnp.float32),
])
def test_element_types_without_hardware_atomics_are_rejected_when_tracing(op, dtype):
    def kernel(x_ref, o_ref):
        getattr(atomics, f"atomic_{op}")(o_ref, (slice(None),), x_ref[...])

    with pytest.raises(ValueError, match=f"atomic_{op}"):
        pl.pallas_call(kernel, out_shape=SDS((8,), dtype), interpret=True)(
            jnp.zeros((8,), dtype))


def test_a_value_of_another_dtype_is_an_error_but_python_scalars_convert():
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)
        atomics.atomic_add(o_ref, (slice(None),), 2)  # weakly typed: converted
        atomics.atomic_add(o_ref, (slice(None),), x_ref[...])

    f = pl.pallas_call(kernel, out_shape=SDS((8,), jnp.float32), interpret=True)
    np.testing.assert_array_equal(f(jnp.ones((8,), jnp.float32)), np.full(8, 3.0))
    with pytest.raises(TypeError, match="atomic_add: val has dtype int32"):
        f(jnp.ones((8,), jnp.int32))


def test_signatures_match_upstream_triton_atomics():
    for op in ("add", "and", "max", "min", "or", "xchg", "xor"):
        sig = inspect.signature(getattr(atomics, f"atomic_{op}"))
        assert list(sig.parameters) == ["x_ref_or_view", "idx", "val", "mask"], op
        assert sig.parameters["mask"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(atomics.atomic_cas).parameters) == ["ref", "cmp", "val"]


def test_backends_find_the_primitives_in_the_plugin_api():
    assert plugins.atomic_rmw_p.name == "atomic_rmw"
    assert plugins.atomic_cas_p.name == "atomic_cas"
    assert plugins.atomic_rmw_p in plugins.PRIMITIVES
    assert plugins.atomic_cas_p in plugins.interpret_rules


@pytest.mark.parametrize("shared", ["blocked", "any"])
def test_contention_is_exact_whether_the_shared_output_is_blocked_or_whole(shared):
    # The interpreter may vectorise independent programs; atomics on a shared output
    # must still see every program's update.
    x = jnp.arange(32 * 128, dtype=jnp.int32).reshape(32, 128) % 13
    spec = (pl.BlockSpec((8, 128), lambda i: (0, 0)) if shared == "blocked"
            else pl.BlockSpec(memory_space=pl.ANY))
    rows = pl.BlockSpec((8, 128), lambda i: (i, 0))

    def kernel(z_ref, x_ref, s_ref, y_ref):
        atomics.atomic_add(s_ref, ALL, x_ref[...])
        y_ref[...] = x_ref[...]

    s, _ = pl.pallas_call(
        kernel, out_shape=(SDS((8, 128), jnp.int32), SDS(x.shape, x.dtype)), grid=(4,),
        in_specs=[spec, rows], out_specs=(spec, rows), input_output_aliases={0: 0},
        interpret=True)(jnp.zeros((8, 128), jnp.int32), x)
    np.testing.assert_array_equal(s, np.asarray(x).reshape(4, 8, 128).sum(axis=0))
