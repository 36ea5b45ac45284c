"""Every plsc primitive under ``interpret=True`` on CPU, against plain numpy: gathers and
scatters (scatter-add sums repeated indices exactly), masked loads/stores, indexed DMAs,
the vector primitives, ``parallel_loop`` and the mesh (subcores in order)."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_tpu as pltpu
import pallas_tpu_sparsecore as plsc

F32, I32 = jnp.float32, jnp.int32


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_load_gather_reads_the_indexed_elements(vector_kernel, lanes, rng):
    table = jnp.asarray(rng.normal(size=(64,)), F32)
    idx = jnp.asarray(rng.integers(0, 64, lanes), I32)

    @vector_kernel(sds((lanes,), F32),
                   scratch=[pltpu.VMEM((64,), F32), pltpu.VMEM((lanes,), I32),
                            pltpu.VMEM((lanes,), F32)])
    def k(t_hbm, i_hbm, o_hbm, t, i, o):
        pltpu.sync_copy(t_hbm, t)
        pltpu.sync_copy(i_hbm, i)
        o[...] = plsc.load_gather(t, [i[...]])
        pltpu.sync_copy(o, o_hbm)

    np.testing.assert_array_equal(k(table, idx), np.asarray(table)[np.asarray(idx)])


def test_load_gather_2d_with_mask(vector_kernel, lanes, rng):
    table = jnp.asarray(rng.integers(0, 100, (8, 32)), I32)
    rows = jnp.asarray(rng.integers(0, 8, lanes), I32)
    cols = jnp.asarray(rng.integers(0, 32, lanes), I32)

    @vector_kernel(sds((lanes,), I32), scratch=[pltpu.VMEM((8, 32), I32)] + [
        pltpu.VMEM((lanes,), I32)] * 3)
    def k(t_hbm, r_hbm, c_hbm, o_hbm, t, r, c, o):
        pltpu.sync_copy(t_hbm, t)
        pltpu.sync_copy(r_hbm, r)
        pltpu.sync_copy(c_hbm, c)
        mask = jax.lax.iota(I32, lanes) % 3 != 0
        o[...] = plsc.load_gather(t, [r[...], c[...]], mask=mask)
        pltpu.sync_copy(o, o_hbm)

    mask = np.arange(lanes) % 3 != 0
    want = np.where(mask, np.asarray(table)[np.asarray(rows), np.asarray(cols)], 0)
    np.testing.assert_array_equal(k(table, rows, cols), want)


def _vmem_inputs(*arrays):
    return [pltpu.VMEM(a.shape, a.dtype) for a in arrays]


def test_addupdate_scatter_sums_repeated_indices(vector_kernel, lanes):
    idx = jnp.asarray(np.arange(lanes) % 3, I32)  # 0, 1, 2, 0, 1, 2, ...
    x = jnp.arange(lanes, dtype=F32) + 1

    @vector_kernel(sds((8,), F32), scratch=[*_vmem_inputs(idx, x), pltpu.VMEM((8,), F32)])
    def k(i_hbm, x_hbm, o_hbm, i, xv, acc):
        pltpu.sync_copy(i_hbm, i)
        pltpu.sync_copy(x_hbm, xv)
        acc[...] = jnp.zeros((8,), F32)
        plsc.addupdate_scatter(acc, [i[...]], xv[...])
        plsc.addupdate_scatter(acc, [i[...]], xv[...])
        pltpu.sync_copy(acc, o_hbm)

    want = np.zeros(8, np.float32)
    np.add.at(want, np.asarray(idx), 2 * np.asarray(x))
    np.testing.assert_array_equal(k(idx, x), want)


def test_store_scatter_masked(vector_kernel, lanes):
    idx = jnp.asarray(lanes - 1 - np.arange(lanes), I32)
    x = jnp.arange(lanes, dtype=I32) + 10

    @vector_kernel(sds((lanes,), I32), scratch=[*_vmem_inputs(idx, x),
                                                pltpu.VMEM((lanes,), I32)])
    def k(i_hbm, x_hbm, o_hbm, i, xv, o):
        pltpu.sync_copy(i_hbm, i)
        pltpu.sync_copy(x_hbm, xv)
        o[...] = jnp.full((lanes,), -1, I32)
        plsc.store_scatter(o, [i[...]], xv[...], mask=jax.lax.iota(I32, lanes) < 4)
        pltpu.sync_copy(o, o_hbm)

    want = np.full(lanes, -1)
    want[np.asarray(idx)[:4]] = np.asarray(x)[:4]
    np.testing.assert_array_equal(k(idx, x), want)


def test_load_expanded_and_store_compressed(vector_kernel, lanes):
    mask = jnp.asarray(np.arange(lanes) % 2 == 0)
    x = jnp.arange(lanes, dtype=F32) + 1

    @vector_kernel((sds((lanes,), F32), sds((lanes,), F32)),
                   scratch=[pltpu.VMEM((lanes,), F32), pltpu.VMEM((lanes,), F32)])
    def k(x_hbm, e_hbm, c_hbm, xv, cv):
        pltpu.sync_copy(x_hbm, xv)
        mask = jax.lax.iota(I32, lanes) % 2 == 0
        cv[...] = jnp.zeros((lanes,), F32)
        plsc.store_compressed(cv, xv[...], mask=mask)
        xv[...] = plsc.load_expanded(xv, mask=mask)
        pltpu.sync_copy(xv, e_hbm)
        pltpu.sync_copy(cv, c_hbm)

    expanded, compressed = k(x)
    want_e = np.zeros(lanes, np.float32)
    want_e[np.asarray(mask)] = np.asarray(x)[: int(mask.sum())]
    want_c = np.zeros(lanes, np.float32)
    want_c[: int(mask.sum())] = np.asarray(x)[np.asarray(mask)]
    np.testing.assert_array_equal(expanded, want_e)
    np.testing.assert_array_equal(compressed, want_c)


def test_addupdate_and_addupdate_compressed(vector_kernel, lanes):
    @vector_kernel(sds((lanes,), I32), scratch=[pltpu.VMEM((lanes,), I32)])
    def k(o_hbm, o):
        x = jax.lax.iota(I32, lanes)
        mask = x >= lanes - 3
        o[...] = jnp.ones((lanes,), I32)
        plsc.addupdate(o, x)
        plsc.addupdate_compressed(o, x, mask=mask)
        pltpu.sync_copy(o, o_hbm)

    want = 1 + np.arange(lanes)
    want[:3] += np.arange(lanes)[-3:]
    np.testing.assert_array_equal(k(), want)


def test_indexed_dma_gathers_rows_from_hbm_on_every_subcore(vector_kernel, lanes, rng):
    table = jnp.asarray(rng.normal(size=(64, 8)), F32)
    idx = jnp.asarray(rng.integers(0, 64, (4, lanes)), I32)

    @vector_kernel(sds((4, lanes, 8), F32), subcores=4,
                   scratch=[pltpu.VMEM((lanes,), I32), pltpu.VMEM((lanes, 8), F32),
                            pltpu.SemaphoreType.DMA])
    def k(t_hbm, i_hbm, o_hbm, iv, rows, sem):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(i_hbm.at[s], iv)
        pltpu.async_copy(t_hbm.at[iv[...]], rows, sem).wait()
        pltpu.sync_copy(rows, o_hbm.at[s])

    np.testing.assert_array_equal(k(table, idx), np.asarray(table)[np.asarray(idx)])


def test_indexed_dma_scatter_add_sums_repeated_rows(vector_kernel, lanes):
    idx = jnp.asarray(np.arange(lanes) % 4, I32)
    rows = jnp.asarray(np.arange(lanes * 8).reshape(lanes, 8), F32)

    @vector_kernel(sds((4, 8), F32), scratch=[*_vmem_inputs(idx, rows),
                                              pltpu.SemaphoreType.DMA])
    def k(i_hbm, r_hbm, acc_hbm, o_hbm, iv, rv, sem):
        pltpu.sync_copy(i_hbm, iv)
        pltpu.sync_copy(r_hbm, rv)
        pltpu.sync_copy(acc_hbm, o_hbm)
        pltpu.async_copy(rv, o_hbm.at[iv[...]], sem, add=True).wait()

    want = np.ones((4, 8), np.float32)
    np.add.at(want, np.asarray(idx), np.asarray(rows))
    np.testing.assert_array_equal(k(idx, rows, jnp.ones((4, 8), F32)), want)


def test_mesh_points_run_in_order_with_their_indices(lanes):
    import pallas as pl

    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=2,
                                  num_subcores=3)

    @pl.kernel(out_type=sds((2, 3, lanes), I32), mesh=mesh, interpret=True,
               scratch_types=[pltpu.VMEM((lanes,), I32)])
    def k(o_hbm, v):
        c, s = jax.lax.axis_index("c"), jax.lax.axis_index("s")
        v[...] = jnp.full((lanes,), 10 * c + s, I32)
        pltpu.sync_copy(v, o_hbm.at[c, s])

    want = (10 * np.arange(2)[:, None] + np.arange(3)[None, :])[..., None]
    np.testing.assert_array_equal(k(), np.broadcast_to(want, (2, 3, lanes)))


@pytest.mark.parametrize("dtype,new", [(I32, jnp.int8), (I32, jnp.int16), (I32, F32),
                                       (jnp.int8, I32)])
def test_bitcast_keeps_the_rank(dtype, new):
    n = 16
    x = jnp.arange(n, dtype=dtype)
    out = jax.jit(lambda x: _interpret_value(lambda v: plsc.bitcast(v, new), x))(x)
    np.testing.assert_array_equal(out, np.asarray(x).view(np.dtype(new)))


def _interpret_value(f, *xs):
    """Applies a value primitive through its interpreter rule (eager binding)."""
    from pallas_tpu_sparsecore.plugin import interpret_rules

    rules = interpret_rules()
    jaxpr = jax.make_jaxpr(f)(*xs)
    env = {}
    for v, x in zip(jaxpr.jaxpr.invars, xs):
        env[v] = x
    for eqn in jaxpr.jaxpr.eqns:
        ins = [env[v] if not hasattr(v, "val") else v.val for v in eqn.invars]
        if eqn.primitive in rules:
            outs = rules[eqn.primitive](None, eqn, ins)
        else:
            outs = eqn.primitive.bind(*ins, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    res = [env[v] for v in jaxpr.jaxpr.outvars]
    return res[0] if len(res) == 1 else res


@pytest.mark.parametrize("fmt", list(plsc.PackFormat))
@pytest.mark.parametrize("dtype", [F32, I32])
def test_pack_unpack_round_trip(vector_kernel, lanes, fmt, dtype):
    a = jnp.arange(lanes, dtype=dtype)
    b = -a

    @vector_kernel((sds((lanes,), dtype),) * 2,
                   scratch=[pltpu.VMEM((lanes,), dtype), pltpu.VMEM((lanes,), dtype)])
    def k(a_hbm, b_hbm, oa_hbm, ob_hbm, av, bv):
        pltpu.sync_copy(a_hbm, av)
        pltpu.sync_copy(b_hbm, bv)
        ab = plsc.pack(av[...], bv[...], format=fmt)
        av[...], bv[...] = plsc.unpack(ab, format=fmt)
        pltpu.sync_copy(av, oa_hbm)
        pltpu.sync_copy(bv, ob_hbm)

    oa, ob = k(a, b)
    np.testing.assert_array_equal(oa, a)
    np.testing.assert_array_equal(ob, b)


def test_pack_layouts():
    a, b = jnp.arange(4, dtype=F32), jnp.arange(4, dtype=F32) + 10
    inter = _interpret_value(lambda a, b: plsc.pack(a, b, format=plsc.PackFormat.INTERLEAVED),
                             a, b)
    np.testing.assert_array_equal(inter, [0, 10, 1, 11, 2, 12, 3, 13])
    comp = _interpret_value(lambda a, b: plsc.pack(a, b, format=plsc.PackFormat.COMPRESSED),
                            a, b)
    assert comp.shape == (4, 2) and comp.dtype == jnp.bfloat16
    np.testing.assert_array_equal(comp.reshape(-1), [0, 1, 2, 3, 10, 11, 12, 13])


def test_cumsum_and_cummax_with_masks(lanes, rng):
    x = jnp.asarray(rng.integers(-50, 50, lanes), I32)
    mask = jnp.asarray(rng.random(lanes) < 0.6)
    cs = _interpret_value(lambda x, m: plsc.cumsum(x, mask=m), x, mask)
    np.testing.assert_array_equal(cs, np.cumsum(np.where(mask, x, 0)))
    cm = _interpret_value(lambda x, m: plsc.cummax(x, mask=m), x, mask)
    xs, ms = np.asarray(x), np.asarray(mask)
    want, best = [], None
    for v, m in zip(xs, ms):
        if m:
            best = v if best is None else max(best, v)
        want.append(v if best is None else best)
    np.testing.assert_array_equal(cm, want)


def test_scan_count_counts_occurrences(lanes, rng):
    x = jnp.asarray(rng.integers(0, 5, lanes), I32)
    counts, last = _interpret_value(plsc.scan_count, x)
    c = collections.Counter()
    want_counts = []
    for v in np.asarray(x):
        c[int(v)] += 1
        want_counts.append(c[int(v)])
    want_last = []
    for v in np.asarray(x):
        c[int(v)] -= 1
        want_last.append(c[int(v)] == 0)
    np.testing.assert_array_equal(counts, want_counts)
    np.testing.assert_array_equal(last, want_last)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_key_val_puts_masked_elements_last(lanes, rng, descending):
    keys = jnp.asarray(rng.integers(-100, 100, lanes), I32)
    vals = jnp.arange(lanes, dtype=F32)
    mask = jnp.arange(lanes) % 4 != 1
    k, v, m = _interpret_value(
        lambda a, b, c: plsc.sort_key_val(a, b, mask=c, descending=descending),
        keys, vals, mask)
    nvalid = int(mask.sum())
    kv = np.asarray(keys)[np.asarray(mask)]
    want = np.sort(kv)[::-1] if descending else np.sort(kv)
    np.testing.assert_array_equal(np.asarray(k)[:nvalid], want)
    np.testing.assert_array_equal(np.asarray(keys)[np.asarray(v).astype(int)], k)
    assert np.asarray(m)[:nvalid].all() and not np.asarray(m)[nvalid:].any()


def test_mask_all_reductions(lanes):
    x = jnp.arange(lanes) % 5 == 3
    pc = _interpret_value(plsc.all_reduce_population_count, x)
    np.testing.assert_array_equal(pc, np.full(lanes, int(x.sum())))
    ffs = _interpret_value(plsc.all_reduce_ffs, x)
    np.testing.assert_array_equal(ffs, np.full(lanes, 3))
    none = _interpret_value(plsc.all_reduce_ffs, jnp.zeros(lanes, bool))
    np.testing.assert_array_equal(none, np.full(lanes, lanes))


def test_parallel_loop_with_carry(vector_kernel, lanes):
    @vector_kernel(sds((4 * lanes,), I32), scratch=[pltpu.VMEM((lanes,), I32)])
    def k(o_hbm, v):
        @plsc.parallel_loop(0, 4 * lanes, lanes, carry=jnp.int32(1))
        def total(i, j):
            v[...] = jnp.arange(lanes, dtype=I32) + i * j
            pltpu.sync_copy(v, o_hbm.at[pl_ds(i, lanes)])
            return j + 1

        del total

    want = np.concatenate([np.arange(lanes) + lanes * t * (t + 1) for t in range(4)])
    np.testing.assert_array_equal(k(), want)


def pl_ds(i, n):
    import pallas as pl

    return pl.ds(i, n)


def test_subcore_barrier_and_fetch_and_add(vector_kernel, lanes):
    @vector_kernel(sds((lanes,), I32), subcores=4,
                   scratch=[pltpu.SMEM((1,), I32), pltpu.VMEM((lanes,), I32)])
    def k(o_hbm, counter, v):
        s = jax.lax.axis_index("subcore")

        @jax.named_call
        def init():
            counter[0] = 0

        jax.lax.cond(s == 0, init, lambda: None)
        plsc.subcore_barrier()
        old = plsc.fetch_and_add(counter.at[0], jnp.int32(1), subcore_id=jnp.int32(0))
        v[...] = jnp.full((lanes,), old, I32)

        @jax.named_call
        def write():
            pltpu.sync_copy(v, o_hbm)

        jax.lax.cond(s == 3, write, lambda: None)

    np.testing.assert_array_equal(k(), np.full(lanes, 3))


def test_kernels_also_run_under_tpu_interpret_params(lanes):
    """pallas-tpu's simulated TPU (interpret=pltpu.InterpretParams()) runs the SparseCore
    primitives with these same rules, on numpy buffers."""
    import pallas as pl

    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)

    @pl.kernel(out_type=sds((lanes,), F32), mesh=mesh, interpret=pltpu.InterpretParams(),
               scratch_types=[pltpu.VMEM((lanes,), F32), pltpu.VMEM((lanes,), I32)])
    def k(i_hbm, o_hbm, acc, i):
        pltpu.sync_copy(i_hbm, i)
        acc[...] = jnp.zeros((lanes,), F32)
        plsc.addupdate_scatter(acc, [i[...]], jnp.ones((lanes,), F32))
        acc[...] = plsc.load_gather(acc, [i[...]]) + plsc.cumsum(acc[...])
        pltpu.sync_copy(acc, o_hbm)

    idx = np.arange(lanes) % 4
    counts = np.bincount(idx, minlength=lanes).astype(np.float32)
    np.testing.assert_array_equal(k(jnp.asarray(idx, I32)), counts[idx] + np.cumsum(counts))
