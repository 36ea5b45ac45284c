"""``emit_pipeline``: a grid loop over HBM refs inside a kernel (interpreter and lowering)."""

from __future__ import annotations

import collections
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu


def _matmul_plus_one(x, y, interpret):
    def outer(x_hbm, y_hbm, o_hbm):
        def body(x_ref, y_ref, o_ref):
            o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32) + 1

        pltpu.emit_pipeline(
            body, grid=(2, 3),
            in_specs=[pl.BlockSpec((128, 256), lambda i, j: (i, 0)),
                      pl.BlockSpec((256, 128), lambda i, j: (0, j))],
            out_specs=[pl.BlockSpec((128, 128), lambda i, j: (i, j))],
        )(x_hbm, y_hbm, o_hbm)

    return pl.pallas_call(
        outer, out_shape=jax.ShapeDtypeStruct((256, 384), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
        out_specs=pl.BlockSpec(memory_space=pl.ANY), interpret=interpret,
    )(x, y)


def test_emit_pipeline_interpreter(rng):
    x = jnp.asarray(rng.standard_normal((256, 256)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((256, 384)), jnp.float32)
    np.testing.assert_allclose(_matmul_plus_one(x, y, True), x @ y + 1, rtol=1e-4, atol=1e-3)


def test_emit_pipeline_lowering(lower_tpu, ops):
    x = jnp.zeros((256, 256), jnp.float32)
    y = jnp.zeros((256, 384), jnp.float32)
    _, (m,) = lower_tpu(lambda a, b: _matmul_plus_one(a, b, False), x, y)
    names = collections.Counter(ops(m))
    assert names["scf.for"] == 1 and names["tpu.matmul"] == 1
    assert names["tpu.enqueue_dma"] == 5  # 2 inputs in the prologue and per step, 1 output
    # Per step: the 2 inputs, and the output's other buffer before its block is written
    # into again; after the loop: the last output copy still in flight.
    assert names["tpu.wait_dma2"] == 4 and names["tpu.region"] == 1


def test_emit_pipeline_squeezed_dims_and_revisited_outputs(rng):
    x = jnp.asarray(rng.standard_normal((3, 16, 128)), jnp.float32)

    def outer(x_hbm, o_hbm):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0  # the (8, 128) block of batch b, rows r

        # Grid (rows, batch): the output block depends only on rows and batch.
        pltpu.emit_pipeline(
            body, grid=(2, 3),
            in_specs=[pl.BlockSpec((None, 8, 128), lambda r, b: (b, r, 0))],
            out_specs=[pl.BlockSpec((None, 8, 128), lambda r, b: (b, r, 0))],
        )(x_hbm, o_hbm)

    out = pl.pallas_call(
        outer, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY),
        interpret=True)(x)
    np.testing.assert_allclose(out, x * 2.0)


def _doubled_by_blocks(x, block):
    def outer(x_hbm, o_hbm):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0

        spec = pl.BlockSpec(block, lambda i, j: (i, j))
        grid = tuple(pl.cdiv(n, b) for n, b in zip(x.shape, block))
        pltpu.emit_pipeline(body, grid=grid, in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

    return pl.pallas_call(outer, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY))(x)


@pytest.mark.parametrize("shape, block", [((20, 128), (8, 128)), ((40, 256), (16, 128)),
                                          ((20, 200), (8, 128))])
def test_edge_blocks_copy_only_the_rows_inside_the_array(rng, shape, block):
    """A block size that does not divide the array: the last block hangs over the edge;
    only its part inside the array is copied in and out (each DMA of a static size:
    whole inside the array, the remainder at the edge), so nothing past the edge is
    written."""
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    np.testing.assert_array_equal(_doubled_by_blocks(x, block), np.asarray(x) * 2.0)
    if shape[-1] % block[-1] == 0:  # libtpu refuses DMAs of part of a lane tile
        with pl.emulate_device("tpu:v5e"):
            np.testing.assert_array_equal(_doubled_by_blocks(x, block), np.asarray(x) * 2.0)


# -- emit_pipeline_with_allocations and BufferedRef --------------------------------------


def _two_pipelines_one_allocation(x, y, interpret):
    """Two invocations of one pipeline (x*2+1, then y*2+1) sharing one set of buffers."""
    specs = dict(in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                 out_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))])

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    pipeline, make_allocations = pltpu.emit_pipeline_with_allocations(
        body, grid=(2, 2), **specs)

    def kernel(x_hbm, y_hbm, ox_hbm, oy_hbm):
        def scoped(allocs):
            assert all(isinstance(a, pltpu.BufferedRef) for a in allocs)
            assert allocs[0].is_input and allocs[1].is_output
            assert allocs[0].has_allocated_buffer
            pipeline(x_hbm, ox_hbm, allocations=allocs)
            pipeline(y_hbm, oy_hbm, allocations=allocs)

        pl.run_scoped(scoped, make_allocations(x_hbm, ox_hbm))

    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return pl.pallas_call(
        kernel, out_shape=(shape, shape),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
        out_specs=(pl.BlockSpec(memory_space=pl.ANY),) * 2, interpret=interpret,
    )(x, y)


def test_emit_pipeline_with_allocations_interpreter(rng):
    x = jnp.asarray(rng.standard_normal((16, 256)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((16, 256)), jnp.float32)
    ox, oy = _two_pipelines_one_allocation(x, y, True)
    np.testing.assert_allclose(ox, x * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(oy, y * 2 + 1, rtol=1e-6)


def test_emit_pipeline_with_allocations_lowering(lower_tpu, ops):
    x = jnp.zeros((16, 256), jnp.float32)
    _, (m,) = lower_tpu(lambda a, b: _two_pipelines_one_allocation(a, b, False), x, x)
    names = collections.Counter(ops(m))
    # One allocation region shared by the two pipelines (two loops).
    assert names["tpu.region"] == 1 and names["scf.for"] == 2
    # Per pipeline: 1 input (prologue, step), 1 output; waits: the input, the output's
    # other buffer, and after the loop the last output copy in flight.
    assert names["tpu.enqueue_dma"] == 6 and names["tpu.wait_dma2"] == 6


def test_buffered_ref_allocation_types():
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    a = pltpu.BufferedRef.input(spec, jnp.float32)
    assert isinstance(a, pltpu.BufferedRefBase) and a.is_input and not a.is_output
    assert a.buffer_type == pltpu.BufferType.INPUT and a.buffer_count == 2
    assert a.window_ref.shape == (2, 8, 128) and not a.has_allocated_buffer
    o = pltpu.BufferedRef.output(spec, jnp.bfloat16)
    assert o.is_output and o.window_ref.shape == (2, 8, 128)
    assert o.with_spec(pl.BlockSpec((16, 128), lambda i: (i, 0))).block_shape == (16, 128)
    leaves = jax.tree_util.tree_leaves(
        a, is_leaf=lambda x: isinstance(x, pl.MemoryRef))
    assert len(leaves) == 2
    with pytest.raises(NotImplementedError, match="ACCUMULATOR"):
        pltpu.BufferedRef.create(spec, jnp.float32, pltpu.BufferType.ACCUMULATOR)
    with pytest.raises(NotImplementedError, match="buffer_count=3"):
        pltpu.BufferedRef.input(spec, jnp.float32, buffer_count=3)
    with pytest.raises(TypeError):
        pltpu.BufferedRefBase()


def test_emit_pipeline_rejects_mismatched_allocations():
    specs = dict(in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                 out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])
    pipeline, make_allocations = pltpu.emit_pipeline_with_allocations(
        lambda x, o: None, grid=(2,), **specs)

    def kernel(x_hbm, o_hbm):
        def scoped(allocs):
            pipeline(x_hbm, o_hbm, allocations=allocs)

        bad = [pltpu.BufferedRef.input(specs["in_specs"][0], jnp.bfloat16),
               pltpu.BufferedRef.output(specs["out_specs"][0], jnp.float32)]
        pl.run_scoped(scoped, bad)

    x = jnp.zeros((16, 128), jnp.float32)
    with pytest.raises(Exception, match="allocation 0 holds bfloat16"):
        pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       out_specs=pl.BlockSpec(memory_space=pl.ANY), interpret=True)(x)


def test_pipeline_call_options_not_implemented_raise():
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    pipeline = pltpu.emit_pipeline(lambda x, o: None, grid=(2,), in_specs=[spec],
                                   out_specs=[spec])

    def kernel(x_hbm, o_hbm):
        pipeline(x_hbm, o_hbm, first_cycle=True)

    x = jnp.zeros((16, 128), jnp.float32)
    with pytest.raises(NotImplementedError, match="first_cycle"):
        pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       out_specs=pl.BlockSpec(memory_space=pl.ANY), interpret=True)(x)


def _overlapping_row_windows(x, interpret):
    """Three 16-row windows of ``x`` starting every 8 rows (pl.Element rows), doubled."""
    def outer(x_hbm, o_hbm):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0

        pltpu.emit_pipeline(
            body, grid=(3,),
            in_specs=[pl.BlockSpec((pl.Element(16), 128), lambda i: (i * 8, 0))],
            out_specs=[pl.BlockSpec((None, 16, 128), lambda i: (i, 0, 0))],
        )(x_hbm, o_hbm)

    return pl.pallas_call(
        outer, out_shape=jax.ShapeDtypeStruct((3, 16, 128), x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY),
        interpret=interpret)(x)


def test_emit_pipeline_element_dims_take_element_offsets(rng, lower_tpu, ops):
    x = jnp.asarray(rng.standard_normal((32, 128)), jnp.float32)
    want = np.stack([np.asarray(x)[i * 8:i * 8 + 16] * 2.0 for i in range(3)])
    np.testing.assert_allclose(_overlapping_row_windows(x, True), want)
    _, (m,) = lower_tpu(lambda a: _overlapping_row_windows(a, False), x)
    assert "tpu.enqueue_dma" in ops(m)


def test_emit_pipeline_rejects_padded_element_dims():
    def outer(x_hbm, o_hbm):
        pltpu.emit_pipeline(
            lambda a, b: None, grid=(2,),
            in_specs=[pl.BlockSpec((pl.Element(16, padding=(8, 8)), 128), lambda i: (i, 0))],
            out_specs=[pl.BlockSpec((16, 128), lambda i: (i, 0))])(x_hbm, o_hbm)

    with pytest.raises(NotImplementedError, match=r"Element\(16, padding=\(8, 8\)\).*padding"):
        pl.pallas_call(outer, out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
                       in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       out_specs=pl.BlockSpec(memory_space=pl.ANY),
                       interpret=True)(jnp.zeros((16, 128)))


# -- the generated Mosaic, run by the executor ------------------------------------------


def _emulate(f, *args):
    """The one ``pallas_call`` of ``f``, lowered by ``mosaic_tpu`` and run by the executor."""
    from pallas.plugins import KernelRequest, get_backend
    from pallas_conformance import pallas_call_eqns

    (eqn,) = pallas_call_eqns(jax.make_jaxpr(f)(*args))
    p = eqn.params
    return get_backend("mosaic_tpu").emulate(KernelRequest.from_params(p, p["compiler_params"]),
                                             *args)


def _last_block_per_row(x):
    """Grid (rows, cols) whose output block depends on the row only: it stays in one
    buffer over a row's steps and is copied out when the row changes."""
    def outer(x_hbm, o_hbm):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0

        pltpu.emit_pipeline(body, grid=(2, 3),
                            in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                            out_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, 0))],
                            )(x_hbm, o_hbm)

    return pl.pallas_call(
        outer, out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY),
    )(x)


def test_double_buffered_outputs_land_when_emulated(rng):
    """Outputs are double-buffered: each block is copied out when the next step maps
    elsewhere, the other buffer is waited for before reuse, and every copy in flight is
    waited for after the loop (so two pipelines can share the buffers)."""
    x = jnp.asarray(rng.standard_normal((256, 256)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((256, 384)), jnp.float32)
    (out,) = _emulate(lambda a, b: _matmul_plus_one(a, b, False), x, y)
    np.testing.assert_allclose(out, x @ y + 1, rtol=1e-4, atol=1e-3)
    a = jnp.asarray(rng.standard_normal((16, 256)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((16, 256)), jnp.float32)
    ox, oy = _emulate(lambda a, b: _two_pipelines_one_allocation(a, b, False), a, b)
    np.testing.assert_allclose(ox, a * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(oy, b * 2 + 1, rtol=1e-6)
    c = jnp.asarray(rng.standard_normal((16, 384)), jnp.float32)
    (o,) = _emulate(_last_block_per_row, c)
    np.testing.assert_allclose(o, c[:, 256:] * 2, rtol=1e-6)


def test_program_id_in_a_pipeline_body_is_the_pipelines(rng):
    # As upstream: inside the body, pl.program_id(a) is the pipeline's index along a.
    def kernel(x_hbm, o_hbm):
        def body(x_ref, o_ref):
            i = pl.program_id(0)
            pltpu.sync_copy(x_ref, o_ref.at[:, pl.ds(i * 128, 128)])
            del o_ref

        pltpu.emit_pipeline(body, grid=(4,),
                            in_specs=pl.BlockSpec((8, 128), lambda i: (0, i)),
                            out_specs=pl.BlockSpec((8, 512), lambda i: (0, 0)))(x_hbm, o_hbm)

    x = jnp.arange(8 * 512, dtype=jnp.int32).reshape(8, 512)
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 512), jnp.int32),
                          in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
                          out_specs=pl.BlockSpec(memory_space=pltpu.HBM))
    np.testing.assert_array_equal(call(x), x)
    with pl.emulate_device("tpu:v5e"):
        np.testing.assert_array_equal(call(x), x)


@pytest.mark.parametrize("grid", [(0, 2), (2, -1)])
def test_emit_pipeline_refuses_an_empty_grid(grid):
    with pytest.raises(ValueError, match="All elements in the grid must be strictly positive"):
        pltpu.emit_pipeline(lambda o_ref: None, grid=grid,
                            out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)))


@pytest.mark.parametrize("num_cores", [1, 2])
def test_emit_pipeline_splits_a_parallel_dimension_over_cores(num_cores):
    """``core_axis_name``: each core runs its share of the first parallel dimension its
    number divides; the body's program ids are its own (upstream's megacore pipeline)."""
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=num_cores)
    x = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(32, 128)

    @pl.kernel(mesh=mesh, out_type=jax.ShapeDtypeStruct((32, 128), jnp.float32))
    def add_ids(x_hbm, o_hbm):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1000.0 * pl.program_id(0) + pl.num_programs(0)

        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        pltpu.emit_pipeline(body, grid=(4,), in_specs=[spec], out_specs=[spec],
                            core_axis_name="core",
                            dimension_semantics=(pltpu.PARALLEL,))(x_hbm, o_hbm)

    local = 4 // num_cores
    ids = np.repeat(np.arange(4) % local, 8)[:, None]
    np.testing.assert_array_equal(add_ids(x), np.asarray(x) + 1000.0 * ids + local)


def test_emit_pipeline_refuses_a_split_it_cannot_make():
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=2)

    @pl.kernel(mesh=mesh, out_type=jax.ShapeDtypeStruct((24, 128), jnp.float32))
    def k(x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        pltpu.emit_pipeline(lambda x, o: None, grid=(3,), in_specs=[spec], out_specs=[spec],
                            core_axis_name="core",
                            dimension_semantics=(pltpu.PARALLEL,))(x_hbm, o_hbm)

    with pytest.raises(NotImplementedError, match="parallel grid dimension whose size"):
        k(jnp.zeros((24, 128)))


def test_emit_pipeline_takes_pytrees_of_specs_and_refs():
    """An operand may be a pytree of refs with a pytree of BlockSpecs (upstream's fusible
    matmul passes each fused operand's values so); the body gets block refs alike."""
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))

    def outer(a_hbm, b_hbm, c_hbm, o_hbm):
        def body(ab, c, o):
            o[...] = ab["a"][...] * ab["b"][0][...] + (c[...] if c is not None else 0)

        pltpu.emit_pipeline(body, grid=(2,), in_specs=({"a": spec, "b": (spec,)}, spec),
                            out_specs=[spec])({"a": a_hbm, "b": (b_hbm,)}, c_hbm, o_hbm)

    a, b, c = (jnp.full((16, 128), v, jnp.float32) for v in (2.0, 3.0, 1.0))
    out = pl.pallas_call(
        outer, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 3,
        out_specs=pl.BlockSpec(memory_space=pl.ANY))(a, b, c)
    np.testing.assert_array_equal(out, 7.0)


def test_a_spec_in_any_memory_passes_the_operand_through_unbuffered(rng, lower_tpu, ops):
    # As upstream: a spec whose memory space is where the operand already is (ANY/HBM)
    # gives the body the operand's ref itself, which it reads by DMA.
    x = jnp.asarray(rng.standard_normal((4 * 8, 128)), jnp.float32)
    table = jnp.asarray(rng.standard_normal((8, 128)), jnp.float32)

    def call(x, table, interpret):
        def outer(x_hbm, t_hbm, o_hbm):
            def body(x_ref, t_ref, o_ref, buf, sem):
                pltpu.async_copy(t_ref, buf, sem).wait()
                o_ref[...] = x_ref[...] + buf[...]

            def scoped(buf, sem):
                pltpu.emit_pipeline(
                    lambda x_ref, t_ref, o_ref: body(x_ref, t_ref, o_ref, buf, sem),
                    grid=(4,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0)),
                                         pl.BlockSpec(memory_space=pl.ANY)],
                    out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                )(x_hbm, t_hbm, o_hbm)

            pl.run_scoped(scoped, pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA)

        return pl.pallas_call(
            outer, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
            out_specs=pl.BlockSpec(memory_space=pl.ANY), interpret=interpret)(x, table)

    want = np.asarray(x) + np.tile(np.asarray(table), (4, 1))
    np.testing.assert_allclose(call(x, table, True), want, rtol=1e-6)
    _, (m,) = lower_tpu(lambda a, b: call(a, b, False), x, table)
    # x's blocks in the prologue and per step, the output's, and the body's own copy.
    assert collections.Counter(ops(m))["tpu.enqueue_dma"] == 4


# -- pl.BoundedSlice block dims ---------------------------------------------------------


def _rows_by_bounds(x, bounds, *, out_rows=None):
    """``emit_pipeline`` whose step ``i`` doubles rows ``bounds[i]:bounds[i + 1]`` of
    ``x`` (read from SMEM): ``pl.BoundedSlice(8)`` blocks of sizes known at run time."""
    def outer(bounds_ref, x_hbm, o_hbm):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0

        spec = pl.BlockSpec((pl.BoundedSlice(8), 128), lambda i: (
            pl.ds(bounds_ref[i], bounds_ref[i + 1] - bounds_ref[i]), 0))
        pltpu.emit_pipeline(body, grid=(len(bounds) - 1,), in_specs=[spec],
                            out_specs=spec)(x_hbm, o_hbm)

    return pl.pallas_call(
        outer, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
    )(jnp.asarray(bounds, jnp.int32), x)


@pytest.mark.parametrize("bounds", [(0, 3, 8, 16), (0, 5, 11, 16), (0, 8, 9, 16)])
def test_bounded_slice_blocks_copy_only_their_rows(rng, bounds):
    """A ``BoundedSlice(n)`` block is ``pl.ds(start, size)`` of the array with ``size <= n``
    known only at run time: its buffer holds ``n`` rows, only ``size`` are copied in and
    out, so neighbouring blocks of other sizes do not overwrite each other."""
    x = jnp.asarray(rng.standard_normal((16, 128)), jnp.float32)
    np.testing.assert_array_equal(_rows_by_bounds(x, bounds), np.asarray(x) * 2.0)
    with pl.emulate_device("tpu:v5e"):  # the Mosaic it lowers to, run by the executor
        np.testing.assert_array_equal(_rows_by_bounds(x, bounds), np.asarray(x) * 2.0)


def _static_bounded_window(x):
    def outer(x_hbm, o_hbm):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...]

        pltpu.emit_pipeline(
            body, grid=(1,),
            in_specs=[pl.BlockSpec((pl.BoundedSlice(8), 128), lambda i: (pl.ds(4, 8), 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))(x_hbm, o_hbm)

    return pl.pallas_call(
        outer, out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY))(x)


def test_bounded_slice_of_static_size_reads_its_window(lower_tpu, ops):
    x = jnp.arange(16 * 128, dtype=jnp.int32).reshape(16, 128)
    np.testing.assert_array_equal(_static_bounded_window(x), np.asarray(x)[4:12])
    _, (m,) = lower_tpu(_static_bounded_window, x)
    assert "tpu.enqueue_dma" in ops(m)


@pytest.mark.parametrize("index, error", [
    (lambda i: (0, 0), "Must return a pl.ds from the index_map for a BoundedSlice dimension"),
    (lambda i: (pl.ds(0, 9), 0), r"size 9, outside the bound \[0, 8\]"),
    (lambda i: (pl.ds(0, 8), pl.ds(0, 128)), "only BoundedSlice dims take one"),
])
def test_bounded_slice_index_maps_must_return_a_slice_within_the_bound(index, error):
    def outer(x_hbm, o_hbm):
        pltpu.emit_pipeline(lambda x, o: None, grid=(1,),
                            in_specs=[pl.BlockSpec((pl.BoundedSlice(8), 128), index)],
                            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))(x_hbm, o_hbm)

    call = pl.pallas_call(outer, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY))
    with pytest.raises(ValueError, match=error):
        jax.jit(call).trace(jax.ShapeDtypeStruct((16, 128), jnp.float32))


# -- PRNG keys and SMEM/KEY specs -------------------------------------------------------


def _uniform(key_ref, o_ref):
    o_ref[...] = jax.random.uniform(key_ref[...], shape=o_ref.shape)


def _uniform_through_a_pipeline(key, space):
    """``jax.random.uniform`` on a key that an ``emit_pipeline`` (grid ``()``) copies from
    HBM into a buffer of ``space``."""
    def outer(key_hbm, o_hbm):
        pltpu.emit_pipeline(_uniform, grid=(), in_specs=[pl.BlockSpec(memory_space=space)],
                            out_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)])(key_hbm, o_hbm)

    return pl.pallas_call(outer, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
                          out_specs=pl.BlockSpec(memory_space=pltpu.HBM))(key)


@pytest.mark.parametrize("space", [pltpu.SMEM, pl.MemorySpace.KEY])
@pytest.mark.parametrize("emulated", [False, True])
def test_a_prng_key_goes_through_a_pipeline(space, emulated):
    """As upstream: a typed key (a Pallas TPU key, a threefry key) is a pipeline operand
    like any other; in SMEM or ``pl.MemorySpace.KEY`` (SMEM for the TPU) its draws are
    those of the key passed straight to the kernel (threefry: those of jax.random)."""
    pallas_key = pltpu.to_pallas_key(jax.random.key(0))
    threefry_key = jax.random.key(42)
    direct = pl.pallas_call(_uniform, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                            out_specs=pl.BlockSpec(memory_space=pltpu.VMEM))
    with pl.emulate_device("tpu:v5e") if emulated else contextlib.nullcontext():
        np.testing.assert_array_equal(_uniform_through_a_pipeline(pallas_key, space),
                                      direct(pallas_key))
        np.testing.assert_array_equal(_uniform_through_a_pipeline(threefry_key, space),
                                      jax.random.uniform(threefry_key, (8, 128)))


@pytest.mark.parametrize("space, want", [
    (pltpu.SMEM, pltpu.SMEM), (pl.MemorySpace.KEY, pltpu.SMEM), (None, pltpu.VMEM),
    (pltpu.VMEM, pltpu.VMEM), (pl.ANY, pltpu.VMEM)])
def test_operand_buffers_live_in_the_specs_memory(space, want):
    """An SMEM spec's (and a KEY spec's) blocks are buffered in SMEM; others in VMEM."""
    spec = pl.BlockSpec((None, 128), lambda i: (i, 0), memory_space=space)
    ref = jax.ShapeDtypeStruct((4, 128), jnp.int32)
    _, make_allocations = pltpu.emit_pipeline_with_allocations(
        lambda x: None, grid=(4,), in_specs=[spec])
    (alloc,) = make_allocations(ref)
    assert alloc.window_ref.memory_space is want
    assert alloc.window_ref.shape == (2, 128)


def test_the_emulate_level_takes_and_returns_typed_keys():
    """The backend's ``emulate`` (the conformance level) gives a typed key operand to the
    executor as its key data, and returns a key result as a key."""
    key = jax.random.key(42)

    def f(k):
        def kernel(key_ref, o_ref, key_out):
            o_ref[...] = jax.random.uniform(key_ref[...], shape=o_ref.shape)
            key_out[...] = key_ref[...]

        smem = pl.BlockSpec(memory_space=pltpu.SMEM)
        return pl.pallas_call(
            kernel, in_specs=[smem], out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM), smem),
            out_shape=(jax.ShapeDtypeStruct((8, 128), jnp.float32),
                       jax.ShapeDtypeStruct((), key.dtype)))(k)

    draws, key_out = _emulate(f, key)
    np.testing.assert_array_equal(draws, jax.random.uniform(key, (8, 128)))
    assert key_out.dtype == key.dtype
    np.testing.assert_array_equal(jax.random.key_data(key_out), jax.random.key_data(key))


# -- pipelines over ref views ------------------------------------------------------------


@pytest.mark.parametrize("dynamic_grid", [False, True])
def test_a_nested_pipeline_copies_through_bitcast_views_when_emulated(dynamic_grid):
    """An inner pipeline over int16 ``ref.bitcast`` views of the outer pipeline's f32
    blocks: its DMAs start and are waited for on those views (the executor matched a
    DMA's destination at its wait by numpy address, which a bitcast view has not)."""
    def grid(n):
        return (jnp.array(n),) if dynamic_grid else (n,)

    @jax.jit
    def f(x):
        @pl.kernel(out_type=jax.ShapeDtypeStruct((32, 128), x.dtype),
                   mesh=pltpu.create_tensorcore_mesh("core"))
        def run(x_hbm, o_hbm):
            def outer_body(x_blk, o_blk):
                def inner_body(x, o):
                    o[...] = x[...]

                pltpu.emit_pipeline(
                    inner_body, grid=grid(2),
                    in_specs=[pl.BlockSpec((16, 128), lambda i: (i, 0))],
                    out_specs=[pl.BlockSpec((16, 128), lambda i: (i, 0))],
                )(x_blk.at[0:16].bitcast(jnp.int16), o_blk.bitcast(jnp.int16))

            pltpu.emit_pipeline(
                outer_body, grid=grid(2),
                in_specs=[pl.BlockSpec((32, 128), lambda i: (i, 0))],
                out_specs=[pl.BlockSpec((16, 128), lambda i: (i, 0))],
            )(x_hbm, o_hbm)

        return run(x)

    x = jnp.arange(64 * 128, dtype=jnp.float32).reshape(64, 128)
    want = np.concatenate([np.asarray(x)[0:16], np.asarray(x)[32:48]])
    with pl.emulate_device("tpu:v5e"):
        np.testing.assert_array_equal(f(x), want)
