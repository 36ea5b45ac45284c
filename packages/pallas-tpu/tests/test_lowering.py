"""Lowering to Mosaic TPU on a CPU machine: structural checks on the emitted modules.

Every test lowers with ``lowering_platforms=("tpu",)``; the ``lower_tpu`` fixture then
decodes the Mosaic module carried by each ``tpu_custom_call``, deserialises it with the
TPU dialect loaded and verifies it.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import pallas as pl
import pallas_tpu as pltpu
from pallas_tpu.inspect import backend_configs

F32 = jnp.float32
ANY = pltpu.MemorySpace.ANY


def _one_block(kernel, *shapes, out=None, **kw):
    """A grid-less pallas_call over whole arrays (for value-level op tests)."""
    out = out or jax.ShapeDtypeStruct(shapes[0].shape, shapes[0].dtype)
    return lambda *args: pl.pallas_call(kernel, out_shape=out, **kw)(*args)


def _main(module):
    for op in module.body.operations:
        if op.operation.name == "func.func" and str(op.attributes["sym_name"]) == '"main"':
            return op
    raise AssertionError("no @main")


def test_elementwise_kernel(lower_tpu, ops):
    def kernel(x_ref, y_ref, o_ref):
        x, y = x_ref[...], y_ref[...]
        z = jnp.where(x > y, jnp.exp(x) * 2.0, jnp.maximum(x, y) - jnp.tanh(y))
        o_ref[...] = (z / (1.0 + jnp.abs(x))).astype(o_ref.dtype)

    x = jnp.zeros((256, 512), F32)
    f = lambda x, y: pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.bfloat16), grid=(2, 4),
        in_specs=[pl.BlockSpec((128, 128), lambda i, j: (i, j))] * 2,
        out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(x, y)
    lowered, (m,) = lower_tpu(f, x, x)
    names = collections.Counter(ops(m))
    for op in ["arith.cmpf", "math.exp", "arith.maximumf", "math.tanh", "math.absf",
               "arith.select", "arith.divf", "arith.truncf", "vector.load", "vector.store"]:
        assert names[op] >= 1, op
    main = _main(m)
    assert str(main.attributes["iteration_bounds"]) == "array<i64: 2, 4>"
    assert "parallel" in str(main.attributes["dimension_semantics"])
    assert str(main.attributes["tpu.core_type"]) == "#tpu.core_type<tc>"
    wp = str(main.attributes["window_params"])
    assert wp.count("window_bounds = array<i64: 128, 128>") == 3
    assert "@transform_0" in wp and "@transform_2" in wp
    assert names["func.func"] == 4  # main + one transform per operand
    text = lowered.as_text()
    assert "tpu_custom_call" in text and 'kernel_name = "kernel"' in text
    assert "bf16" in str(m)


def test_matmul_3d_grid_with_accumulator(lower_tpu, ops, export_tpu):
    def kernel(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=F32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def matmul(x, y):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype),
            grid=(2, 2, 3),
            in_specs=[pl.BlockSpec((128, 128), lambda i, j, k: (i, k)),
                      pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
            scratch_shapes=[pltpu.VMEM((128, 128), F32)],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "arbitrary"),
                vmem_limit_bytes=32 << 20),
        )(x, y)

    x = jnp.zeros((256, 384), jnp.bfloat16)
    y = jnp.zeros((384, 256), jnp.bfloat16)
    lowered, (m,) = lower_tpu(matmul, x, y)
    names = collections.Counter(ops(m))
    assert names["tpu.matmul"] == 1 and names["scf.if"] == 2
    text = str(m)
    assert "#tpu.dot_dimension_numbers<[1], [0], [0], [1], [0, 0, 1, 1], [], []>" in text
    assert "vector<128x128xbf16>, vector<128x128xbf16>, vector<128x128xf32> -> vector<128x128xf32>" in text
    main = _main(m)
    assert str(main.attributes["scratch_operands"]) == "1 : i64"
    assert "memref<128x128xf32, #tpu.memory_space<vmem>>" in str(main.type)
    assert "arbitrary" in str(main.attributes["dimension_semantics"])
    (cfg,) = backend_configs(lowered)
    assert cfg["scoped_memory_configs"][0]["size"] == 32 << 20
    export_tpu(matmul, x, y)


@pytest.mark.parametrize("reduce,kind", [(jnp.sum, "add"), (jnp.max, "maximumf"),
                                         (jnp.min, "minimumf")])
def test_reductions(lower_tpu, ops, reduce, kind):
    def kernel(x_ref, o_ref):
        o_ref[...] = reduce(x_ref[...], axis=1, keepdims=True) + reduce(x_ref[...])

    x = jnp.zeros((8, 256), F32)
    _, (m,) = lower_tpu(_one_block(kernel, x, out=jax.ShapeDtypeStruct((8, 1), F32)), x)
    text = str(m)
    assert f"vector.multi_reduction <{kind}>" in text
    assert "[1] : vector<8x256xf32> to vector<8xf32>" in text
    # Mosaic reduces vectors to vectors only: a full reduction goes through vector<1>.
    assert "[0] : vector<8x256xf32> to vector<256xf32>" in text
    assert "[1] : vector<1x256xf32> to vector<1xf32>" in text
    assert "vector.extract" in text


def test_int_reduction_and_iota(lower_tpu):
    def kernel(x_ref, o_ref):
        i = lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
        o_ref[...] = jnp.max(x_ref[...] * i, axis=0, keepdims=True)

    x = jnp.zeros((8, 128), jnp.int32)
    _, (m,) = lower_tpu(_one_block(kernel, x, out=jax.ShapeDtypeStruct((1, 128), jnp.int32)), x)
    text = str(m)
    assert "tpu.iota" in text and "vector.multi_reduction <maxsi>" in text
    assert "arith.muli" in text


def test_fori_loop_and_while_loop(lower_tpu, ops):
    def kernel(x_ref, o_ref):
        def body(i, acc):
            return acc + x_ref[pl.ds(pl.multiple_of(i * 8, 8), 8), :]

        acc = lax.fori_loop(0, 4, body, jnp.zeros((8, 128), F32))
        n = lax.while_loop(lambda c: c < 10, lambda c: c * 2 + 1, 1)
        o_ref[...] = acc * n.astype(F32)

    x = jnp.zeros((32, 128), F32)
    _, (m,) = lower_tpu(_one_block(kernel, x, out=jax.ShapeDtypeStruct((8, 128), F32)), x)
    names = collections.Counter(ops(m))
    assert names["scf.for"] == 1 and names["scf.while"] == 1
    assert names["tpu.assume_multiple"] == 1
    assert "arith.index_cast" in names


def test_a_fori_loop_with_run_time_bounds_is_an_scf_for(lower_tpu, ops):
    """``fori_loop`` with bounds known at run time is a ``while_loop`` in the jaxpr; it
    lowers to ``scf.for`` over i32 (as upstream's lowering), without the per-step
    compare and add of an ``scf.while``. Other ``while_loop``s stay ``scf.while``."""
    def kernel(n_ref, x_ref, o_ref):
        acc = lax.fori_loop(n_ref[0], n_ref[1], lambda i, a: a + x_ref[...] * i.astype(F32),
                            jnp.zeros((8, 128), F32))
        m = lax.while_loop(lambda c: c < n_ref[1], lambda c: c + 1, n_ref[0])
        o_ref[...] = acc + m.astype(F32)

    def f(n, x):
        smem = pl.BlockSpec(memory_space=pltpu.SMEM)
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              in_specs=[smem, pl.BlockSpec((8, 128), lambda: (0, 0))])(n, x)

    n, x = jnp.zeros((2,), jnp.int32), jnp.zeros((8, 128), F32)
    _, (m,) = lower_tpu(f, n, x)
    names = collections.Counter(ops(m))
    # The while_loop's condition reads n_ref (a const of its cond): not fori's form.
    assert names["scf.for"] == 1 and names["scf.while"] == 1
    assert "scf.for %arg3 = %" in str(m) and ": i32 {" in str(m)


def test_scalar_prefetch_and_smem(lower_tpu, ops):
    def kernel(idx_ref, x_ref, o_ref):
        s = idx_ref[pl.program_id(0)]
        o_ref[...] = x_ref[...] * s.astype(F32)

    def f(idx, x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(4,),
                in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (idx[i], 0))],
                out_specs=pl.BlockSpec((8, 128), lambda i, idx: (i, 0))),
        )(idx, x)

    idx = jnp.zeros((4,), jnp.int32)
    x = jnp.zeros((32, 128), F32)
    _, (m,) = lower_tpu(f, idx, x)
    main = _main(m)
    assert str(main.attributes["scalar_prefetch"]) == "1 : i64"
    assert "memref<4xi32, #tpu.memory_space<smem>>" in str(main.type)
    # The index map reads the prefetched ref in its transform function.
    transform0 = [op for op in m.body.operations
                  if str(op.attributes["sym_name"]) == '"transform_0"'][0]
    assert "memref.load" in str(transform0)
    assert "memref.load" in ops(m)


def test_int8_scalar_prefetch_lives_in_smem(lower_tpu):
    """Compact int8 tables (splash attention's downcast block masks) are scalar
    prefetch operands too: an i8 SMEM memref, read and widened in the kernel."""
    def kernel(idx_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * idx_ref[pl.program_id(0)].astype(jnp.int32).astype(F32)

    def f(idx, x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(4,),
                in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (idx[i], 0))],
                out_specs=pl.BlockSpec((8, 128), lambda i, idx: (i, 0))),
        )(idx, x)

    _, (m,) = lower_tpu(f, jnp.zeros((4,), jnp.int8), jnp.zeros((32, 128), F32))
    assert "memref<4xi8, #tpu.memory_space<smem>>" in str(_main(m).type)


def test_64_bit_scalar_prefetch_is_refused(lower_tpu):
    def kernel(idx_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

    def f(idx):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(1,),
                out_specs=pl.BlockSpec((8, 128), lambda i, idx: (0, 0))),
            backend="mosaic_tpu")(idx)

    with jax.enable_x64(True), pytest.raises(TypeError, match="at most 32 bits"):
        jax.jit(f).trace(jnp.zeros((4,), jnp.int64)).lower(lowering_platforms=("tpu",))


@pytest.mark.parametrize("access", ["load", "store"])
def test_a_load_or_store_of_an_any_ref_is_refused_with_upstreams_message(lower_tpu, access):
    # The TPU compiler rejects it ("Failed to propagate a memory space change"); refused
    # at lowering, as upstream, naming the ref and saying to use a DMA.
    def kernel(x_ref, o_ref):
        if access == "load":
            o_ref[...] = x_ref[...] + 1.0
        else:
            o_ref[...] = jnp.zeros((8, 128), F32)

    spec = pl.BlockSpec(memory_space=ANY)
    x = jax.ShapeDtypeStruct((8, 128), F32)
    f = pl.pallas_call(kernel, out_shape=x,
                       in_specs=[spec if access == "load" else pl.BlockSpec((8, 128))],
                       out_specs=spec if access == "store" else pl.BlockSpec((8, 128)))
    what = "Loads" if access == "load" else "Loads and stores"
    with pytest.raises(Exception, match=(
            rf"{what} are only allowed on VMEM and SMEM references\. ANY memory space can "
            rf"only be accessed using async_copy\. \(a ref of shape \(8, 128\) and dtype "
            rf"float32 in memory space any: copy it to VMEM with pltpu\.async_copy")):
        lower_tpu(f, x)


def test_a_dma_of_bools_is_refused_first_with_upstreams_message(lower_tpu):
    # upstream's test_bool_dma_not_implemented: its copy also has mismatched shapes;
    # the bool refusal comes first, as in upstream's lowering.
    def kernel(x_ref, o_ref, sem):
        copy = pltpu.make_async_copy(x_ref.at[:, pl.ds(0, 16)], o_ref, sem)
        copy.start()
        copy.wait()

    x = jax.ShapeDtypeStruct((8, 128), jnp.bool_)
    f = pl.pallas_call(kernel, out_shape=x, in_specs=[pl.BlockSpec(memory_space=ANY)],
                       out_specs=pl.BlockSpec(memory_space=ANY),
                       scratch_shapes=[pltpu.SemaphoreType.DMA])
    with pytest.raises(Exception, match=r"DMAs with bool dtypes are not supported\. \(a "
                                        r"copy of bool\[8,16\]: copy it as int32"):
        lower_tpu(f, x)


def test_ref_reshape_and_bitcast_lower_to_memref_views(lower_tpu, ops):
    """``ref.reshape(...)`` and ``ref.bitcast(...)`` (ragged paged attention folds its
    KV pages this way) become ``tpu.memref_reshape`` / ``tpu.memref_bitcast`` views."""
    def kernel(x_ref, y_ref, o_ref, p_ref):
        o_ref[...] = x_ref.reshape(16, 128)[...]
        p_ref[...] = y_ref.bitcast(jnp.float32)[...]

    def f(x, y):
        return pl.pallas_call(
            kernel, out_shape=(jax.ShapeDtypeStruct((16, 128), F32),
                               jax.ShapeDtypeStruct((8, 128), F32)))(x, y)

    _, (m,) = lower_tpu(f, jnp.zeros((2, 8, 128), F32), jnp.zeros((8, 128), jnp.int32))
    names = ops(m)
    assert "tpu.memref_reshape" in names and "tpu.memref_bitcast" in names


def test_squeezed_block_dims(lower_tpu):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    def f(x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
            in_specs=[pl.BlockSpec((None, 8, 128), lambda b: (b, 0, 0))],
            out_specs=pl.BlockSpec((pl.squeezed, 8, 128), lambda b: (b, 0, 0)),
        )(x)

    x = jnp.zeros((4, 8, 128), F32)
    _, (m,) = lower_tpu(f, x)
    text = str(m)
    assert "window_bounds = array<i64: 1, 8, 128>" in text
    assert "vector<1x8x128xf32>" in text and "vector.shape_cast" in text


def test_double_buffered_dma(lower_tpu, ops, export_tpu):
    def kernel(x_hbm, o_ref, buf, sem):
        i, n = pl.program_id(0), pl.num_programs(0)
        slot = i % 2

        def copy(j, s):
            return pltpu.make_async_copy(x_hbm.at[pl.ds(j * 8, 8)], buf.at[s], sem.at[s])

        @pl.when(i == 0)
        def _():
            copy(0, 0).start()

        @pl.when(i + 1 < n)
        def _():
            copy(i + 1, 1 - slot).start()

        copy(i, slot).wait()
        o_ref[...] = buf[slot]

    def f(x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(8,),
            in_specs=[pl.BlockSpec(memory_space=ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            scratch_shapes=[pltpu.VMEM((2, 8, 128), F32), pltpu.SemaphoreType.DMA((2,))],
        )(x)

    x = jnp.zeros((64, 128), F32)
    lowered, (m,) = lower_tpu(f, x)
    names = collections.Counter(ops(m))
    assert names["tpu.enqueue_dma"] == 2 and names["tpu.wait_dma2"] == 1
    assert names["tpu.memref_slice"] >= 6 and names["tpu.memref_squeeze"] >= 4
    main = _main(m)
    sig = str(main.type)
    assert "memref<64x128xf32, #tpu.memory_space<any>>" in sig
    assert "memref<2x!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>" in sig
    wp = str(main.attributes["window_params"])
    assert wp.startswith("[{}, {transform_indices")  # the ANY operand has no window
    assert "tpu_custom_call" in export_tpu(f, x).mlir_module()


def test_semaphores_and_run_scoped(lower_tpu, ops):
    def kernel(x_hbm, o_hbm):
        def body(buf, dma_sem, sem):
            pltpu.async_copy(x_hbm, buf, dma_sem).wait()
            pl.semaphore_signal(sem, 2)
            pl.semaphore_wait(sem, 2)
            pltpu.sync_copy(buf, o_hbm)

        pl.run_scoped(body, pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA,
                      pltpu.SemaphoreType.REGULAR)

    x = jnp.zeros((8, 128), F32)
    f = _one_block(kernel, x, in_specs=[pl.BlockSpec(memory_space=ANY)],
                   out_specs=pl.BlockSpec(memory_space=ANY))
    _, (m,) = lower_tpu(f, x)
    names = collections.Counter(ops(m))
    assert names["tpu.region"] == 2  # the outer run_scoped and sync_copy's own
    assert names["tpu.sem_alloc"] == 3 and names["memref.alloca"] == 1
    assert names["tpu.sem_signal"] == 1 and names["tpu.sem_wait"] == 1
    assert names["tpu.enqueue_dma"] == 2 and names["tpu.wait_dma2"] == 2


def test_tpu_value_primitives(lower_tpu, ops):
    def kernel(x_ref, i_ref, o_ref, b_ref, r_ref):
        x = x_ref[...]
        o_ref[...] = pltpu.roll(x, 3, 1) + pltpu.roll(x, i_ref[0, 0], 0)
        b_ref[...] = pltpu.bitcast(x, jnp.int32)
        pltpu.prng_seed(i_ref[0, 0])
        bits = pltpu.prng_random_bits(x.shape)
        r_ref[...] = pltpu.stochastic_round(x, bits, target_dtype=jnp.bfloat16)
        pltpu.trace_value("x", x_ref[0, 0])

    x = jnp.zeros((8, 128), F32)
    i = jnp.zeros((8, 128), jnp.int32)
    outs = (jax.ShapeDtypeStruct((8, 128), F32), jax.ShapeDtypeStruct((8, 128), jnp.int32),
            jax.ShapeDtypeStruct((8, 128), jnp.bfloat16))
    _, (m,) = lower_tpu(_one_block(kernel, x, out=outs), x, i)
    names = collections.Counter(ops(m))
    assert names["tpu.dynamic_rotate"] == 2 and names["tpu.bitcast"] == 1
    assert names["tpu.prng_set_seed_32"] == 1 and names["tpu.prng_random_bits"] == 1
    assert names["tpu.stochastic_convert"] == 1 and names["tpu.trace_value"] == 1


def test_more_elementwise_and_reductions(lower_tpu, ops):
    def kernel(x_ref, i_ref, o_ref, j_ref):
        x, i = x_ref[...], i_ref[...]
        y = jnp.arcsin(jnp.clip(x, -1, 1)) + jnp.arctan2(x, 2.0) + jnp.round(x) + jnp.sinh(x)
        y = jnp.where(jnp.isfinite(x), y, 0.0) * jnp.prod(x, axis=0, keepdims=True)
        o_ref[...] = jnp.concatenate([y[:, :64] * 0 + y[:, 64:], y[:, 64:]], axis=1)
        j_ref[...] = jnp.sign(i) + lax.population_count(i) + lax.clz(i)

    x = jnp.zeros((8, 128), F32)
    i = jnp.zeros((8, 128), jnp.int32)
    _, (m,) = lower_tpu(_one_block(kernel, x, out=(jax.ShapeDtypeStruct(x.shape, F32),
                                                   jax.ShapeDtypeStruct(i.shape, jnp.int32))),
                        x, i)
    names = collections.Counter(ops(m))
    for op in ["math.atan2", "math.roundeven", "math.exp", "math.ctpop", "math.ctlz",
               "tpu.concatenate", "vector.extract_strided_slice"]:
        assert names[op] >= 1, op
    # Mosaic legalizes none of these: expanded (see test_lowering_for_mosaic.py).
    for op in ["math.asin", "math.sinh", "math.isfinite"]:
        assert names[op] == 0, op
    assert "vector.multi_reduction <mul>" not in str(m)


def test_batched_matmul_and_argmax(lower_tpu, ops):
    def kernel(x_ref, y_ref, o_ref, a_ref):
        o_ref[...] = jnp.einsum("bmk,bkn->bmn", x_ref[...], y_ref[...],
                                preferred_element_type=F32)
        a_ref[...] = jnp.argmax(o_ref[0], axis=1, keepdims=True).astype(jnp.int32)

    x = jnp.zeros((2, 8, 128), F32)
    outs = (jax.ShapeDtypeStruct((2, 8, 128), F32), jax.ShapeDtypeStruct((8, 1), jnp.int32))
    _, (m,) = lower_tpu(_one_block(kernel, x, out=outs), x, jnp.zeros((2, 128, 128), F32))
    text = str(m)
    assert "#tpu.dot_dimension_numbers<[2], [1], [1], [2], [0, 0, 0, 1, 1, 2], [0], [0]>" in text
    assert "vector.multi_reduction <minsi>" in text and "tpu.iota" in text


def test_transpose_and_masked_store(lower_tpu, ops):
    def kernel(x_ref, o_ref):
        xt = x_ref[...].T
        mask = lax.broadcasted_iota(jnp.int32, xt.shape, 0) < 64
        pl.store(o_ref, xt, mask=mask)

    x = jnp.zeros((128, 128), F32)
    _, (m,) = lower_tpu(_one_block(kernel, x), x)
    names = collections.Counter(ops(m))
    assert names["tpu.transpose"] == 1 and names["tpu.vector_store"] == 1


def test_a_dma_semaphore_operand_is_typed_as_a_dma_semaphore(lower_tpu,
                                                             async_copy_across_calls):
    # Regression: typed !tpu.semaphore, tpu.wait_dma2 failed verification.
    x = jnp.zeros((8, 128), F32)
    lowered, (start, done) = lower_tpu(async_copy_across_calls, x)
    for m in (start, done):
        sem_types = [str(a.type) for a in _main(m).regions[0].blocks[0].arguments
                     if "semaphore" in str(a.type)]
        assert sem_types == ["memref<!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>"]
    # The semaphore output stays in semaphore memory (as upstream places it), while the
    # semaphore input carries no placement (XLA places inputs in HBM, VMEM or SMEM only).
    start_cfg, done_cfg = [c["custom_call_config"] for c in backend_configs(lowered)]
    assert start_cfg["output_memory_space_colors"] == [{"color": 2, "shape_index": [2]}]
    assert "input_memory_space_colors" not in done_cfg


def test_input_output_aliases_reach_the_custom_call(lower_tpu):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    x = jnp.zeros((8, 128), F32)
    lowered, _ = lower_tpu(_one_block(kernel, x, input_output_aliases={0: 0}), x)
    assert "output_operand_aliases" in lowered.as_text()


# -- trace-time errors ------------------------------------------------------------------------


def _blocked(block, shape=(64, 256), dtype=F32, kernel=None):
    kernel = kernel or (lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]))
    grid = tuple(s // b for s, b in zip(shape, block))
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(shape, dtype), grid=grid,
        in_specs=[pl.BlockSpec(block, lambda i, j: (i, j))],
        out_specs=pl.BlockSpec(block, lambda i, j: (i, j)),
        compiler_params=pltpu.CompilerParams(),
    )


def test_block_shape_rule_is_enforced_at_trace_time():
    x = jnp.zeros((64, 256), F32)
    with pytest.raises(ValueError, match=r"args\[0\].*last block dimension 64 must be divisible by 128"):
        jax.eval_shape(_blocked((8, 64)), x)
    with pytest.raises(ValueError, match="second-to-last block dimension 4 must be divisible by 8"):
        jax.eval_shape(_blocked((4, 128)), x)
    jax.eval_shape(_blocked((8, 128)), x)  # fine
    jax.eval_shape(_blocked((64, 256)), x)  # full dims are fine


def test_unsupported_dtypes_are_rejected_at_trace_time():
    x = jnp.zeros((64, 256), jnp.int2)
    with pytest.raises(TypeError, match="int2.*sub-byte"):
        jax.eval_shape(_blocked((8, 128), dtype=jnp.int2), x)


def test_unsigned_max_is_maxui_on_scalars_and_a_select_on_vectors(lower_tpu, ops):
    # Mosaic has arith.maxui on i32 scalars and refuses it narrower by name ("Only i1 and
    # i32 scalars are supported", as upstream's PallasScalarIOpsTest expects); the VPU
    # has no unsigned max, so vectors compare unsigned and select.
    def kernel(s_ref, v_ref, so_ref, vo_ref):
        so_ref[0] = jnp.maximum(s_ref[0], s_ref[1])
        vo_ref[...] = jnp.minimum(v_ref[...], v_ref[...] + 1)

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    f = pl.pallas_call(kernel, in_specs=[smem, pl.BlockSpec()],
                       out_specs=[smem, pl.BlockSpec()],
                       out_shape=[jax.ShapeDtypeStruct((2,), jnp.uint8),
                                  jax.ShapeDtypeStruct((8, 128), jnp.uint32)])
    _, (m,) = lower_tpu(f, jnp.zeros((2,), jnp.uint8), jnp.zeros((8, 128), jnp.uint32))
    names = ops(m)
    assert "arith.maxui" in names and "arith.minui" not in names
    assert "arith.cmpi" in names and "arith.select" in names


def test_int4_operands_lower_to_i4_memrefs(lower_tpu):
    # int4/uint4 are Mosaic's i4 (as upstream passes them), not refused at trace time:
    # Mosaic itself rejects arithmetic on them, with its own message.
    for dt in (jnp.int4, jnp.uint4):
        _, (mod,) = lower_tpu(_blocked((8, 128), dtype=dt), jnp.zeros((64, 256), dt))
        assert "memref<8x128xi4, #tpu.memory_space<vmem>>" in str(mod)


def test_unsupported_primitive_is_rejected_at_trace_time():
    def kernel(x_ref, o_ref):
        o_ref[...] = lax.cumlogsumexp(x_ref[...], axis=0)

    with pytest.raises(NotImplementedError, match="cumlogsumexp.*mosaic_tpu.*interpret=True"):
        jax.eval_shape(_blocked((8, 128), kernel=kernel), jnp.zeros((64, 256), F32))


def test_dimension_semantics_must_match_grid():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32), grid=(1,),
                       compiler_params=pltpu.CompilerParams(
                           dimension_semantics=("parallel", "parallel")))
    with pytest.raises(ValueError, match="2 entries but the grid"):
        jax.eval_shape(f, jnp.zeros((8, 128), F32))


def test_unsupported_transpose_fails_with_a_clear_lowering_error(lower_tpu):
    # Up to 4 dims any permutation lowers (libtpu compiles them); 5 dims only the last two.
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.transpose(x_ref[...], (1, 0, 2, 3, 4))

    x = jnp.zeros((2, 2, 2, 8, 128), F32)
    with pytest.raises(pltpu.LoweringException, match=r"transpose.*last two"):
        lower_tpu(_one_block(kernel, x), x)


def test_0d_operands_and_outputs_live_in_smem(lower_tpu, ops):
    # Regression: reading a ()-shaped VMEM ref used to hand a scalar to vector.extract,
    # which crashed the Python process inside the MLIR bindings. 0-d 32-bit operands
    # now go to SMEM (no tile to live in) unless placed explicitly.
    def kernel(s_ref, x_ref, o_ref, t_ref):
        o_ref[...] = x_ref[...] * s_ref[...]
        t_ref[...] = jnp.sum(x_ref[...])

    s, x = jnp.zeros((), F32), jnp.zeros((8, 128), F32)
    f = lambda s, x: pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct(x.shape, F32), jax.ShapeDtypeStruct((), F32)),
        compiler_params=pltpu.CompilerParams())(s, x)
    _, (m,) = lower_tpu(f, s, x)
    names = collections.Counter(ops(m))
    assert names["memref.load"] == 1 and names["memref.store"] == 1
    assert str(m).count("memref<f32, #tpu.memory_space<smem>>") >= 2


def test_a_0d_vmem_ref_fails_with_a_clear_lowering_error_not_a_crash(lower_tpu):
    def kernel(s_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * s_ref[...]

    s, x = jnp.zeros((), F32), jnp.zeros((8, 128), F32)
    f = lambda s, x: pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, F32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec((8, 128), lambda: (0, 0))],
        compiler_params=pltpu.CompilerParams())(s, x)
    with pytest.raises(pltpu.LoweringException, match=r"'get'.*0-d\) VMEM ref"):
        lower_tpu(f, s, x)


def _adds_in_a_loop(n, unroll):
    def kernel(x_ref, y_ref):
        y_ref[...] = x_ref[...]

        def body(i, _):
            y_ref[...] += i

        lax.fori_loop(0, n, body, None, unroll=unroll)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                          debug=True)


@pytest.mark.parametrize("n, unroll, loops, adds", [
    (5, True, 0, 5), (5, 0, 0, 5), (7, 2, 1, 3), (6, 1, 1, 1)])
def test_fori_loop_unroll_as_upstream(lower_tpu, ops, capsys, n, unroll, loops, adds):
    # unroll=k: k bodies per scf.for step and the leftover ones after it; unroll=True
    # (or 0, JAX's "unroll it all") leaves no loop. debug=True prints the module.
    _, (m,) = lower_tpu(_adds_in_a_loop(n, unroll), jnp.zeros((1,), jnp.int32))
    names = ops(m)
    assert names.count("scf.for") == loops
    assert names.count("arith.addi") >= adds
    printed = capsys.readouterr().out
    assert "The Mosaic module for pallas_call" in printed
    assert printed.count("scf.for") == loops


def test_named_scopes_are_traced(lower_tpu, ops):
    # As upstream: a jax.named_scope in a kernel is a tpu.trace_start/stop pair, also in
    # a run_scoped body and a loop.
    def kernel(o_ref):
        with jax.named_scope("outer"):
            o_ref[...] = jnp.zeros_like(o_ref)

        def body(i, c):
            with jax.named_scope("step"):
                o_ref[...] += 1.0
            return c

        pl.run_scoped(lambda: lax.fori_loop(0, 3, body, 0))

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32))
    _, (m,) = lower_tpu(f)
    names = ops(m)
    assert names.count("tpu.trace_start") == names.count("tpu.trace_stop") == 2
    assert 'message = "outer"' in str(m) and 'message = "step"' in str(m)
