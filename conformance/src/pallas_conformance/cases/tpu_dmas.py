"""TPU DMAs that outlive their kernel: an async copy started by one ``pallas_call`` and
waited for by the next, the DMA semaphore passed from one to the other as an output and
then an input in ``SEMAPHORE`` memory (upstream's pattern for overlapping a copy with
other work between kernels).

The kernels use ``pallas_tpu``'s DMAs, so these cases are registered only when it is
installed; a backend that claims ``tpu_dmas`` runs them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import case, randn, sds

pltpu = None
try:  # the TPU frontend; without it there are no such cases
    import pallas_tpu as pltpu
except ImportError:  # pragma: no cover - depends on the installed packages
    pass

C = 128


def _start(x_ref, _aliased_x, o_ref, sem):
    pltpu.make_async_copy(x_ref, o_ref, sem).start()


def _start_rows(x_ref, _aliased_x, o_ref, sem):
    pltpu.make_async_copy(x_ref.at[pl.ds(8, 8)], o_ref, sem).start()


def _done(x_ref, o_ref, sem, _aliased_o):
    pltpu.make_async_copy(x_ref, o_ref, sem).wait()


def _done_rows(x_ref, o_ref, sem, _aliased_o):
    pltpu.make_async_copy(x_ref.at[pl.ds(8, 8)], o_ref, sem).wait()


def _copy_across(pallas_call, x, start, done, rows):
    anys = pl.BlockSpec(memory_space=pl.ANY)
    sems = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
    out_sds = sds((rows, x.shape[1]), x.dtype)
    x, out, sem = pallas_call(
        start, in_specs=[anys], out_specs=(anys, anys, sems),
        out_shape=(jax.ShapeDtypeStruct.like(x), out_sds, pltpu.SemaphoreType.DMA(())),
        input_output_aliases={0: 0})(x)
    return pallas_call(
        done, in_specs=[anys, anys, sems], out_specs=anys, out_shape=out_sds,
        input_output_aliases={1: 0})(x, out, sem)


if pltpu is not None:
    @case("tpu_dmas/copy_waited_by_the_next_call", tags={"tpu_dmas", "aliasing"},
          inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: x)
    def copy_across_calls(pallas_call, x):
        """Start a whole-array copy in one pallas_call, wait for it in the next."""
        return _copy_across(pallas_call, x, _start, _done, 8)

    @case("tpu_dmas/slice_copy_waited_by_the_next_call", tags={"tpu_dmas", "aliasing"},
          inputs=lambda rng: (randn(rng, (32, C)),), reference=lambda x: x[8:16])
    def slice_across_calls(pallas_call, x):
        """The same with a copy of rows 8..16 (a sliced source view)."""
        return _copy_across(pallas_call, x, _start_rows, _done_rows, 8)


def _copy_rows_of_run_time_count(start_ref, count_ref, data_ref, _aliased, out_ref, sem):
    n = count_ref[0]
    pltpu.async_copy(data_ref.at[pl.ds(0, n)], out_ref.at[pl.ds(start_ref[0], n)],
                     sem).wait()


if pltpu is not None:
    @case("tpu_dmas/copy_of_run_time_size", tags={"tpu_dmas", "aliasing"},
          inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (64, C))),
          reference=lambda data, array: array.at[3:8].set(data[:5]))
    def copy_of_run_time_size(pallas_call, data, array):
        """A DMA of ``pl.ds(start, n)`` rows with ``n`` read from SMEM at run time (a
        memref of dynamic size for the compiler)."""
        smem = pl.BlockSpec(memory_space=pltpu.SMEM)
        return pallas_call(
            _copy_rows_of_run_time_count, out_shape=jax.ShapeDtypeStruct.like(array),
            in_specs=[smem, smem, pl.BlockSpec(memory_space=pltpu.VMEM),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA], input_output_aliases={3: 0},
        )(jnp.array([3], jnp.int32), jnp.array([5], jnp.int32), data, array)


def _dma_through_closed_over_refs(pallas_call, x):
    rows_per_block = 8

    def stateful(refs):
        x_ref, y_ref = refs

        def kernel(o_ref, buf):
            # The closed-over refs live in ANY memory (as upstream): DMAs move the rows.
            rows = pl.ds(pl.program_id(0) * rows_per_block, rows_per_block)
            pltpu.sync_copy(x_ref.at[rows], buf)
            o_ref[...] = buf[...] + 1.0
            buf[...] = buf[...] * 2.0
            pltpu.sync_copy(buf, y_ref.at[rows])

        out = pallas_call(
            kernel, grid=(x.shape[0] // rows_per_block,),
            out_specs=pl.BlockSpec((rows_per_block, C), lambda i: (i, 0)),
            out_shape=sds(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM((rows_per_block, C), x.dtype)])()
        y_ref[...] += out

    return jax.jit(pl.run_state(stateful))((x, jnp.zeros_like(x)))


if pltpu is not None:
    @case("tpu_dmas/closed_over_refs", tags={"tpu_dmas"},
          inputs=lambda rng: (randn(rng, (32, C)),), reference=lambda x: (x, x * 3.0 + 1.0))
    def closed_over_refs(pallas_call, x):
        """A kernel closing over Refs of an enclosing ``pl.run_state`` (passed whole, in
        ANY memory): each grid step copies its rows in and its result out with DMAs."""
        return _dma_through_closed_over_refs(pallas_call, x)


def _bounded_slice_pipeline(bounds_ref, x_hbm, o_hbm):
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    spec = pl.BlockSpec((pl.BoundedSlice(8), C), lambda i: (
        pl.ds(bounds_ref[i], bounds_ref[i + 1] - bounds_ref[i]), 0))
    pltpu.emit_pipeline(body, grid=(bounds_ref.shape[0] - 1,), in_specs=[spec],
                        out_specs=spec)(x_hbm, o_hbm)


if pltpu is not None:
    @case("tpu_dmas/pipeline_of_bounded_slices", tags={"tpu_dmas"},
          inputs=lambda rng: (randn(rng, (16, C)),), reference=lambda x: x * 2.0 + 1.0)
    def pipeline_of_bounded_slices(pallas_call, x):
        """``pltpu.emit_pipeline`` over row ranges of sizes 3, 5, 8 (read from SMEM):
        ``pl.BoundedSlice(8)`` blocks, each copied in and out by DMAs of run-time size."""
        return pallas_call(
            _bounded_slice_pipeline, out_shape=sds(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
        )(jnp.array([0, 3, 8, 16], jnp.int32), x)


def _uniform_of_key(key_ref, o_ref):
    o_ref[...] = jax.random.uniform(key_ref[...], shape=o_ref.shape)


def _key_through_a_pipeline(key_hbm, o_hbm):
    pltpu.emit_pipeline(_uniform_of_key, grid=(),
                        in_specs=[pl.BlockSpec(memory_space=pl.MemorySpace.KEY)],
                        out_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)])(key_hbm, o_hbm)


if pltpu is not None:
    @case("tpu_dmas/pipeline_of_a_prng_key", tags={"tpu_dmas"},
          inputs=lambda rng: (jnp.array([0, 42], jnp.uint32),),
          reference=lambda d: jax.random.uniform(jax.random.wrap_key_data(d), (8, C)))
    def pipeline_of_a_prng_key(pallas_call, key_data):
        """A threefry key in HBM that ``pltpu.emit_pipeline`` copies into a buffer of
        ``pl.MemorySpace.KEY`` (SMEM on the TPU): the kernel's ``jax.random.uniform`` on
        it draws what ``jax.random`` does."""
        return pallas_call(
            _key_through_a_pipeline, out_shape=sds((8, C), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
            out_specs=pl.BlockSpec(memory_space=pltpu.HBM),
        )(jax.random.wrap_key_data(key_data))


def _copy_into_a_bitcast_view(x_hbm, o_ref, buf, sem):
    pltpu.async_copy(x_hbm, buf.bitcast(jnp.int16), sem).wait()
    o_ref[...] = buf[...]


def _pairs_of_int16_as_int32(x):
    """TPU's bitcast layout: row ``r`` of the int32 view holds rows ``2r`` (low half)
    and ``2r + 1`` (high half) of the int16 array."""
    lo = x[0::2].astype(jnp.uint16).astype(jnp.uint32)
    hi = x[1::2].astype(jnp.uint16).astype(jnp.uint32)
    return jax.lax.bitcast_convert_type(lo | (hi << 16), jnp.int32)


if pltpu is not None:
    @case("tpu_dmas/copy_into_a_bitcast_view", tags={"tpu_dmas", "ref_bitcast"},
          inputs=lambda rng: (jnp.asarray(rng.integers(-2**15, 2**15, (32, C)), jnp.int16),),
          reference=_pairs_of_int16_as_int32)
    def copy_into_a_bitcast_view(pallas_call, x):
        """A DMA of int16 rows into an int16 ``ref.bitcast`` view of an int32 VMEM buffer
        (started and waited for on the view), then read as int32."""
        return pallas_call(
            _copy_into_a_bitcast_view, out_shape=sds((16, C), jnp.int32),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            scratch_shapes=[pltpu.VMEM((16, C), jnp.int32), pltpu.SemaphoreType.DMA],
        )(x)


def _doubled_by_row_blocks(x_hbm, o_hbm):
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    pltpu.emit_pipeline(body, grid=(pl.cdiv(x_hbm.shape[0], 8),), in_specs=[spec],
                        out_specs=[spec])(x_hbm, o_hbm)


if pltpu is not None:
    @case("tpu_dmas/pipeline_with_an_edge_block", tags={"tpu_dmas"},
          inputs=lambda rng: (randn(rng, (20, C)),), reference=lambda x: x * 2.0)
    def pipeline_with_an_edge_block(pallas_call, x):
        """``pltpu.emit_pipeline`` over 20 rows in blocks of 8: the last block hangs over
        the edge, and only its 4 rows inside the array are copied in and out."""
        return pallas_call(
            _doubled_by_row_blocks, out_shape=sds(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY))(x)
