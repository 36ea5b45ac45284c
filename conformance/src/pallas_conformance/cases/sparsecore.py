"""SparseCore: embedding gathers through indexed DMAs, segment sums by scatter-add with
repeated indices (into HBM, and from every subcore into one ``VMEM_SHARED``
accumulator), indexed DMAs that skip an ignored value, vector gathers/scatters, subcores
handing data to each other through ``VMEM_SHARED`` across ``subcore_barrier``, and
scalar-subcore control flow.

The kernels use the SparseCore primitives of ``pallas_tpu_sparsecore`` (``plsc``) and the
DMAs of ``pallas_tpu``, so these cases are registered only when both are installed; any
backend that claims ``sparsecore`` runs them. They are ``pallas_call``s over a
``(cores, subcores)`` grid (vector subcores) or a ``(cores,)`` grid (scalar subcores)
whose operands stay whole in HBM (``memory_space=pl.ANY``), as on a SparseCore.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import pallas as pl
from pallas_conformance.registry import call_options, case, randn, sds

pltpu = plsc = None
try:  # the SparseCore frontend; without it there are no SparseCore cases
    import pallas_tpu as pltpu
    import pallas_tpu_sparsecore as plsc
except ImportError:  # pragma: no cover - depends on the installed packages
    pass

SUBCORES = 4
VOCAB, DIM, BATCH = 96, 8, 64
ANY = pl.BlockSpec(memory_space=pl.ANY)
# Rows of DIM=8 floats: an indexed DMA moves them under SparseCore tiling only (under
# TensorCore tiling, upstream's default, rows are multiples of 128 32-bit elements).
SC_TILING = pltpu.CompilerParams(use_tc_tiling_on_sc=False) if pltpu else None


def _lanes() -> int:
    return plsc.get_sparse_core_info().num_lanes


def _cores() -> int:
    # All the chip's SparseCores: libtpu runs scalar subcores on one SparseCore or all.
    return plsc.get_sparse_core_info().num_cores


def _ids(rng, n, hi, repeats=True):
    if repeats:
        return jnp.asarray(rng.integers(0, hi, n), jnp.int32)
    return jnp.asarray(rng.permutation(hi)[:n], jnp.int32)


def _subcore():
    return pl.program_id(1)


def embedding_gather(pallas_call, table, ids):
    """table[ids]: each of 4 vector subcores gathers its share of rows from HBM with one
    indexed DMA."""
    per = BATCH // SUBCORES

    def kernel(t_hbm, i_hbm, o_hbm, iv, rows, sem):
        part = pl.ds(_subcore() * per, per)
        pltpu.sync_copy(i_hbm.at[part], iv)
        pltpu.async_copy(t_hbm.at[iv], rows, sem).wait()
        pltpu.sync_copy(rows, o_hbm.at[part])

    return pallas_call(
        kernel, out_shape=sds((BATCH, DIM), table.dtype), grid=(1, SUBCORES),
        in_specs=[ANY, ANY], out_specs=ANY, compiler_params=SC_TILING,
        scratch_shapes=[pltpu.VMEM((per,), jnp.int32), pltpu.VMEM((per, DIM), table.dtype),
                        pltpu.SemaphoreType.DMA])(table, ids)


def segment_sum(pallas_call, zeros, data, segments):
    """A segment sum: every subcore scatter-adds its rows into out.at[segments] with an
    indexed DMA (add=True); repeated segment ids, also across subcores, add up exactly.
    The output starts as the aliased zeros."""
    per = data.shape[0] // SUBCORES

    def kernel(z_hbm, d_hbm, s_hbm, o_hbm, sv, rows, sem):
        del z_hbm  # aliased to o_hbm
        part = pl.ds(_subcore() * per, per)
        pltpu.sync_copy(s_hbm.at[part], sv)
        pltpu.sync_copy(d_hbm.at[part], rows)
        pltpu.async_copy(rows, o_hbm.at[sv], sem, add=True).wait()

    return pallas_call(
        kernel, out_shape=sds(zeros.shape, zeros.dtype), grid=(1, SUBCORES),
        in_specs=[ANY, ANY, ANY], out_specs=ANY, input_output_aliases={0: 0},
        scratch_shapes=[pltpu.VMEM((per,), jnp.int32),
                        pltpu.VMEM((per, data.shape[1]), data.dtype),
                        pltpu.SemaphoreType.DMA])(zeros, data, segments)


def gather_skipping(pallas_call, table, ids, fill):
    """An indexed DMA with plsc.Indices(ids, ignored_value=-1): rows whose id is -1 keep
    the destination's previous contents."""
    n = ids.shape[0]

    def kernel(t_hbm, i_hbm, f_hbm, o_hbm, iv, rows, sem):
        pltpu.sync_copy(i_hbm, iv)
        pltpu.sync_copy(f_hbm, rows)
        pltpu.async_copy(t_hbm.at[plsc.Indices(iv, ignored_value=-1)], rows, sem).wait()
        pltpu.sync_copy(rows, o_hbm)

    return pallas_call(
        kernel, out_shape=sds(fill.shape, fill.dtype), grid=(1, 1),
        in_specs=[ANY, ANY, ANY], out_specs=ANY, compiler_params=SC_TILING,
        scratch_shapes=[pltpu.VMEM((n,), jnp.int32), pltpu.VMEM(fill.shape, fill.dtype),
                        pltpu.SemaphoreType.DMA])(table, ids, fill)


def vector_histogram(pallas_call, values, bins):
    """A histogram in one vector subcore's VMEM: lanes-wide chunks of bin ids, each
    plsc.addupdate_scatter'ed (repeated bins add up), then every bin read back with
    plsc.load_gather."""
    lanes = _lanes()

    def kernel(v_hbm, b_hbm, o_hbm, vv, bv, acc, out):
        pltpu.sync_copy(v_hbm, vv)
        pltpu.sync_copy(b_hbm, bv)
        for j in range(lanes):
            acc[pl.ds(j * lanes, lanes)] = jnp.zeros((lanes,), jnp.float32)

        @pl.loop(0, bins.shape[0] // lanes)
        def _(j):
            chunk = pl.ds(j * lanes, lanes)
            plsc.addupdate_scatter(acc, [bv[chunk]], vv[chunk])

        out[...] = plsc.load_gather(acc, [jax.lax.iota(jnp.int32, lanes) * lanes])
        pltpu.sync_copy(out, o_hbm)

    return pallas_call(
        kernel, out_shape=sds((lanes,), jnp.float32), grid=(1, 1),
        in_specs=[ANY, ANY], out_specs=ANY,
        scratch_shapes=[pltpu.VMEM(values.shape, jnp.float32),
                        pltpu.VMEM(bins.shape, jnp.int32),
                        pltpu.VMEM((lanes * lanes,), jnp.float32),
                        pltpu.VMEM((lanes,), jnp.float32)])(values, bins)


def scalar_running_max(pallas_call, x):
    """Scalar subcores (a (cores,) grid over every SparseCore): core c copies row c to SMEM and writes its
    running maximum, element by element in a loop with a data-dependent branch."""
    n = x.shape[1]

    def kernel(x_hbm, o_hbm, s):
        c = pl.program_id(0)
        pltpu.sync_copy(x_hbm.at[c], s)

        @pl.loop(1, n)
        def _(i):
            @pl.when(s[i] < s[i - 1])
            def _():
                s[i] = s[i - 1]

        pltpu.sync_copy(s, o_hbm.at[c])

    return pallas_call(
        kernel, out_shape=sds(x.shape, x.dtype), grid=(x.shape[0],),
        in_specs=[ANY], out_specs=ANY,
        scratch_shapes=[pltpu.SMEM((n,), x.dtype)])(x)


def barrier_exchange(pallas_call, x):
    """Subcores hand data to each other through VMEM_SHARED: subcore s writes row s
    (doubled) to a shared buffer, all meet at plsc.subcore_barrier, then subcore s reads
    the row subcore s+1 wrote."""
    lanes = x.shape[1]

    def kernel(x_hbm, o_hbm, shared, v):
        s = _subcore()
        pltpu.sync_copy(x_hbm.at[s], v)
        v[...] = v[...] * 2.0
        pltpu.sync_copy(v, shared.at[s])
        plsc.subcore_barrier()
        pltpu.sync_copy(shared.at[(s + 1) % SUBCORES], v)
        pltpu.sync_copy(v, o_hbm.at[s])

    return pallas_call(
        kernel, out_shape=sds(x.shape, x.dtype), grid=(1, SUBCORES),
        in_specs=[ANY], out_specs=ANY,
        scratch_shapes=[pltpu.VMEM_SHARED(x.shape, x.dtype),
                        pltpu.VMEM((lanes,), x.dtype)])(x)


def _into_shared(z_hbm, acc, o_hbm, add_mine):
    """Inside a kernel: subcore 0 copies ``z_hbm`` into the VMEM_SHARED accumulator
    ``acc``; after a barrier every subcore runs ``add_mine(subcore)``; after another,
    subcore 0 copies ``acc`` out to ``o_hbm``."""
    s = _subcore()

    @pl.when(s == 0)
    def _():
        pltpu.sync_copy(z_hbm, acc)

    plsc.subcore_barrier()
    add_mine(s)
    plsc.subcore_barrier()

    @pl.when(s == 0)
    def _():
        pltpu.sync_copy(acc, o_hbm)


def shared_segment_sum(pallas_call, zeros, data, segments):
    """A segment sum into VMEM_SHARED: every subcore scatter-adds its rows into one shared
    accumulator at segment ids that repeat within and across subcores (indexed DMAs with
    add=True, an atomic accumulate on hardware), between barriers; subcore 0 zeroes the
    accumulator first and copies it out last. (The interpreter's subcore model kept one
    subcore's adds per element.)"""
    per = data.shape[0] // SUBCORES

    def kernel(z_hbm, d_hbm, s_hbm, o_hbm, acc, sv, rows, sem):
        def add_mine(s):
            part = pl.ds(s * per, per)
            pltpu.sync_copy(s_hbm.at[part], sv)
            pltpu.sync_copy(d_hbm.at[part], rows)
            pltpu.async_copy(rows, acc.at[sv], sem, add=True).wait()

        _into_shared(z_hbm, acc, o_hbm, add_mine)

    return pallas_call(
        kernel, out_shape=sds(zeros.shape, zeros.dtype), grid=(1, SUBCORES),
        in_specs=[ANY, ANY, ANY], out_specs=ANY, compiler_params=SC_TILING,
        scratch_shapes=[pltpu.VMEM_SHARED(zeros.shape, zeros.dtype),
                        pltpu.VMEM((per,), jnp.int32),
                        pltpu.VMEM((per, data.shape[1]), data.dtype),
                        pltpu.SemaphoreType.DMA])(zeros, data, segments)


def shared_sum_of_partials(pallas_call, zeros, parts, rows):
    """Every subcore adds its (rows, DIM) partial into the same rows of a VMEM_SHARED
    accumulator (``sync_copy(mine, acc.at[rows], add=True)``, ``rows`` = 0..n-1: the
    SparseCore adds only through indexed DMAs): every element receives every subcore's
    add, and the result is the sum of the partials."""
    n = rows.shape[0]

    def kernel(z_hbm, p_hbm, r_hbm, o_hbm, acc, mine, rv):
        def add_mine(s):
            pltpu.sync_copy(r_hbm, rv)
            pltpu.sync_copy(p_hbm.at[s], mine)
            pltpu.sync_copy(mine, acc.at[rv], add=True)

        _into_shared(z_hbm, acc, o_hbm, add_mine)

    return pallas_call(
        kernel, out_shape=sds(zeros.shape, parts.dtype), grid=(1, SUBCORES),
        in_specs=[ANY, ANY, ANY], out_specs=ANY, compiler_params=SC_TILING,
        scratch_shapes=[pltpu.VMEM_SHARED(zeros.shape, parts.dtype),
                        pltpu.VMEM((n, DIM), parts.dtype),
                        pltpu.VMEM((n,), jnp.int32)])(zeros, parts, rows)


def gather_scatter_add_simulated(pallas_call, table, ids):
    """The embedding gather with its indices in a VMEM ref (``t_hbm.at[idx_ref]``, async
    on a DMA semaphore) and the scatter-add of the gathered rows back into a copy of the
    table (repeated ids add up), on one vector subcore. At level ``interpret`` it runs in
    TPU interpret mode (``pltpu.InterpretParams()``), which simulates DMAs and
    semaphores (it raised TypeError 'Buffer' on the ref of indices)."""
    mode = call_options(pallas_call)
    if mode.get("interpret"):
        mode["interpret"] = pltpu.InterpretParams()
    n = ids.shape[0]

    def kernel(t_hbm, i_hbm, g_hbm, acc_hbm, idx_ref, rows, sem):
        pltpu.sync_copy(i_hbm, idx_ref)
        pltpu.async_copy(t_hbm.at[idx_ref], rows, sem).wait()
        pltpu.sync_copy(rows, g_hbm)
        pltpu.sync_copy(t_hbm, acc_hbm)
        pltpu.async_copy(rows, acc_hbm.at[idx_ref], sem, add=True).wait()

    return getattr(pallas_call, "func", pl.pallas_call)(
        kernel, out_shape=(sds((n, DIM), table.dtype), sds(table.shape, table.dtype)),
        grid=(1, 1), in_specs=[ANY, ANY], out_specs=(ANY, ANY),
        scratch_shapes=[pltpu.VMEM((n,), jnp.int32), pltpu.VMEM((n, DIM), table.dtype),
                        pltpu.SemaphoreType.DMA], **mode)(table, ids)


def _register():
    case("sparsecore/embedding_gather", tags={"sparsecore"},
         inputs=lambda rng: (randn(rng, (VOCAB, DIM)), _ids(rng, BATCH, VOCAB)),
         reference=lambda t, i: t[i])(embedding_gather)
    case("sparsecore/segment_sum_scatter_add", tags={"sparsecore"},
         inputs=lambda rng: (jnp.zeros((10, DIM), jnp.float32), randn(rng, (BATCH, DIM)),
                             _ids(rng, BATCH, 10)),
         reference=lambda z, d, s: z.at[s].add(d),
         tolerance={"float32": (1e-5, 1e-5)})(segment_sum)
    case("sparsecore/shared_segment_sum_scatter_add", tags={"sparsecore"},
         inputs=lambda rng: (jnp.zeros((10, DIM), jnp.float32), randn(rng, (BATCH, DIM)),
                             _ids(rng, BATCH, 10)),
         reference=lambda z, d, s: z.at[s].add(d),
         tolerance={"float32": (1e-5, 1e-5)})(shared_segment_sum)
    case("sparsecore/shared_sum_of_subcore_partials", tags={"sparsecore"},
         inputs=lambda rng: (jnp.zeros((16, DIM), jnp.float32),
                             randn(rng, (SUBCORES, 16, DIM)), jnp.arange(16, dtype=jnp.int32)),
         reference=lambda z, p, r: z.at[r].add(p.sum(axis=0)),
         tolerance={"float32": (1e-5, 1e-5)})(shared_sum_of_partials)
    case("sparsecore/indexed_dma_ignored_value", tags={"sparsecore"},
         inputs=lambda rng: (randn(rng, (VOCAB, DIM)),
                             jnp.where(jnp.asarray(rng.random(16) < 0.3), -1,
                                       _ids(rng, 16, VOCAB)),
                             jnp.full((16, DIM), 7.0, jnp.float32)),
         reference=lambda t, i, f: jnp.where((i >= 0)[:, None], t[jnp.maximum(i, 0)], f),
         )(gather_skipping)
    case("sparsecore/gather_scatter_add_ref_indices_simulated", tags={"sparsecore"},
         inputs=lambda rng: (randn(rng, (VOCAB, DIM)), _ids(rng, _lanes(), 12)),
         reference=lambda t, i: (t[i], t.at[i].add(t[i])),
         tolerance={"float32": (1e-5, 1e-5)})(gather_scatter_add_simulated)
    case("sparsecore/vector_histogram", tags={"sparsecore"},
         inputs=lambda rng: (randn(rng, (4 * _lanes(),)),
                             jnp.asarray(rng.integers(0, _lanes(), 4 * _lanes()) * _lanes(),
                                         jnp.int32)),
         reference=lambda v, b: jnp.zeros((_lanes() * _lanes(),), jnp.float32)
         .at[b].add(v)[:: _lanes()])(vector_histogram)
    case("sparsecore/subcore_barrier_exchange", tags={"sparsecore"},
         inputs=lambda rng: (randn(rng, (SUBCORES, _lanes())),),
         reference=lambda x: jnp.roll(x * 2.0, -1, axis=0))(barrier_exchange)
    case("sparsecore/scalar_subcore_running_max", tags={"sparsecore"},
         inputs=lambda rng: (jnp.asarray(rng.integers(-50, 50, (_cores(), 16)),
                                         jnp.int32),),
         reference=lambda x: jnp.asarray(np.maximum.accumulate(np.asarray(x), axis=1)),
         )(scalar_running_max)


if plsc is not None:
    _register()
