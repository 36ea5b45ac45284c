"""Errors found at trace time, before anything runs.

Each message names the operand by its pytree path (``args[1]['w']``, ``outputs[0]``)
and, where there are shapes, both the block shape and the array shape. Every case is
checked with ``jax.jit(f).trace(...)`` or a plain call, which both fail while tracing.
"""

from __future__ import annotations

import importlib.metadata
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins

SDS = jax.ShapeDtypeStruct


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _two_in_kernel(a_ref, b_refs, o_ref):
    o_ref[...] = a_ref[...]


def _with_nested_input(b_spec, b_shape=(4, 8)):
    """A call whose second input is a dict; ``b_spec`` is the spec of ``args[1]['w']``."""
    a = jnp.zeros((4, 8), jnp.float32)
    b = {"w": jnp.zeros(b_shape, jnp.float32)}
    row = pl.BlockSpec((2, 8), lambda i: (i, 0))
    f = pl.pallas_call(_two_in_kernel, SDS((4, 8), jnp.float32), grid=(2,),
                       in_specs=(row, {"w": b_spec}), out_specs=row, interpret=True)
    return jax.jit(f).trace(a, b)


def _assert_names(msg, *parts):
    for p in parts:
        assert p in msg, f"{p!r} not in error message:\n{msg}"


# --------------------------------------------------------------------------------------
# BlockSpecs


def test_wrong_block_rank_names_the_path_and_both_shapes():
    with pytest.raises(ValueError) as info:
        _with_nested_input(pl.BlockSpec((8,), lambda i: (0,)))
    _assert_names(str(info.value), "args[1]['w']", "(8,)", "(4, 8)")


def test_wrong_block_rank_for_an_output():
    x = jnp.zeros((4, 8), jnp.float32)
    with pytest.raises(ValueError) as info:
        pl.pallas_call(_copy_kernel, (SDS((4, 8), jnp.float32),), grid=(2,),
                       in_specs=[pl.BlockSpec((2, 8), lambda i: (i, 0))],
                       out_specs=(pl.BlockSpec((2, 8, 1), lambda i: (i, 0, 0)),),
                       interpret=True)(x)
    _assert_names(str(info.value), "outputs[0]", "(2, 8, 1)", "(4, 8)")


def test_index_map_returning_too_few_indices():
    with pytest.raises(ValueError) as info:
        _with_nested_input(pl.BlockSpec((2, 8), lambda i: (i,)))
    msg = str(info.value)
    _assert_names(msg, "Index map function <lambda> at test_errors.py:", "args[1]['w']",
                  "must return 2 values", "Currently returning 1 values",
                  "Blocked(2), Blocked(8)", "(4, 8)")


def test_index_map_returning_too_many_indices():
    with pytest.raises(ValueError) as info:
        _with_nested_input(pl.BlockSpec((2, 8), lambda i: (i, 0, 0)))
    _assert_names(str(info.value), "args[1]['w']", "must return 2 values",
                  "Currently returning 3 values", "(4, 8)")


@pytest.mark.parametrize("index_map, python", [
    (lambda i, j: (i, 0), "missing 1 required positional argument: 'j'"),
    (lambda: (0, 0), "takes 0 positional arguments but 1 was given"),
], ids=["too-many-args", "no-args"])
def test_index_map_taking_the_wrong_number_of_arguments(index_map, python):
    """Python's own message first (as upstream shows it), then the operand and shapes."""
    with pytest.raises(TypeError) as info:
        _with_nested_input(pl.BlockSpec((2, 8), index_map))
    _assert_names(str(info.value), python, "args[1]['w']", "called with 1 positional",
                  "Blocked(2), Blocked(8)", "(4, 8)")


@pytest.mark.parametrize("returned, type_str", [(5.0, "float32[]"),
                                                (jnp.arange(2), "int32[2]")])
def test_index_map_must_return_integer_scalars(returned, type_str):
    with pytest.raises(ValueError) as info:
        _with_nested_input(pl.BlockSpec((2, 8), lambda i: (returned, 0)))
    _assert_names(str(info.value), "args[1]['w']", "must return integer scalars",
                  "Output[0] has type", type_str, "(4, 8)")


def test_index_map_capturing_an_array_constant():
    table = np.array([1, 0], np.int32)
    with pytest.raises(ValueError) as info:
        _with_nested_input(pl.BlockSpec((2, 8), lambda i: (jnp.asarray(table)[i], 0)))
    _assert_names(str(info.value), "args[1]['w']", "must not capture constants: [int32[2]]",
                  "scalar-prefetch")


def test_index_map_arity_counts_scalar_prefetch_operands():
    x = jnp.zeros((4, 8), jnp.float32)
    gs = pl.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(2,),
        in_specs=[pl.BlockSpec((2, 8), lambda i: (i, 0))],  # forgot the prefetch ref
        out_specs=pl.BlockSpec((2, 8), lambda i, s: (i, 0)),
    )
    with pytest.raises(TypeError, match=r"args\[1\].*2 positional arguments.*1 grid indices "
                                        r"and 1 scalar-prefetch"):
        pl.pallas_call(lambda s, x, o: None, SDS((4, 8), jnp.float32), grid_spec=gs,
                       interpret=True)(jnp.zeros((2,), jnp.int32), x)


def test_element_block_that_neither_fits_nor_may_pad():
    with pytest.raises(ValueError) as info:
        _with_nested_input(pl.BlockSpec((pl.Element(6, padding=(0, 1)), 8),
                                        lambda i: (0, 0)))
    _assert_names(str(info.value), "args[1]['w']", "Element", "(4, 8)", "padding=(0, 1)")
    assert re.search(r"Element\(6", str(info.value))


def test_element_block_that_fits_with_enough_padding_is_accepted():
    _with_nested_input(pl.BlockSpec((pl.Element(6, padding=(1, 1)), 8), lambda i: (0, 0)))


def test_non_positive_block_size():
    with pytest.raises(ValueError) as info:
        _with_nested_input(pl.BlockSpec((0, 8), lambda i: (0, 0)))
    _assert_names(str(info.value), "args[1]['w']", "(0, 8)", "(4, 8)")


def test_bounded_slice_index_map_must_return_ds():
    with pytest.raises(ValueError, match=r"args\[1\]\['w'\].*pl.ds"):
        _with_nested_input(pl.BlockSpec((pl.BoundedSlice(2), 8), lambda i: (i, 0)))


def test_slice_returned_for_a_blocked_dim_is_rejected():
    with pytest.raises(ValueError, match=r"args\[1\]\['w'\].*BoundedSlice"):
        _with_nested_input(pl.BlockSpec((2, 8), lambda i: (pl.ds(i, 2), 0)))


def test_block_dim_of_an_unknown_type():
    with pytest.raises(TypeError, match="block dimension"):
        _with_nested_input(pl.BlockSpec(("2", 8), lambda i: (0, 0)))


def test_spec_that_is_not_a_blockspec():
    with pytest.raises(TypeError, match=r"args\[1\]\['w'\].*BlockSpec"):
        _with_nested_input("not a spec")


def test_in_specs_count_must_match_the_inputs():
    x = jnp.zeros((4, 8), jnp.float32)
    spec = pl.BlockSpec((2, 8), lambda i: (i, 0))
    with pytest.raises(ValueError) as info:
        pl.pallas_call(_two_in_kernel, SDS((4, 8), jnp.float32), grid=(2,), in_specs=[spec],
                       out_specs=spec, interpret=True)(x, x)
    _assert_names(str(info.value), "Pytree for `in_specs` and `inputs` do not match",
                  "`in_specs` is a tuple of length 1 but `inputs` is a tuple of length 2",
                  "args[1]: (4, 8) float32")


def test_in_specs_must_have_the_inputs_structure_not_a_prefix_of_it():
    """As upstream: one BlockSpec does not stand for a whole dict of operands."""
    x = jnp.zeros((4, 8), jnp.float32)
    spec = pl.BlockSpec((2, 8), lambda i: (i, 0))
    with pytest.raises(ValueError, match=r"at \[1\], `in_specs` is a pytree leaf but "
                                         r"`inputs` is a dict with keys \['w'\]"):
        pl.pallas_call(_two_in_kernel, SDS((4, 8), jnp.float32), grid=(2,),
                       in_specs=[spec, spec], out_specs=spec, interpret=True)(x, {"w": x})


def test_in_specs_must_be_a_sequence():
    spec = pl.BlockSpec((2, 8), lambda i: (i, 0))
    with pytest.raises(ValueError, match="`in_specs` must be a tuple or a list"):
        pl.pallas_call(_copy_kernel, SDS((4, 8), jnp.float32), in_specs=spec)


def test_out_specs_count_must_match_out_shape():
    x = jnp.zeros((4, 8), jnp.float32)
    spec = pl.BlockSpec((2, 8), lambda i: (i, 0))
    with pytest.raises(ValueError, match="`out_specs` is a tuple of length 1 but `out_shape` "
                                         "is a tuple of length 2"):
        pl.pallas_call(lambda x, a, b: None, (SDS((4, 8), jnp.float32),) * 2, grid=(2,),
                       in_specs=[spec], out_specs=(spec,), interpret=True)(x)


def test_out_shape_given_as_a_list_returns_a_tuple():
    x = jnp.ones((4, 8), jnp.float32)
    out = pl.pallas_call(_copy_kernel, [SDS((4, 8), jnp.float32)], interpret=True)(x)
    assert isinstance(out, tuple) and len(out) == 1


@pytest.mark.parametrize("bad", ["a", "2", 1.5, 2.0, None])
def test_grid_must_be_made_of_ints(bad):
    """Strings and floats are refused, not rounded (``grid=(1.5,)`` used to run one
    program and leave the rest of the output unwritten)."""
    with pytest.raises(TypeError, match=r"grid\[1\] must be an int .*got .*"
                                        + type(bad).__name__):
        pl.pallas_call(_copy_kernel, SDS((4,), jnp.float32), grid=(1, bad),
                       interpret=True)(jnp.zeros((4,), jnp.float32))


def test_grid_accepts_numpy_and_jax_integers():
    x = jnp.arange(8.0)
    spec = pl.BlockSpec((4,), lambda i: (i,))
    for n in (np.int64(2), jnp.int32(2)):
        out = pl.pallas_call(_copy_kernel, SDS((8,), jnp.float32), grid=(n,),
                             in_specs=[spec], out_specs=spec, interpret=True)(x)
        np.testing.assert_array_equal(out, x)


def test_grid_must_not_be_negative():
    with pytest.raises(ValueError, match="grid dimension"):
        pl.pallas_call(_copy_kernel, SDS((4,), jnp.float32), grid=(-1,),
                       interpret=True)(jnp.zeros((4,), jnp.float32))


# --------------------------------------------------------------------------------------
# The kernel body


def test_kernel_returning_a_value():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]
        return x_ref[...]

    with pytest.raises(ValueError) as info:
        pl.pallas_call(kernel, SDS((4, 8), jnp.float32), interpret=True)(
            jnp.zeros((4, 8), jnp.float32))
    _assert_names(str(info.value), "The kernel function in the pallas_call kernel at",
                  "should return None", "returns float32[4,8]")


def test_kernel_missing_a_parameter_says_what_pallas_call_passes():
    kernel = lambda a_ref, b_ref, c_ref: None  # noqa: E731 (one output ref too few)

    with pytest.raises(TypeError) as info:
        pl.pallas_call(kernel, SDS((4, 8), jnp.float32), interpret=True)(
            jnp.zeros((4, 8), jnp.float32))
    _assert_names(str(info.value), "pallas_call <lambda> at test_errors.py",
                  "2 positional argument(s)", "1 input ref(s)", "1 output ref(s)",
                  "0 scratch ref(s)", "0 scalar-prefetch operand(s)",
                  "<lambda>(a_ref, b_ref, c_ref)",
                  # Python's own message comes first (upstream's, which users match)
                  "<lambda>() missing 1 required positional argument: 'c_ref'")


def test_kernel_with_too_many_parameters_counts_prefetch_and_scratch():
    def kernel(s_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    grid_spec = pl.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(1,), in_specs=[pl.BlockSpec((4, 8), lambda i, s: (0, 0))],
        out_specs=pl.BlockSpec((4, 8), lambda i, s: (0, 0)),
        scratch_shapes=[pl.ANY((4, 8), jnp.float32)])
    with pytest.raises(TypeError) as info:
        pl.pallas_call(kernel, SDS((4, 8), jnp.float32), grid_spec=grid_spec,
                       interpret=True)(jnp.zeros((1,), jnp.int32), jnp.zeros((4, 8)))
    _assert_names(str(info.value), "pallas_call kernel at test_errors.py",
                  "4 positional argument(s)", "1 scalar-prefetch operand(s)",
                  "1 input ref(s)", "1 output ref(s)", "1 scratch ref(s)",
                  "kernel(s_ref, x_ref, o_ref)",
                  "kernel() takes 3 positional arguments but 4 were given")


@pytest.mark.parametrize("value_shape", [(4,), (3, 8), (8, 4)])
def test_store_of_the_wrong_shape_names_the_ref_and_both_shapes(value_shape):
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros(value_shape, jnp.float32)

    with pytest.raises(ValueError) as info:
        pl.pallas_call(kernel, SDS((4, 8), jnp.float32), interpret=True)(
            jnp.zeros((4, 8), jnp.float32))
    _assert_names(str(info.value), "outputs", "(4, 8)", str(value_shape))


def test_store_of_the_wrong_dtype_names_the_ref_and_both_dtypes():
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros((4, 8), jnp.int32)

    with pytest.raises(ValueError) as info:
        pl.pallas_call(kernel, SDS((4, 8), jnp.float32), interpret=True)(
            jnp.zeros((4, 8), jnp.float32))
    _assert_names(str(info.value), "outputs", "float32", "int32")


def test_store_into_a_sliced_view_of_the_wrong_shape():
    def kernel(x_ref, o_ref):
        o_ref[1:3] = jnp.zeros((3, 8), jnp.float32)

    with pytest.raises(ValueError) as info:
        pl.pallas_call(kernel, SDS((4, 8), jnp.float32), interpret=True)(
            jnp.zeros((4, 8), jnp.float32))
    _assert_names(str(info.value), "outputs", "(2, 8)", "(3, 8)")


def test_store_into_a_nested_output_names_its_path():
    def kernel(x_ref, outs):
        outs["b"][...] = jnp.zeros((2,), jnp.float32)

    with pytest.raises(ValueError) as info:
        pl.pallas_call(kernel, {"a": SDS((4,), jnp.float32), "b": SDS((4,), jnp.float32)},
                       interpret=True)(jnp.zeros((4,), jnp.float32))
    _assert_names(str(info.value), "outputs['b']", "(4,)", "(2,)")


def test_pl_store_of_the_wrong_shape_names_the_ref():
    def kernel(x_ref, o_ref):
        pl.store(o_ref, jnp.zeros((3, 8), jnp.float32))

    with pytest.raises(ValueError) as info:
        pl.pallas_call(kernel, SDS((4, 8), jnp.float32), interpret=True)(
            jnp.zeros((4, 8), jnp.float32))
    _assert_names(str(info.value), "outputs", "(4, 8)", "(3, 8)")


def test_kernel_capturing_an_array_constant():
    table = jnp.arange(4, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + table

    with pytest.raises(ValueError, match=r"The kernel function .* captures constants \[float32\[4\]\].*inputs"):
        pl.pallas_call(kernel, SDS((4,), jnp.float32), interpret=True)(
            jnp.zeros((4,), jnp.float32))


def test_program_id_of_an_axis_the_grid_does_not_have():
    def kernel(o_ref):
        o_ref[0] = pl.program_id(1)

    with pytest.raises(ValueError, match=r"program_id\(1\).*grid \(2,\)"):
        pl.pallas_call(kernel, SDS((2,), jnp.int32), grid=(2,), in_specs=[],
                       out_specs=pl.BlockSpec((1,), lambda i: (i,)), interpret=True)()


# --------------------------------------------------------------------------------------
# out_shape, operands, aliases


@pytest.mark.parametrize("out_shape,path", [
    ((4, 8), "outputs[0]"),  # a shape, not a shape-and-dtype
    ("float32", "outputs"),
    ([SDS((4,), jnp.float32), 3], "outputs[1]"),
    ({"y": object()}, "outputs['y']"),
])
def test_out_shape_must_be_shape_and_dtype_like(out_shape, path):
    with pytest.raises(TypeError) as info:
        pl.pallas_call(_copy_kernel, out_shape, interpret=True)
    _assert_names(str(info.value), path, "shape-and-dtype")


def test_operand_that_is_not_an_array():
    with pytest.raises(TypeError, match=r"args\[0\]"):
        pl.pallas_call(_copy_kernel, SDS((4,), jnp.float32), interpret=True)("not an array")


def test_aliased_operands_must_agree_in_shape_and_dtype():
    with pytest.raises(ValueError) as info:
        pl.pallas_call(_copy_kernel, SDS((4, 8), jnp.int32), input_output_aliases={0: 0},
                       interpret=True)(jnp.zeros((4, 8), jnp.float32))
    _assert_names(str(info.value), "the mapping '0:0' referring to input[0] with abstract "
                  "value float32[4,8] (args[0])", "output[0] with a different abstract value "
                  "int32[4,8] (outputs)")


def test_alias_indices_must_exist():
    with pytest.raises(ValueError, match=r"mapping '3:0' with input index 3 outside the "
                                         r"range \[0, 1\)"):
        pl.pallas_call(_copy_kernel, SDS((4,), jnp.float32), input_output_aliases={3: 0},
                       interpret=True)(jnp.zeros((4,), jnp.float32))
    with pytest.raises(ValueError, match=r"mapping '0:2' with output index 2 outside the "
                                         r"range \[0, 1\)"):
        pl.pallas_call(_copy_kernel, SDS((4,), jnp.float32), input_output_aliases={0: 2},
                       interpret=True)(jnp.zeros((4,), jnp.float32))


def test_scratch_shape_that_is_not_a_buffer_type():
    with pytest.raises(TypeError, match=r"scratch_shapes\[0\].*pl.ANY"):
        pl.pallas_call(lambda o, s: None, SDS((4,), jnp.float32), scratch_shapes=[(4,)],
                       interpret=True)()


# --------------------------------------------------------------------------------------
# Backends


_KNOWN = {"triton": "pallas-triton", "mosaic_gpu": "pallas-mosaic-gpu",
          "mosaic_tpu": "pallas-tpu", "mosaic_sparsecore": "pallas-tpu-sparsecore"}


@pytest.fixture
def only_core_backends(monkeypatch, clean_registry):
    """Discovery sees only pallas-core's own entry point, as on a machine where no
    backend package is installed."""
    real = importlib.metadata.entry_points

    def entry_points(**kw):
        eps = real(**kw)
        if kw.get("group") == pallas.plugins.ENTRY_POINT_GROUP:
            return [ep for ep in eps if ep.value.startswith("pallas.")]
        return eps

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    pallas.plugins.reset()
    yield
    monkeypatch.undo()
    pallas.plugins.reset()


@pytest.mark.parametrize("backend", sorted(_KNOWN))
def test_backend_that_is_not_installed_names_the_package_to_install(backend,
                                                                    only_core_backends):
    assert [b.name for b in pallas.plugins.list_backends()] == ["interpret"]
    with pytest.raises(pallas.plugins.BackendNotFoundError) as info:
        pl.pallas_call(_copy_kernel, SDS((4,), jnp.float32), backend=backend)
    _assert_names(str(info.value), repr(backend), f"pip install {_KNOWN[backend]}")


def test_unknown_backend_lists_the_installed_ones():
    with pytest.raises(pallas.plugins.BackendNotFoundError) as info:
        pl.pallas_call(_copy_kernel, SDS((4,), jnp.float32), backend="no_such_backend")
    _assert_names(str(info.value), "'no_such_backend'", "interpret")


def test_backend_error_is_a_value_error_for_upstream_style_handlers():
    assert issubclass(pallas.plugins.BackendNotFoundError, ValueError)


def test_the_error_comes_before_any_computation():
    calls = []

    def kernel(x_ref, o_ref):
        calls.append(1)
        o_ref[...] = jnp.zeros((3,), jnp.float32)

    with pytest.raises(ValueError):
        jax.jit(pl.pallas_call(kernel, SDS((4,), jnp.float32), interpret=True)).trace(
            np.zeros((4,), np.float32))
    assert calls == [1]  # traced once, never run



@pytest.mark.parametrize("access", ["load", "store"])
@pytest.mark.parametrize("mask_shape", [(16,), (16, 16)])
def test_a_mask_that_does_not_broadcast_to_the_block(access, mask_shape):
    # Upstream's words first ("Cannot broadcast"), then the shapes and the ref.
    def kernel(x_ref, m_ref, o_ref):
        if access == "load":
            o_ref[...] = pl.load(x_ref, mask=m_ref[...], other=0.0)
        else:
            pl.store(o_ref, x_ref[...], mask=m_ref[...])

    f = pl.pallas_call(kernel, SDS((16, 32), jnp.float32), interpret=True)
    x, m = jnp.ones((16, 32)), jnp.ones(mask_shape, jnp.bool_)
    with pytest.raises(ValueError, match=re.escape(
            f"Cannot broadcast the mask of shape {mask_shape} to the shape (16, 32) of "
            f"the {access} of")):
        jax.jit(f).trace(x, m)


def test_a_mask_that_broadcasts_is_taken():
    def kernel(x_ref, m_ref, o_ref):
        o_ref[...] = pl.load(x_ref, mask=m_ref[...], other=-1.0)

    f = pl.pallas_call(kernel, SDS((4, 8), jnp.float32), interpret=True)
    m = jnp.array([[True], [False], [True], [False]])
    out = f(jnp.ones((4, 8)), m)
    np.testing.assert_array_equal(out, np.where(np.asarray(m), 1.0, -1.0) * np.ones((4, 8)))
