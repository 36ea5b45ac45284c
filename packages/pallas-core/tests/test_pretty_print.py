"""How kernel jaxprs print: every primitive that accesses a ref shows it as ``a[i]``, as
JAX prints its own ``ref[i]`` reads and writes (what ``debug=True`` shows, and what
upstream's tests read)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
from pallas import atomics, plugins

ALL = slice(None)


def _text(body, shape=(4, 3, 2), dtype=jnp.int32, space=None) -> str:
    ref_aval = plugins.MemoryRef(jax.core.ShapedArray(shape, dtype), space).get_ref_aval()
    closed = jax.make_jaxpr(body)(ref_aval)
    return closed.jaxpr.pretty_print(use_color=False)


@pytest.mark.parametrize("idx, expected", [
    ((pl.ds(0, 4), ALL, ALL), "b:i32[4,3,2] <- a[:,:,:]"),
    ((pl.ds(0, 3), ALL, ALL), "<- a[:3,:,:]"),
    ((pl.ds(1, 3), ALL, pl.ds(0, 2)), "<- a[1:,:,:]"),
    ((0, ALL), "<- a[0,:,:]"),
])
def test_a_load_prints_as_a_read_of_the_indexed_ref(idx, expected):
    text = _text(lambda x: pl.load(x, idx))
    assert expected in text
    assert "masked_load" not in text


def test_a_gather_load_names_its_index_array():
    text = _text(lambda x: pl.load(x, (jnp.arange(4), ALL)))
    assert "b:i32[4] = iota" in text and "<- a[b,:,:]" in text


def test_a_masked_load_prints_its_mask_and_fill():
    text = _text(lambda x: pl.load(x.at[1:3], mask=jnp.ones((2, 3, 2), bool), other=7))
    assert "<- a[1:3,:,:] mask=" in text and " other=" in text


def test_a_store_prints_as_a_write_and_a_swap_shows_the_old_value():
    def body(x):
        v = pl.load(x, (pl.ds(0, 2),))
        pl.store(x, (pl.ds(2, 2),), v, mask=jnp.ones((2, 3, 2), bool))
        return pl.swap(x, (pl.ds(0, 2),), v)

    text = _text(body)
    assert "a[2:,:,:] <- b mask=" in text
    assert ", a[:2,:,:] <- a[:2,:,:], b" in text
    assert "masked_swap" not in text


def test_atomics_print_their_operation_and_the_indexed_ref():
    def body(x):
        old = atomics.atomic_add(x, (0,), 1, mask=jnp.ones((3, 2), bool))
        return old, atomics.atomic_cas(x.at[0, 0], 1, 2)

    text = _text(body)
    assert "atomic_rmw[op=add] a[0,:,:]" in text and " mask=" in text
    assert "atomic_cas a[0,0,:]" in text


def test_semaphore_operations_print_the_indexed_semaphore():
    def body(sem):
        pl.semaphore_signal(sem.at[1], 2)
        pl.semaphore_wait(sem.at[1], 2)
        return pl.semaphore_read(sem.at[0])

    text = _text(body, (2,), jnp.int32, plugins.SemaphoreSpace.REGULAR)
    assert "semaphore_signal a[1] 2:i32[]\n" in text
    assert "semaphore_wait[decrement=True] a[1] 2:i32[]" in text
    assert "semaphore_read a[0]" in text


@pytest.mark.parametrize("device_id, printed", [
    (lambda i: {"x": i}, "{x: b}"), (lambda i: (i, i), "(b, b)"), (lambda i: i, "b"),
    (lambda i: {"x": (i, i)}, "{x: (b, b)}"),
])
def test_a_remote_signal_prints_its_device_id_as_written(device_id, printed):
    def body(sem, i):
        pl.semaphore_signal(sem, device_id=device_id(i))

    sem = plugins.MemoryRef(jax.core.ShapedArray((), jnp.int32),
                            plugins.SemaphoreSpace.REGULAR).get_ref_aval()
    closed = jax.make_jaxpr(body)(sem, jax.ShapeDtypeStruct((), jnp.int32))
    text = closed.jaxpr.pretty_print(use_color=False)
    assert f"semaphore_signal a[...] 1:i32[] {printed}\n" in text


def test_debug_true_shows_ref_accesses_as_indexing(capsys):
    def kernel(x_ref, o_ref):
        pl.store(o_ref, (pl.ds(0, 4),), pl.load(x_ref, (pl.ds(4, 4),)))

    x = jnp.arange(8, dtype=jnp.float32)
    jax.block_until_ready(pl.pallas_call(kernel, jax.ShapeDtypeStruct((4,), x.dtype),
                                         debug=True, interpret=True)(x))
    out = capsys.readouterr().out
    assert "<- a[4:]" in out and "b[:] <- " in out


def test_a_backend_primitive_registered_through_plugins_prints_its_ref_access():
    """A backend's ref-accessing primitive (packed with plugins.RefOperands) prints as
    ``name[params] a[i] v`` once registered with plugins.register_ref_access_printer."""
    from jax.extend.core import Primitive

    touch_p = Primitive("touch_for_printing")
    touch_p.def_abstract_eval(lambda *avals, spec, scale: [])
    touch_p.multiple_results = True

    def split(eqn):
        (base, flat, tree), = plugins.unpack_ref_operands(eqn.params["spec"], eqn.invars)
        transforms = jax.tree_util.tree_unflatten(tree, flat)
        end = plugins.ref_operands_end(eqn.params["spec"])
        return plugins.RefAccess(base, transforms, operands=eqn.invars[end:])

    plugins.register_ref_access_printer(touch_p, "op", split, hidden=("spec",))

    def body(x):
        packed = plugins.RefOperands(x.at[pl.ds(1, 2)])
        touch_p.bind(*packed.operands, jnp.int32(3), spec=packed.spec, scale=2)

    assert "touch_for_printing[scale=2] a[1:3,:,:] 3" in _text(body)
