"""An emulated TPU (``pl.emulate_device("tpu:v5e")``): a plain ``pallas_call`` on the CPU
runs the Mosaic module the mosaic_tpu backend generates, under its executor; the device
queries answer for the emulated chip. A fault planted in the TPU lowering shows that
this path, not the interpreter, is the one being run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
import pallas_tpu as pltpu
from pallas_tpu._src.lowering import rules_arith

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _load(name):
    path = EXAMPLES / f"{name}.py"
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    spec = importlib.util.spec_from_file_location(f"pallas_tpu_emulated_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sub(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] - y_ref[...]


def _sub_call(x, y):
    return pl.pallas_call(_sub, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
Y = jnp.full((8, 128), 3.0, jnp.float32)


def _kernel_for(name):
    return [k for k in pallas.plugins.emulated_kernels() if k.name.startswith(name)]


def test_quickstart_kernels_match_the_interpreter_on_v5e():
    qs = _load("quickstart")
    for name, fn, _, args, tol in qs.examples():
        want = fn(*args, interpret=True)
        with pl.emulate_device("tpu:v5e"):
            got = fn(*args)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=max(tol, 1e-5), err_msg=name)
    kernels = [k for k in _kernel_for("add_kernel") if k.device.spec == "tpu:v5e"]
    assert kernels and {k.backend for k in kernels} == {"mosaic_tpu"}
    assert kernels[-1].calls >= 1


def test_tpu_matmul_example_on_v6e():
    ex = _load("tpu_matmul")
    x, y = ex.inputs(256, 256, 128)
    with pl.emulate_device("tpu:v6e"):
        got = jax.jit(ex.matmul)(x, y)
    np.testing.assert_allclose(got.astype(jnp.float32),
                               ex.matmul(x, y, interpret=True).astype(jnp.float32),
                               rtol=1e-2, atol=1e-2)


def test_a_fault_planted_in_the_tpu_lowering_fails_the_emulated_run(monkeypatch):
    want = np.asarray(X - Y)
    monkeypatch.setitem(rules_arith._BINARY, jax.lax.sub_p, rules_arith._BINARY[jax.lax.add_p])
    # The interpreter does not look at the lowering: still right.
    np.testing.assert_array_equal(
        pl.pallas_call(_sub, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                       interpret=True)(X, Y), want)
    with pl.emulate_device("tpu:v5e"):
        got = np.asarray(_sub_call(X, Y))
    np.testing.assert_array_equal(got, np.asarray(X + Y))  # the planted add ran


def test_device_queries_answer_for_the_emulated_chip():
    with pl.emulate_device("tpu:v5p"):
        info = pltpu.get_tpu_info()
        assert str(info.chip_version) == "v5p" and info.num_cores == 2
        assert pltpu.is_tpu_device()
    with pl.emulate_device("tpu:v5e"):
        assert str(pltpu.get_tpu_info().chip_version) == "v5e"
        assert pltpu.get_tpu_info().num_cores == 1
    with pl.emulate_device("cuda:sm_90a"), pytest.raises(ValueError):
        pltpu.get_tpu_info()


def test_jit_vmap_grad_and_custom_vjp_compose():
    def f(x):
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(
            ..., jnp.sin(x_ref[...]) * 2.0), out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    @jax.custom_vjp
    def g(x):
        return f(x)

    g.defvjp(lambda x: (f(x), None), lambda _, ct: (f(ct),))
    x = jnp.linspace(0.0, 1.0, 8 * 128, dtype=jnp.float32).reshape(8, 128)
    xs = jnp.stack([x, x + 1.0])
    with pl.emulate_device("tpu:v5e"):
        np.testing.assert_allclose(jax.jit(f)(x), jnp.sin(x) * 2, rtol=1e-6)
        np.testing.assert_allclose(jax.vmap(f)(xs), jnp.sin(xs) * 2, rtol=1e-6)
        np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x), jnp.cos(x) * 2,
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(jax.grad(lambda x: g(x).sum())(x),
                                   jnp.full_like(x, np.sin(1.0) * 2), rtol=1e-6)
        lowered = jax.jit(f).lower(x).as_text()
    assert "callback" in lowered  # the host runs the generated code


def test_the_emulated_device_is_part_of_the_jit_key():
    f = jax.jit(_sub_call)
    with pl.emulate_device("tpu:v5e"):
        assert "callback" in f.lower(X, Y).as_text()
    assert "callback" not in f.lower(X, Y).as_text()  # outside: the interpreter again


def test_the_compile_step_is_recorded_as_skipped_or_done():
    with pl.emulate_device("tpu:v5e"):
        jax.block_until_ready(_sub_call(X, Y + 1))
    k = [k for k in _kernel_for("_sub") if k.device.spec == "tpu:v5e"][-1]
    b = pallas.plugins.get_backend("mosaic_tpu")
    if "compile" in b.levels:
        assert k.compiled is not None and not k.compile_skipped
    else:
        assert k.compiled is None and "no compile level" in k.compile_skipped


def test_a_kernel_addressing_other_devices_runs_on_the_interpreter():
    # The executors run one device's code: a remote copy (to the next device of a
    # shard_map ring) runs with the interpreter's cross-device semantics instead.
    from jax.sharding import PartitionSpec as P

    n = min(2, len(jax.devices()))
    mesh = jax.make_mesh((n,), ("d",))

    def kernel(x_ref, o_ref, send_sem, recv_sem):
        right = jax.lax.rem(jax.lax.axis_index("d") + 1, n)
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem,
                                            device_id=right,
                                            device_id_type=pl.DeviceIdType.LOGICAL)
        copy.start()
        copy.wait()

    def f(x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])(x)

    x = jax.device_put(jnp.arange(n * 8 * 128, dtype=jnp.float32).reshape(n * 8, 128),
                       jax.NamedSharding(mesh, P("d")))
    with pl.emulate_device("tpu:v5e"):
        y = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P("d"),
                                  check_vma=False))(x)
    np.testing.assert_array_equal(np.asarray(y), np.roll(np.asarray(x), 8, axis=0))
    k = [k for k in _kernel_for("kernel") if k.device.spec == "tpu:v5e"][-1]
    assert k.run is None and "core interpreter" in k.executor
    assert k.compiled is None and "other devices" in k.compile_skipped


def test_the_interpreter_starts_a_semaphore_output_at_zero(async_copy_across_calls):
    # Regression: it started at the poison value, so a DMA's signal (its size in bytes)
    # read as a negative count and the emulated next kernel's wait blocked.
    def start(x_ref, o_ref, sem):
        pltpu.make_async_copy(x_ref, o_ref, sem).start()

    anys = pl.BlockSpec(memory_space=pl.ANY)
    _, sem = pl.pallas_call(
        start, in_specs=[anys], out_specs=(anys, pl.BlockSpec(memory_space=pltpu.SEMAPHORE)),
        out_shape=(jax.ShapeDtypeStruct.like(X), pltpu.SemaphoreType.DMA(())),
        interpret=True)(X)
    assert int(sem) == X.nbytes


def test_shard_map_over_cpu_devices():
    """Each device's instance of the call runs the generated code on its own shard (over
    as many CPU devices as the test process has, up to 2)."""
    from jax.sharding import PartitionSpec as P

    n = min(2, len(jax.devices()))
    mesh = jax.make_mesh((n,), ("d",))
    x = jax.device_put(jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128),
                       jax.NamedSharding(mesh, P("d")))

    def f(x):
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 3.0),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    with pl.emulate_device("tpu:v5e"):
        out = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P("d")))(x)
    np.testing.assert_array_equal(out, np.asarray(x) * 3)


def test_shard_map_under_a_mesh_in_context_with_type_checks():
    """Under ``jax.set_mesh`` and ``jax_enable_checks``: the call's outputs vary over the
    manual axes of its operands, and the kernel is compiled as one device's program (not
    partitioned over the mesh in context)."""
    from jax.sharding import PartitionSpec as P

    n = min(2, len(jax.devices()))
    mesh = jax.make_mesh((n,), ("x",))
    with jax.set_mesh(mesh), jax.enable_checks(True), pl.emulate_device("tpu:v5e"):
        x = jnp.arange(n * 8 * 128, dtype=jnp.float32).reshape(n * 8, 128)
        x = jax.device_put(x, jax.NamedSharding(mesh, P("x")))

        @jax.jit
        @jax.shard_map(mesh=mesh, out_specs=P("x"))
        def inner(x):
            return pl.pallas_call(lambda x_ref, y_ref: y_ref.__setitem__(..., x_ref[...] + 1),
                                  out_shape=jax.typeof(x))(x)

        y = inner(x)
        assert jax.typeof(y) == jax.typeof(x)
    np.testing.assert_array_equal(y, np.asarray(x) + 1)


def test_kernels_differing_only_in_an_index_map_are_not_confused():
    """The emulated path caches a kernel per structure; the index maps are part of it."""
    x = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(32, 128)

    def call(index_map):
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                              out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                              grid=(1,), in_specs=[pl.BlockSpec((8, 128), index_map)],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))(x)

    with pl.emulate_device("tpu:v5e"):
        first, last = call(lambda i: (i, 0)), call(lambda i: (i + 3, 0))
    np.testing.assert_array_equal(first, x[:8])
    np.testing.assert_array_equal(last, x[24:])


def test_poisoned_scratch_reads_nan_int_min_and_true():
    """Under poison_buffers (ours or JAX's flag, as upstream's tests set it) the lowering
    stores poison into buffers a kernel allocates; libtpu compiles it, the executor runs
    it."""
    def kernel(f_ref, i_ref, b_ref):
        f = jax.empty_ref(jax.ShapeDtypeStruct((8, 128), jnp.float32))
        b = jax.empty_ref(jax.ShapeDtypeStruct((8, 128), jnp.bool_))
        f_ref[...] = f[...]
        b_ref[...] = b[...]
        pl.run_scoped(lambda s: i_ref.__setitem__(..., s[...]),
                      pltpu.VMEM((8, 128), jnp.int32))

    shapes = (jax.ShapeDtypeStruct((8, 128), jnp.float32),
              jax.ShapeDtypeStruct((8, 128), jnp.int32),
              jax.ShapeDtypeStruct((8, 128), jnp.bool_))
    jax.config.update("jax_pallas_poison_buffers", True)
    try:
        with pl.emulate_device("tpu:v5e"):
            f, i, b = pl.pallas_call(kernel, out_shape=shapes)()
    finally:
        jax.config.update("jax_pallas_poison_buffers", False)
    assert np.isnan(f).all() and (i == -(1 << 31)).all() and b.all()


def test_transcendentals_and_matmuls_agree_bit_for_bit_with_xla_on_the_host():
    """As a TPU kernel's tanh agrees with XLA:TPU's, an emulated one agrees with the
    host's XLA (upstream's tests compare exactly)."""
    x = jax.random.normal(jax.random.key(0), (8, 128), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (128, 128), jnp.float32)

    def kernel(x_ref, w_ref, t_ref, e_ref, m_ref):
        t_ref[...] = jnp.tanh(x_ref[...])
        e_ref[...] = jnp.exp(x_ref[...]) + jax.lax.erf(x_ref[...])
        m_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    shape = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    with pl.emulate_device("tpu:v5e"):
        t, e, m = pl.pallas_call(kernel, out_shape=(shape,) * 3)(x, w)
    np.testing.assert_array_equal(t, jnp.tanh(x))
    np.testing.assert_array_equal(e, jnp.exp(x) + jax.lax.erf(x))
    np.testing.assert_array_equal(m, jnp.dot(x, w, precision="highest"))


def _copy_rows_of_runtime_count(start, count, data, array, interpret=False):
    def kernel(start_ref, count_ref, data_ref, _, out_ref, sem):
        n = count_ref[0]
        pltpu.async_copy(data_ref.at[pl.ds(0, n)], out_ref.at[pl.ds(start_ref[0], n)],
                         sem).wait()

    return pl.pallas_call(
        kernel, out_shape=array,
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)] * 2
        + [pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA], input_output_aliases={3: 0},
        interpret=interpret,
    )(start, count, data, array)


def test_a_dma_of_a_size_known_only_at_run_time(lower_tpu):
    """pl.ds(start, n) with a traced n: a memref of dynamic size, compiled by libtpu."""
    array, data = jnp.zeros((64, 128), jnp.int32), jnp.ones((8, 128), jnp.int32)
    start, count = jnp.array([3], jnp.int32), jnp.array([5], jnp.int32)
    _, (m,) = lower_tpu(_copy_rows_of_runtime_count, start, count, data, array)
    assert "memref<?x128xi32" in str(m)
    with pl.emulate_device("tpu:v5e"):
        out = _copy_rows_of_runtime_count(start, count, data, array)
    np.testing.assert_array_equal(out, array.at[3:8].set(1))
    # The interpreters (the core's and TPU interpret mode) copy it on whole dims.
    for interpret in (True, pltpu.InterpretParams()):
        out = _copy_rows_of_runtime_count(start, count, data, array, interpret=interpret)
        np.testing.assert_array_equal(out, array.at[3:8].set(1))


def test_a_ref_bitcast_chain_through_float16_keeps_the_bits(lower_tpu):
    """A float16 view made by ref.bitcast holds float16's bits (as int16): a chain of
    views through it reaches the right int32 elements; loading it is refused."""
    def kernel(x_ref, y_ref):
        ref = (x_ref.at[:16, :256].bitcast(jnp.int16).reshape((2, 16, 256))
               .bitcast(jnp.float16).at[1:].reshape((16, 256)).at[:, :128]
               .bitcast(jnp.int32))
        y_ref[...] = ref[...]

    x = jnp.arange(32 * 256, dtype=jnp.int32).reshape(32, 256)
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32))
    with pl.emulate_device("tpu:v5e"):
        np.testing.assert_array_equal(f(x), x[8:16, :128])

    def load_f16(x_ref, y_ref):
        y_ref[...] = x_ref.bitcast(jnp.float16)[...].astype(jnp.float32)

    g = pl.pallas_call(load_f16, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32))
    with pytest.raises(Exception, match="a load of a float16 view made by ref.bitcast"):
        lower_tpu(g, jnp.zeros((16, 128), jnp.int16))


def test_an_async_copy_waited_for_by_the_next_kernel(async_copy_across_calls):
    # Regression: the DMA semaphore passed between the two pallas_calls was typed as a
    # regular semaphore (tpu.wait_dma2 did not verify), and the executor refused a DMA
    # still in flight at the end of the first kernel.
    x = jax.random.normal(jax.random.key(0), (8, 128), jnp.float32)
    with pl.emulate_device("tpu:v5e"):
        y = jax.jit(async_copy_across_calls)(x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    done = [k for k in _kernel_for("_copy_done") if k.device.spec == "tpu:v5e"][-1]
    b = pallas.plugins.get_backend("mosaic_tpu")
    if "compile" in b.levels:  # alone, libtpu would get the semaphore from HBM
        assert done.compiled is None and "semaphores from another kernel" in \
            done.compile_skipped


def test_a_kernel_without_inputs_is_compiled_for_the_chip():
    # Regression: libtpu compiled the parameterless program for the host and refused
    # the tpu_custom_call ("No registered implementation ... for Host").
    def _no_inputs(o_ref):
        o_ref[...] = jnp.full(o_ref.shape, 2.0, o_ref.dtype)

    call = pl.pallas_call(_no_inputs, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    with pl.emulate_device("tpu:v5e"):
        y = call()
    np.testing.assert_array_equal(np.asarray(y), np.full((8, 128), 2.0, np.float32))
    k = [k for k in _kernel_for("_no_inputs") if k.device.spec == "tpu:v5e"][-1]
    if "compile" in pallas.plugins.get_backend("mosaic_tpu").levels:
        assert k.compiled is not None, k.compile_skipped


def test_an_array_of_scoped_semaphores():
    # Regression: the executor allocated every semaphore as one 0-d count, so indexing
    # an array of them (sems.at[r, c]) failed.
    def _read_sems(y_ref):
        def body(sems):
            for r in range(2):
                for c in range(3):
                    pl.semaphore_signal(sems.at[r, c], r * 3 + c)
                    y_ref[r, c] = pl.semaphore_read(sems.at[r, c])
                    pl.semaphore_wait(sems.at[r, c], r * 3 + c)

        pl.run_scoped(body, pltpu.SemaphoreType.REGULAR((2, 3)))

    call = pl.pallas_call(_read_sems, out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
                          out_shape=jax.ShapeDtypeStruct((2, 3), jnp.int32))
    with pl.emulate_device("tpu:v5e"):
        y = call()
    np.testing.assert_array_equal(np.asarray(y), np.arange(6, dtype=np.int32).reshape(2, 3))


def test_a_bool_scalar_in_smem():
    # Regression: refused at trace time ("SMEM holds 32-bit values"); bools are stored
    # as int32, as in VMEM (upstream's PallasCallTPUBooleanTest).
    def _negate(x_ref, o_ref):
        o_ref[0] = jnp.logical_not(x_ref[0])

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    call = pl.pallas_call(_negate, in_specs=[smem], out_specs=smem,
                          out_shape=jax.ShapeDtypeStruct((1,), jnp.bool_))
    with pl.emulate_device("tpu:v5e"):
        y = call(jnp.array([True]))
    assert y.dtype == jnp.bool_ and not bool(y[0])


def test_int4_and_float8_operands():
    # Regression: int4/uint4 operands were refused at trace time ("sub-byte types are not
    # supported") and bf16/fp8 SMEM operands too ("SMEM holds 32-bit values"); the
    # executor knew neither i4 nor the f8 types. libtpu compiles these kernels.
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)

    def _widen(x_ref, o_ref):
        o_ref[0] = x_ref[x_ref[1].astype(jnp.int32)].astype(o_ref.dtype)

    def _select(c_ref, x_ref, o_ref):
        o_ref[...] = jnp.where(c_ref[...], x_ref[...], 0)

    c = (jnp.arange(8 * 128) % 3 == 0).reshape(8, 128)
    with pl.emulate_device("tpu:v5e"):
        for dt, vals in ((jnp.int4, [-8, 0, -1]), (jnp.uint4, [15, 2, 9]),
                         (jnp.float8_e4m3fn, [1.5, 0.0, -3.0]), (jnp.bfloat16, [2, 2, 7])):
            x = jnp.asarray(vals, dt)
            y = pl.pallas_call(_widen, in_specs=[smem], out_specs=smem,
                               out_shape=jax.ShapeDtypeStruct((1,), jnp.float32))(x)
            assert float(y[0]) == float(x[int(x[1].astype(jnp.int32))]), dt
        for dt in (jnp.int4, jnp.uint4):
            x = jnp.arange(8 * 128).reshape(8, 128).astype(dt)
            z = pl.pallas_call(_select, out_shape=jax.ShapeDtypeStruct(x.shape, dt))(c, x)
            np.testing.assert_array_equal(np.asarray(z), np.asarray(jnp.where(c, x, 0)))


def test_int4_arithmetic_is_refused_by_mosaic():
    # Mosaic does no arithmetic on i4 (as on the chip): with libtpu installed the call
    # raises its MosaicError, as upstream's PallasScalarIOpsTest expects.
    if "compile" not in pallas.plugins.get_backend("mosaic_tpu").levels:
        pytest.skip("libtpu is not installed")

    def _add(x_ref, o_ref):
        o_ref[0] = x_ref[0] + x_ref[1]

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    x = jnp.asarray([3, 2], jnp.int4)
    with pl.emulate_device("tpu:v5e"), \
            pytest.raises(pltpu.errors.MosaicError, match="Only i32 arith.addi"):
        pl.pallas_call(_add, in_specs=[smem], out_specs=smem,
                       out_shape=jax.ShapeDtypeStruct((2,), jnp.int4))(x)


def test_unsigned_scalar_max_and_min():
    # Scalars lower to arith.maxui/minui (test_lowering), which libtpu compiles in i32;
    # values above 2**31 compare unsigned.
    def _max_min(x_ref, o_ref):
        o_ref[0] = jnp.maximum(x_ref[0], x_ref[1])
        o_ref[1] = jnp.minimum(x_ref[0], x_ref[1])

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    x = jnp.asarray([3_000_000_000, 5], jnp.uint32)
    with pl.emulate_device("tpu:v5e"):
        y = pl.pallas_call(_max_min, in_specs=[smem], out_specs=smem,
                           out_shape=jax.ShapeDtypeStruct((2,), jnp.uint32))(x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray([3_000_000_000, 5], np.uint32))


def _halves(x):
    """(m, n) int32 as the (2m, n) int16 a TPU bitcast reads: row 2i holds the low halves
    of row i, row 2i + 1 the high ones."""
    x = np.asarray(x).astype(np.int64)
    lo, hi = (x & 0xFFFF).astype(np.uint16), ((x >> 16) & 0xFFFF).astype(np.uint16)
    return np.stack([lo, hi], axis=1).reshape(2 * x.shape[0], x.shape[1]).view(np.int16)


def test_loads_stores_and_dmas_through_bitcast_refs():
    # Regression: the executor did not implement tpu.memref_bitcast (10 of upstream's
    # PallasCallRefTransformTest on the emulated v5e); no numpy view packs along rows.
    def _through_bitcasts(x_ref, h_ref, o_ref, d_hbm):
        h_ref[...] = x_ref.at[:8].bitcast(jnp.int16)[...]  # slice, then bitcast
        o_ref.bitcast(jnp.int16).at[8:16][...] = x_ref.bitcast(jnp.int16)[8:16]
        o_ref.bitcast(jnp.int16).at[:8][...] = x_ref.bitcast(jnp.int16)[:8]
        o_ref.bitcast(jnp.int16).at[16:][...] = x_ref.bitcast(jnp.int16)[16:]

        def body(sem):
            pltpu.async_copy(x_ref.bitcast(jnp.int16).at[4:20], d_hbm, sem).wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA)

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(-2**31, 2**31, size=(16, 128)), jnp.int32)
    call = pl.pallas_call(
        _through_bitcasts,
        out_specs=[pl.BlockSpec(), pl.BlockSpec(), pl.BlockSpec(memory_space=pl.ANY)],
        out_shape=[jax.ShapeDtypeStruct((16, 128), jnp.int16),
                   jax.ShapeDtypeStruct((16, 128), jnp.int32),
                   jax.ShapeDtypeStruct((16, 128), jnp.int16)])
    with pl.emulate_device("tpu:v5e"):
        h, o, d = call(x)
    np.testing.assert_array_equal(np.asarray(h), _halves(x[:8]))
    np.testing.assert_array_equal(np.asarray(o), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(d), _halves(x)[4:20])


def test_scratch_from_jax_empty_ref():
    # Regression: jax.empty_ref in a kernel was refused ("cannot lower to Mosaic TPU
    # yet"); it is a scratch allocation, as a run_scoped buffer.
    def _column_writes(x_ref, o_ref):
        s_ref = jax.empty_ref(jax.ShapeDtypeStruct((8, 4), jnp.int32), memory_space=pltpu.VMEM)
        for i in range(4):
            s_ref[:, i] = x_ref[...] + i
        o_ref[...] = s_ref[...]

    call = pl.pallas_call(_column_writes, out_shape=jax.ShapeDtypeStruct((8, 4), jnp.int32))
    with pl.emulate_device("tpu:v5e"):
        y = call(jnp.arange(8, dtype=jnp.int32))
    np.testing.assert_array_equal(np.asarray(y), np.arange(8)[:, None] + np.arange(4)[None])


def test_named_scopes_run_and_debug_prints_the_module(capsys):
    # tpu.trace_start/stop (jax.named_scope) are profiler marks: the executor runs past
    # them. debug=True prints the Mosaic module once (not again for libtpu's compile).
    def _scoped(o_ref):
        with jax.named_scope("fill"):
            o_ref[...] = jnp.full(o_ref.shape, 3.0, o_ref.dtype)

    call = pl.pallas_call(_scoped, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          debug=True)
    with pl.emulate_device("tpu:v5e"):
        y = call()
    np.testing.assert_array_equal(np.asarray(y), np.full((8, 128), 3.0, np.float32))
    printed = capsys.readouterr().out
    assert printed.count("The Mosaic module for pallas_call") == 1
    assert printed.count("tpu.trace_start") == 1
