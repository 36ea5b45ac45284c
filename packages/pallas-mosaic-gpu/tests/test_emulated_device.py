"""An emulated Hopper (``pl.emulate_device("cuda:sm_90a")``): a plain ``pallas_call`` on
the CPU is chosen for Mosaic GPU as upstream 0.10.2 chooses (``jax_pallas_use_mosaic_gpu``),
compiled by ptxas where the toolchain is installed, and run by the Mosaic GPU executor.
A fault planted in the Mosaic GPU lowering shows that this path is the one being run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
from pallas_mosaic_gpu._src.lowering.engine import RULES

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
Y = jnp.full((8, 128), 3.0, jnp.float32)


def _sub(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] - y_ref[...]


def _call(x, y):
    return pl.pallas_call(_sub, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


def _last(name):
    return [k for k in pallas.plugins.emulated_kernels()
            if k.name.startswith(name) and k.device.spec == "cuda:sm_90a"][-1]


def test_mosaic_gpu_runs_the_kernel_and_ptxas_compiles_it():
    with pl.emulate_device("cuda:sm_90a"):
        got = _call(X, Y)
    np.testing.assert_array_equal(got, np.asarray(X - Y))
    k = _last("_sub")
    assert k.backend == "mosaic_gpu"
    b = pallas.plugins.get_backend("mosaic_gpu")
    if "compile" in b.levels:  # ptxas installed: the real compiler ran for sm_90a
        assert k.compiled.target == "sm_90a" and k.compiled.registers > 0
    else:
        assert "no compile level" in k.compile_skipped


def test_a_fault_planted_in_the_mosaic_gpu_lowering_fails_the_emulated_run():
    add_rule = RULES[jax.lax.add_p]
    with RULES.overridden(jax.lax.sub_p, lambda _base: add_rule):
        with pl.emulate_device("cuda:sm_90a"):
            got = np.asarray(pl.pallas_call(
                lambda x, y, o: o.__setitem__(..., x[...] - y[...] * 1.0),
                out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype))(X, Y))
    np.testing.assert_array_equal(got, np.asarray(X + Y))  # the planted add ran


def test_the_backend_is_chosen_as_upstream_chooses():
    from pallas.plugins import emulated_backend as backend_for
    from pallas.plugins import emulated_device

    with pl.emulate_device("cuda:sm_90a"):
        dev = emulated_device()
        assert backend_for(dev).name == "mosaic_gpu"
        assert backend_for(dev, "triton", None).name == "triton"
        with _flag(False):
            assert backend_for(dev, None, None).name == "triton"
    with pl.emulate_device("cuda:sm_80"):
        dev = emulated_device()
        assert backend_for(dev, None, None).name == "triton"  # Mosaic GPU needs sm_90a+
        with pytest.raises(ValueError, match="Mosaic GPU compiles for"):
            backend_for(dev, "mosaic_gpu", None)
    with pl.emulate_device("tpu:v5e"), pytest.raises(ValueError, match="does not run on"):
        backend_for(emulated_device(), "mosaic_gpu", None)


class _flag:
    def __init__(self, value):
        self.value = value

    def __enter__(self):
        self.old = jax.config.jax_pallas_use_mosaic_gpu
        jax.config.update("jax_pallas_use_mosaic_gpu", self.value)

    def __exit__(self, *exc):
        jax.config.update("jax_pallas_use_mosaic_gpu", self.old)


def test_kernels_with_global_semaphores_compile_and_run():
    """A kernel whose semaphores live in GMEM (``pl.get_global``, a semaphore in a
    ``plgpu.kernel``'s scratch) takes Mosaic GPU's zeroed in/out semaphore buffer after
    its inputs: the compile step and the executor pass it (they raised 'Invalid argument
    structure' for the missing buffer)."""
    import pallas_mosaic_gpu as plgpu

    def body(o_ref):
        sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
        block = jax.lax.axis_index("x")

        @pl.when(block == 0)
        def _():
            pl.semaphore_signal(sem)

        @pl.when(block == 1)
        def _():
            pl.semaphore_wait(sem)
            o_ref[...] = jnp.ones_like(o_ref)

    def scratch_body(x_ref, o_ref, sem_ref):
        pl.semaphore_signal(sem_ref)
        o_ref[...] = x_ref[...] + 1.0
        pl.semaphore_wait(sem_ref)

    out = jax.ShapeDtypeStruct((128,), jnp.float32)
    with pl.emulate_device("cuda:sm_90a"):
        got = plgpu.kernel(body, out_type=out, grid=(3,), grid_names=("x",))()
        x = jnp.arange(128, dtype=jnp.float32)
        got2 = plgpu.kernel(scratch_body, out_type=out, grid=(2,), grid_names=("x",),
                            scratch_types=[plgpu.SemaphoreType.REGULAR])(x)
    np.testing.assert_array_equal(got, np.ones(128, np.float32))
    np.testing.assert_array_equal(got2, np.asarray(x) + 1.0)
    k = _last("body")
    assert k.backend == "mosaic_gpu" and not k.compile_skipped.startswith("backend")


def test_a_wait_on_a_semaphore_only_a_later_block_signals_is_a_named_deadlock():
    """The executor runs the grid's blocks one after another: block 0 waiting for block
    1's signal cannot complete, and the run stops naming the semaphore wait (rather
    than spinning forever)."""
    import pallas_mosaic_gpu as plgpu

    def body(o_ref):
        sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
        block = jax.lax.axis_index("x")

        @pl.when(block == 1)
        def _():
            pl.semaphore_signal(sem)

        @pl.when(block == 0)
        def _():
            pl.semaphore_wait(sem)
            o_ref[...] = jnp.ones_like(o_ref)

    out = jax.ShapeDtypeStruct((128,), jnp.float32)
    with pl.emulate_device("cuda:sm_90a"), pytest.raises(Exception, match="global semaphore"):
        jax.block_until_ready(plgpu.kernel(body, out_type=out, grid=(2,), grid_names=("x",))())


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32])
@pytest.mark.parametrize("tiled", [False, True])
def test_atomic_adds_of_two_warpgroups_into_smem_lower_and_run(dtype, tiled):
    """``plgpu.atomic_add(smem_ref, array)`` lowers to Mosaic GPU's atomic stores (``red``
    per register; it was 'cannot lower the primitive atomic_rmw'), compiles, and the
    executor combines both warpgroups' arrays (as upstream's test_atomic_add)."""
    import pallas_mosaic_gpu as plgpu

    m, n = 128, 64
    layout = plgpu.Layout.WGMMA if tiled else None
    transforms = (plgpu.TilingTransform((8, 16)), plgpu.SwizzleTransform(64)) if tiled else ()

    def body(inp_ref, out_ref, smem_ref, barrier):
        wg = jax.lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            zeros = jnp.zeros_like(smem_ref)
            smem_ref[...] = plgpu.layout_cast(zeros, layout) if tiled else zeros

        plgpu.barrier_arrive(barrier)
        plgpu.barrier_wait(barrier)
        plgpu.atomic_add(smem_ref, plgpu.load(inp_ref, pl.ds(wg * m, m), layout=layout,
                                              optimized=False))
        plgpu.barrier_arrive(barrier)
        plgpu.barrier_wait(barrier)

        @pl.when(wg == 0)
        def _():
            out_ref[...] = smem_ref[...]

    x = jnp.arange(1, m * n + 1, dtype=dtype).reshape(m, n)
    y = jnp.arange(m * n, 0, -1, dtype=dtype).reshape(m, n)
    with pl.emulate_device("cuda:sm_90a"):
        got = plgpu.kernel(
            body, out_type=jax.ShapeDtypeStruct((m, n), dtype), num_threads=2,
            thread_name="wg",
            scratch_types=[plgpu.SMEM((m, n), dtype, transforms=transforms),
                           plgpu.Barrier(num_arrivals=2)])(jnp.concatenate([x, y]))
    np.testing.assert_array_equal(got, np.asarray(x + y))


def test_inline_mgpu_lowers_runs_and_is_refused_by_the_interpreter():
    """``plgpu.inline_mgpu`` (raw Mosaic GPU code: a splat, the CUDA block id, an array
    argument in a layout) runs in the Mosaic GPU lowering on an emulated device; it
    raised 'its lowering is not implemented yet'. The interpreter still refuses it."""
    from jax.experimental.mosaic import gpu as mgpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, gpu

    import pallas_mosaic_gpu as plgpu

    shape = (128,)

    @plgpu.inline_mgpu(return_type=plgpu.ShapeDtypeStruct(
        shape, jnp.float32, layout=plgpu.Layout.WG_SPLAT(shape)))
    def full(_):
        return mgpu.FragmentedArray.splat(mgpu.c(2.5, ir.F32Type.get()), shape)

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WG_STRIDED(shape, vec_size=1),),
                       return_type=plgpu.ShapeDtypeStruct(
                           shape, jnp.float32, layout=plgpu.Layout.WG_STRIDED(shape, vec_size=1)))
    def plus_block(_, x):
        bid = arith.index_cast(ir.IntegerType.get_signless(32),
                               gpu.block_id(gpu.Dimension.x))
        b = arith.uitofp(ir.F32Type.get(), bid)
        return x + mgpu.FragmentedArray.splat(b, shape)

    def body(x_ref, o_ref):
        i = jax.lax.axis_index("x")
        o_ref[i] = plus_block(x_ref[i] + full())

    x = jnp.arange(256, dtype=jnp.float32).reshape(2, 128)
    kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 128), jnp.float32),
                          grid=(2,), grid_names=("x",))
    with pl.emulate_device("cuda:sm_90a"):
        got = kernel(x)
    np.testing.assert_array_equal(got, np.asarray(x) + 2.5 + np.arange(2.0)[:, None])
    with pytest.raises(Exception, match="raw Mosaic GPU code"):  # (through a callback)
        plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 128), jnp.float32),
                     grid=(2,), grid_names=("x",), interpret=True)(x)


def test_inline_mgpu_scalar_grid_index_with_layout_to_mgpu():
    """Upstream's linearised CUDA grid index: ``inline_mgpu`` returning a () splat built
    with ``plgpu.Layout.WG_SPLAT.to_mgpu()`` (which raised AttributeError), used as a
    scalar."""
    from jax.experimental.mosaic import gpu as mgpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, gpu

    import pallas_mosaic_gpu as plgpu

    assert plgpu.Layout.WGMMA.to_mgpu() == mgpu.WGMMA_LAYOUT
    assert plgpu.Layout.WGMMA.reduce(1).to_mgpu() == mgpu.WGMMA_ROW_LAYOUT

    @plgpu.inline_mgpu(return_type=plgpu.ShapeDtypeStruct((), jnp.int32,
                                                           layout=plgpu.Layout.WG_SPLAT))
    def block_index(_):
        bid = arith.index_cast(ir.IntegerType.get_signless(32), gpu.block_id(gpu.Dimension.x))
        return mgpu.FragmentedArray.splat(bid, shape=(), layout=plgpu.Layout.WG_SPLAT.to_mgpu(),
                                          is_signed=False)

    def body(o_ref):
        o_ref[jax.lax.axis_index("x")] = jnp.full((128,), block_index())

    kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((3, 128), jnp.int32),
                          grid=(3,), grid_names=("x",))
    with pl.emulate_device("cuda:sm_90a"):
        got = kernel()
    np.testing.assert_array_equal(got, np.repeat(np.arange(3), 128).reshape(3, 128))


@pytest.mark.parametrize("dtype", [jnp.float8_e5m2, jnp.float8_e4m3fn])
def test_float8_blocks_are_copied_by_the_executor(dtype):
    """The executor knows MLIR's float8 types (it raised 'no numpy type for MLIR type
    f8E5M2'): a float8 block loaded and stored comes back bit for bit."""
    x = (jnp.arange(64 * 128, dtype=jnp.float32).reshape(64, 128) % 13 - 6).astype(dtype)

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    with pl.emulate_device("cuda:sm_90a"):
        got = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, dtype))(x)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(x).view(np.uint8))
