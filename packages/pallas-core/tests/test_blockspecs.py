"""BlockSpecs: block dims (None, int, Blocked, Element, Squeezed, BoundedSlice), index
maps, ``no_block_spec``, memory spaces and pipeline modes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl

SDS = jax.ShapeDtypeStruct


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _run(kernel, x, grid, in_spec, out_spec, out_shape=None):
    out_shape = SDS(x.shape, x.dtype) if out_shape is None else out_shape
    return pl.pallas_call(kernel, out_shape, grid=grid, in_specs=[in_spec],
                          out_specs=out_spec, interpret=True)(x)


# --------------------------------------------------------------------------------------
# Blocked (int) dims


def test_int_block_dims_are_blocked_and_index_maps_return_block_indices():
    x = jnp.arange(6 * 8, dtype=jnp.float32).reshape(6, 8)
    seen = []

    def kernel(x_ref, o_ref):
        seen.append(x_ref.shape)
        o_ref[...] = x_ref[...]

    # Reverse the row blocks: block i of the output is block 2 - i of the input.
    out = _run(kernel, x, (3,), pl.BlockSpec((2, 8), lambda i: (2 - i, 0)),
               pl.BlockSpec((2, 8), lambda i: (i, 0)))
    assert seen == [(2, 8)]
    expected = np.concatenate([np.asarray(x)[4:6], np.asarray(x)[2:4], np.asarray(x)[0:2]])
    np.testing.assert_array_equal(out, expected)


def test_explicit_blocked_equals_int():
    x = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)
    a = _run(_copy_kernel, x, (2, 2), pl.BlockSpec((2, 4), lambda i, j: (i, j)),
             pl.BlockSpec((2, 4), lambda i, j: (i, j)))
    b = _run(_copy_kernel, x, (2, 2),
             pl.BlockSpec((pl.Blocked(2), pl.Blocked(4)), lambda i, j: (i, j)),
             pl.BlockSpec((pl.Blocked(2), pl.Blocked(4)), lambda i, j: (i, j)))
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, x)


def test_block_shape_that_does_not_divide_the_array_gives_masked_edge_blocks():
    x = jnp.arange(10 * 3, dtype=jnp.float32).reshape(10, 3)
    spec = pl.BlockSpec((4, 3), lambda i: (i, 0))
    out = _run(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1), x, (3,), spec, spec)
    assert out.shape == (10, 3)
    np.testing.assert_array_equal(out, x + 1)


def test_index_map_may_return_a_single_int_for_a_rank_one_block():
    x = jnp.arange(8, dtype=jnp.float32)
    out = _run(_copy_kernel, x, (4,), pl.BlockSpec((2,), lambda i: i),
               pl.BlockSpec((2,), lambda i: i))
    np.testing.assert_array_equal(out, x)


def test_index_map_may_compute_with_jnp():
    x = jnp.arange(8, dtype=jnp.float32).reshape(4, 2)
    # Swap adjacent row pairs with arithmetic in the index map.
    in_spec = pl.BlockSpec((1, 2), lambda i: (jnp.where(i % 2 == 0, i + 1, i - 1), 0))
    out = _run(_copy_kernel, x, (4,), in_spec, pl.BlockSpec((1, 2), lambda i: (i, 0)))
    np.testing.assert_array_equal(out, np.asarray(x)[[1, 0, 3, 2]])


def test_blockspec_without_index_map_always_uses_block_zero():
    x = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * (pl.program_id(0) + 1).astype(jnp.float32)

    out = _run(kernel, x, (2,), pl.BlockSpec((2, 8)), pl.BlockSpec((2, 8), lambda i: (i, 0)))
    np.testing.assert_array_equal(out[:2], np.asarray(x)[:2])
    np.testing.assert_array_equal(out[2:], np.asarray(x)[:2] * 2)


# --------------------------------------------------------------------------------------
# Squeezed dims (None, pl.Squeezed(), pl.squeezed)


@pytest.mark.parametrize("sq", [None, pl.Squeezed(), pl.squeezed], ids=["None", "Squeezed()", "squeezed"])
def test_squeezed_dims_are_dropped_from_the_kernel_ref(sq):
    x = jnp.arange(3 * 8, dtype=jnp.float32).reshape(3, 8)
    shapes = []

    def kernel(x_ref, o_ref):
        shapes.append((x_ref.shape, o_ref.shape))
        o_ref[...] = x_ref[...] * 2

    spec = pl.BlockSpec((sq, 8), lambda i: (i, 0))
    out = _run(kernel, x, (3,), spec, spec)
    assert shapes == [((8,), (8,))]
    np.testing.assert_array_equal(out, x * 2)


def test_squeezed_middle_dim_selects_one_element_index():
    x = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3)
    # Output row j is input column-slab x[:, 3 - j, :].
    out = _run(
        _copy_kernel, x, (4,),
        pl.BlockSpec((2, None, 3), lambda j: (0, 3 - j, 0)),
        pl.BlockSpec((2, None, 3), lambda j: (0, j, 0)),
    )
    np.testing.assert_array_equal(out, np.asarray(x)[:, ::-1, :])


# --------------------------------------------------------------------------------------
# Element dims: element offsets, padding


def test_element_dims_take_element_offsets():
    x = jnp.arange(10, dtype=jnp.float32)
    # Overlapping windows of 4 starting at 0, 2, 4, 6: each output block i gets sum(window).
    spec = pl.BlockSpec((pl.Element(4),), lambda i: (2 * i,))

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sum(x_ref[...], keepdims=True)

    out = _run(kernel, x, (4,), spec, pl.BlockSpec((1,), lambda i: (i,)),
               out_shape=SDS((4,), jnp.float32))
    xn = np.asarray(x)
    np.testing.assert_array_equal(out, [xn[2 * i : 2 * i + 4].sum() for i in range(4)])


def test_element_padding_offsets_are_into_the_padded_array():
    n = 8
    x = jnp.arange(1, n + 1, dtype=jnp.float32)
    # With padding (1, 1) the index map returns offsets into the padded array: window i
    # covers padded elements i..i+2, i.e. x[i-1..i+1]. Padding is uninitialised (NaN),
    # as upstream's interpret mode.
    spec = pl.BlockSpec((pl.Element(3, padding=(1, 1)),), lambda i: (i,))
    out = _run(_copy_kernel, x, (n,), spec, pl.BlockSpec((None, 3), lambda i: (i, 0)),
               out_shape=SDS((n, 3), jnp.float32))
    xp = np.pad(np.asarray(x), 1, constant_values=np.nan)
    np.testing.assert_array_equal(out, np.stack([xp[i : i + 3] for i in range(n)]))


def test_element_padding_makes_a_zero_boundary_stencil():
    n = 8
    x = jnp.arange(1, n + 1, dtype=jnp.float32)
    # y[i] = x[i-1] + x[i] + x[i+1], zero outside the array; the kernel masks the padding.
    spec = pl.BlockSpec((pl.Element(3, padding=(1, 1)),), lambda i: (i,))

    def kernel(x_ref, o_ref):
        pos = pl.program_id(0) - 1 + jnp.arange(3)
        inside = (pos >= 0) & (pos < n)
        o_ref[...] = jnp.sum(jnp.where(inside, x_ref[...], 0.0), keepdims=True)

    out = _run(kernel, x, (n,), spec, pl.BlockSpec((1,), lambda i: (i,)))
    xp = np.pad(np.asarray(x), 1)
    np.testing.assert_array_equal(out, xp[:-2] + xp[1:-1] + xp[2:])


def test_element_dim_in_two_dimensions_with_blocked_other_dim():
    x = jnp.arange(6 * 4, dtype=jnp.float32).reshape(6, 4)
    # rows 1..4 (Element offset 1, size 4), column block j.
    in_spec = pl.BlockSpec((pl.Element(4), 2), lambda j: (1, j))
    out = _run(_copy_kernel, x, (2,), in_spec, pl.BlockSpec((4, 2), lambda j: (0, j)),
               out_shape=SDS((4, 4), jnp.float32))
    np.testing.assert_array_equal(out, np.asarray(x)[1:5])


# --------------------------------------------------------------------------------------
# BoundedSlice dims


def test_bounded_slice_reads_and_writes_ragged_row_ranges():
    x = jnp.arange(8 * 2, dtype=jnp.float32).reshape(8, 2)
    starts = jnp.array([0, 3, 5], jnp.int32)
    sizes = jnp.array([3, 2, 3], jnp.int32)
    shapes = []

    def index_map(i, starts_ref, sizes_ref):
        return (pl.ds(starts_ref[i], sizes_ref[i]), 0)

    def kernel(starts_ref, sizes_ref, x_ref, o_ref):
        shapes.append(x_ref.shape)
        o_ref[...] = x_ref[...] * 10 + pl.program_id(0).astype(jnp.float32)

    spec = pl.BlockSpec((pl.BoundedSlice(3), 2), index_map)
    out = pl.pallas_call(
        kernel, SDS(x.shape, x.dtype), interpret=True,
        grid_spec=pl.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=(3,),
                                            in_specs=[spec], out_specs=spec),
    )(starts, sizes, x)
    assert shapes == [(3, 2)]
    segment = np.repeat(np.arange(3), np.asarray(sizes))
    np.testing.assert_array_equal(out, np.asarray(x) * 10 + segment[:, None])


def test_bounded_slice_writes_only_size_rows():
    x = jnp.ones((4, 2), jnp.float32)
    # Each program writes only the first row of its 2-row bounded block.
    spec_in = pl.BlockSpec((2, 2), lambda i: (i, 0))
    spec_out = pl.BlockSpec((pl.BoundedSlice(2), 2), lambda i: (pl.ds(2 * i, 1), 0))

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 5

    out = _run(kernel, x, (2,), spec_in, spec_out)
    out = np.asarray(out)
    np.testing.assert_array_equal(out[[0, 2]], 5 * np.ones((2, 2)))
    assert np.isnan(out[[1, 3]]).all()  # never written: uninitialised (NaN)


# --------------------------------------------------------------------------------------
# no_block_spec, block_shape=None, memory_space


def test_no_block_spec_passes_the_whole_array_at_every_grid_point():
    x = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)
    table = jnp.arange(4, dtype=jnp.float32)

    def kernel(x_ref, t_ref, o_ref):
        o_ref[...] = x_ref[...] + jnp.sum(t_ref[...])

    out = pl.pallas_call(
        kernel, SDS(x.shape, x.dtype), grid=(2,),
        in_specs=[pl.BlockSpec((2, 8), lambda i: (i, 0)), pl.no_block_spec],
        out_specs=pl.BlockSpec((2, 8), lambda i: (i, 0)), interpret=True,
    )(x, table)
    np.testing.assert_array_equal(out, x + 6)


def test_none_in_in_specs_means_no_block_spec():
    x = jnp.arange(8, dtype=jnp.float32)
    spec = pl.BlockSpec((4,), lambda i: (i,))

    def kernel(t_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + jnp.sum(t_ref[...])

    out = pl.pallas_call(kernel, SDS((8,), jnp.float32), grid=(2,), in_specs=[None, spec],
                         out_specs=spec, interpret=True)(jnp.ones(3, jnp.float32), x)
    np.testing.assert_array_equal(out, x + 3)


def test_an_absent_operand_takes_a_none_spec_and_reaches_the_kernel_as_none():
    """``f(a, b, None)`` (upstream's Hopper matmul passes ``c=None``): the ``None``
    operand is an empty pytree, its spec ``None`` stands for no operand, and the kernel
    gets ``None`` in its place, as with ``pl.kernel``'s specs built by ``tree_map``."""
    x = jnp.arange(8, dtype=jnp.float32)
    spec = pl.BlockSpec((4,), lambda i: (i,))

    def kernel(x_ref, c_ref, o_ref):
        assert c_ref is None
        o_ref[...] = x_ref[...] + 1

    out = pl.pallas_call(kernel, SDS((8,), jnp.float32), grid=(2,), in_specs=[spec, None],
                         out_specs=spec, interpret=True)(x, None)
    np.testing.assert_array_equal(out, x + 1)

    from pallas.plugins import CoreMesh

    @functools.partial(pl.kernel, out_type=SDS((8,), jnp.float32), mesh=CoreMesh(core=1),
                       interpret=True)
    def whole(x_ref, c_ref, o_ref):
        assert c_ref is None
        o_ref[...] = x_ref[...] * 2

    np.testing.assert_array_equal(whole(x, None), x * 2)


def test_blockspec_without_block_shape_is_the_whole_array():
    x = jnp.arange(16, dtype=jnp.float32).reshape(2, 8)
    shapes = []

    def kernel(x_ref, o_ref):
        shapes.append(x_ref.shape)

        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = x_ref[...] * 2

    out = _run(kernel, x, (3,), pl.BlockSpec(), pl.BlockSpec())
    assert shapes == [(2, 8)]
    np.testing.assert_array_equal(out, x * 2)


def test_memory_space_is_the_kernel_refs_memory_space():
    x = jnp.arange(8, dtype=jnp.float32)
    spaces = []

    def kernel(x_ref, o_ref):
        spaces.append(jax.typeof(x_ref).memory_space)
        o_ref[...] = x_ref[...]

    out = pl.pallas_call(
        kernel, SDS(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.MemorySpace.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.MemorySpace.ANY), interpret=True,
    )(x)
    assert spaces == [pl.MemorySpace.ANY]
    np.testing.assert_array_equal(out, x)


def test_a_block_without_memory_space_is_a_default_space_ref():
    # As upstream: the backend picks where DEFAULT blocks live; the type says so.
    x = jnp.arange(8, dtype=jnp.float32)
    types = []

    def kernel(x_ref, o_ref):
        types.append(jax.typeof(x_ref))
        o_ref[...] = x_ref[...]

    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype),
                         in_specs=[pl.BlockSpec((8,), lambda: (0,))], interpret=True)(x)
    assert types[0].memory_space is pl.MemorySpace.DEFAULT
    assert types[0].str_short() == "Ref<default>{float32[8]}"
    np.testing.assert_array_equal(out, x)


def test_passing_a_block_ref_to_a_jax_primitive_names_its_type():
    def kernel(x_ref, o_ref):
        o_ref[...] = jax.lax.sin(x_ref)

    with pytest.raises(ValueError, match=r"Attempting to pass a Ref Ref<default>"
                                         r"\{float32\[8\]\} to a primitive: sin"):
        pl.pallas_call(kernel, SDS((8,), jnp.float32), interpret=True)(jnp.zeros(8))


def test_memory_ref_helpers_carry_shape_dtype_and_space():
    m = pl.ANY((8, 128), jnp.float32)
    assert isinstance(m, pl.MemoryRef)
    assert m.shape == (8, 128) and m.dtype == jnp.float32
    assert m.memory_space == pl.MemorySpace.ANY
    h = pl.HOST((2,), jnp.int32)
    assert h.memory_space == pl.MemorySpace.HOST and h.dtype == jnp.int32
    assert pl.MemorySpace.ANY((4,), jnp.int8).shape == (4,)


def test_pipeline_mode_buffered_is_accepted_and_does_not_change_results():
    x = jnp.arange(16, dtype=jnp.float32).reshape(4, 4)
    spec = pl.BlockSpec((1, 4), lambda i: (i, 0), pipeline_mode=pl.Buffered(3))
    out = _run(_copy_kernel, x, (4,), spec, pl.BlockSpec((1, 4), lambda i: (i, 0)))
    np.testing.assert_array_equal(out, x)


def test_buffered_rejects_a_zero_buffer_count():
    with pytest.raises(ValueError, match="buffer_count"):
        pl.Buffered(0)


def test_block_shape_must_be_a_sequence():
    with pytest.raises(TypeError, match="block_shape"):
        pl.BlockSpec(8, lambda i: (i,))


def test_replace_makes_a_changed_copy():
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0), memory_space=pl.ANY)
    moved = spec.replace(index_map=lambda i: (0, i))
    assert moved.block_shape == (8, 128) and moved.memory_space is pl.ANY
    assert moved.index_map(3) == (0, 3) and spec.index_map(3) == (3, 0)
