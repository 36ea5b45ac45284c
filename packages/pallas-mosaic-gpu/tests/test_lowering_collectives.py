"""Lowering semaphores and memory shared between devices: ``SemaphoreType`` scratch and
``pl.get_global`` semaphores are words of a zeroed GMEM buffer the kernel takes (and
aliases); inside ``jax.shard_map`` over several devices, ``lax.axis_index`` of a mesh
axis, ``pl.semaphore_signal(..., device_id=...)``, ``plgpu.remote_ref`` TMA stores,
``multimem_store``, ``multimem_load_reduce`` and ``semaphore_signal_multicast`` lower
through Mosaic GPU's collective metadata (the custom call says it uses it). Bad input is
refused at trace time naming the argument; the interpreters run the multimem
primitives on one device and refuse several, naming the primitive."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas_mosaic_gpu as plgpu

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

SDS = jax.ShapeDtypeStruct
P = jax.sharding.PartitionSpec


def _lower(f, *args) -> str:
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_scratch_and_global_semaphores_are_an_aliased_zeroed_buffer():
    """Two blocks: each signals its own scratch semaphore and the launch's global one,
    then waits for both blocks on the global one."""

    def kernel(o_ref, own):
        everyone = pl.get_global(plgpu.SemaphoreType.REGULAR)
        pl.semaphore_signal(own)
        pl.semaphore_signal(everyone)
        pl.semaphore_wait(own)
        pl.semaphore_wait(everyone, 2, decrement=False)
        o_ref[lax.axis_index("b")] = pl.semaphore_read(everyone)

    f = plgpu.kernel(kernel, out_type=SDS((2,), jnp.int32), grid=(2,), grid_names=("b",),
                     scratch_types=[plgpu.SemaphoreType.REGULAR])
    text = _lower(f)
    assert "mosaic_gpu_v2" in text
    # 2 blocks x 1 scratch semaphore + 1 global one, zeroed and passed in and out.
    assert "tensor<3xi32>" in text and "output_operand_aliases" in text


def test_multimem_inputs_are_checked_at_trace_time():
    mesh = jax.make_mesh((1,), ("x",))

    def run(body, out=SDS((256,), jnp.float32)):
        k = plgpu.kernel(body, out_type=out)
        return jax.jit(jax.shard_map(k, mesh=mesh, in_specs=(), out_specs=P(),
                                     check_vma=False)).trace()

    with pytest.raises(ValueError, match=r"multimem_store: source is float32\[128\] but "
                                         r"ref is float32\[256\]"):
        run(lambda o: plgpu.multimem_store(jnp.zeros(128, jnp.float32), o, "x"))
    with pytest.raises(ValueError, match=r"reduction_op='mul'.*'add', 'min', 'max'"):
        run(lambda o: plgpu.multimem_load_reduce(o, collective_axes="x", reduction_op="mul"))
    with pytest.raises(TypeError, match=r"reduction_op='xor'.*integer refs.*float32\[256\]"):
        run(lambda o: plgpu.multimem_load_reduce(o, collective_axes="x", reduction_op="xor"))
    with pytest.raises(ValueError, match=r"collective_axes='y'.*not axes of an enclosing "
                                         "jax.shard_map"):
        run(lambda o: plgpu.multimem_store(jnp.zeros(256, jnp.float32), o, "y"))
    with pytest.raises(TypeError, match="semaphore_signal_multicast: semaphore must be a "
                                        "semaphore ref"):
        run(lambda o: plgpu.semaphore_signal_multicast(o, collective_axes="x"))


def test_on_one_device_multimem_is_the_local_store_load_and_signal_in_interpret_mode():
    mesh = jax.make_mesh((1,), ("x",))

    def body(x_ref, o_ref, sem):
        plgpu.multimem_store(x_ref[...] * 2, o_ref, "x")
        o_ref[...] = plgpu.multimem_load_reduce(o_ref, collective_axes="x",
                                                reduction_op="add") + 1
        plgpu.semaphore_signal_multicast(sem, 3, collective_axes="x")
        pl.semaphore_wait(sem, 3)

    x = jnp.arange(256, dtype=jnp.float32)
    for interpret in (True, plgpu.InterpretParams()):
        k = plgpu.kernel(body, out_type=SDS((256,), jnp.float32),
                         scratch_types=[plgpu.SemaphoreType.REGULAR], interpret=interpret)
        f = jax.jit(jax.shard_map(k, mesh=mesh, in_specs=P(), out_specs=P(),
                                  check_vma=False))
        np.testing.assert_array_equal(f(x), x * 2 + 1)


_DEVICES = textwrap.dedent('''
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    import pallas as pl
    import pallas_mosaic_gpu as plgpu

    SDS, P = jax.ShapeDtypeStruct, jax.sharding.PartitionSpec
    mesh = jax.make_mesh((2,), ("x",))
    x = jax.ShapeDtypeStruct((512, 64), jnp.float32,
                             sharding=jax.sharding.NamedSharding(mesh, P("x")))

    def lower(kernel, out, interpret=False, **kw):
        k = plgpu.kernel(kernel, out_type=out, interpret=interpret, **kw)
        f = jax.shard_map(k, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                          check_vma=False)
        return jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()

    def gather(x_ref, y_ref, done):
        """Each device stores its rows into every device's output, then waits for all."""
        me = lax.axis_index("x")
        rows = y_ref.reshape((2, 256, 64)).at[me]
        plgpu.multimem_store(plgpu.layout_cast(x_ref[...], plgpu.Layout.WG_STRIDED(
            (256, 64), vec_size=4)), rows, "x")
        plgpu.semaphore_signal_multicast(done, collective_axes="x")
        pl.semaphore_wait(done, 2, decrement=False)

    text = lower(gather, SDS((512, 64), jnp.float32),
                 scratch_types=[plgpu.SemaphoreType.REGULAR])
    assert "mosaic_gpu_v2" in text and "uses_xla_collective_metadata = true" in text, text
    assert "multimem_parameters" in text, text
    print("ok gather")

    def reduce(x_ref, y_ref):
        """Each device reads its half of the input summed over devices."""
        me = lax.axis_index("x")
        y_ref[...] = plgpu.multimem_load_reduce(
            x_ref.reshape((2, 128, 64)).at[me], collective_axes="x", reduction_op="add")

    assert "uses_xla_collective_metadata = true" in lower(reduce, SDS((128, 64), jnp.float32))
    print("ok reduce")

    def ring(x_ref, y_ref, sem):
        """A remote semaphore signal to the next device, and a TMA store into its output."""
        right = lax.rem(lax.axis_index("x") + 1, 2)

        def body(smem):
            smem[...] = x_ref[pl.ds(0, 64), :]
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(smem, plgpu.remote_ref(y_ref, right).at[pl.ds(0, 64)])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(body, plgpu.SMEM((64, 64), jnp.float32))
        pl.semaphore_signal(sem, device_id=right)
        pl.semaphore_wait(sem)

    assert "uses_xla_collective_metadata = true" in lower(
        ring, SDS((256, 64), jnp.float32), scratch_types=[plgpu.SemaphoreType.REGULAR])
    print("ok ring")

    def swap_halves(x_ref, y_ref, ready, done):
        """Stores and loads through plgpu.remote_ref: each device writes its rows into
        the other's output, then reads them back from there."""
        other = 1 - lax.axis_index("x")
        y_ref[...] = jnp.zeros_like(y_ref)
        pl.semaphore_signal(ready, device_id=other)
        pl.semaphore_wait(ready)
        plgpu.remote_ref(y_ref, {"x": other})[...] = x_ref[...] + 1.0  # by mesh axis
        pl.semaphore_signal(done, device_id=other)
        pl.semaphore_wait(done)
        y_ref[...] = y_ref[...] + plgpu.remote_ref(y_ref, other)[...] * 0.0

    sems = [plgpu.SemaphoreType.REGULAR, plgpu.SemaphoreType.REGULAR]
    assert "uses_xla_collective_metadata = true" in lower(
        swap_halves, SDS((256, 64), jnp.float32), scratch_types=sems)
    data = jax.device_put(jnp.arange(512 * 64, dtype=jnp.float32).reshape(512, 64),
                          jax.sharding.NamedSharding(mesh, P("x")))
    k = plgpu.kernel(swap_halves, out_type=SDS((256, 64), jnp.float32), scratch_types=sems)
    f = jax.jit(jax.shard_map(k, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    with pl.emulate_device("cuda:sm_90a"):
        got = f(data)
    host = np.asarray(data)
    want = np.concatenate([host[256:], host[:256]]) + 1.0
    np.testing.assert_array_equal(np.asarray(got), want)
    import pallas.plugins
    [emulated] = [e for e in pallas.plugins.emulated_kernels() if "swap_halves" in e.name]
    assert "interpret mode" in emulated.executor, emulated.executor
    print("ok remote_ref")

''')


def test_on_two_devices_multimem_remote_signals_and_stores_use_collective_metadata():
    """Runs in a subprocess: the device count must be set before JAX starts. Also:
    loads and stores through ``plgpu.remote_ref`` lower (they were refused as an unknown
    ref transform), and on the emulated device run in Mosaic GPU's interpret mode."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, "-c", _DEVICES], env=env, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for line in ("ok gather", "ok reduce", "ok ring", "ok remote_ref"):
        assert line in proc.stdout, out


_COORDINATES = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    import pallas as pl
    import pallas_mosaic_gpu as plgpu

    SDS, P = jax.ShapeDtypeStruct, jax.sharding.PartitionSpec
    mesh = jax.make_mesh((1, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)

    def swap(ids):
        def kernel(x_ref, y_ref, ready, done):
            other = 1 - lax.axis_index("y")
            pl.semaphore_signal(ready, device_id=ids(0, other))
            pl.semaphore_wait(ready)
            plgpu.remote_ref(y_ref, ids(0, other))[...] = x_ref[...] + 1.0
            pl.semaphore_signal(done, device_id=ids(0, other))
            pl.semaphore_wait(done)

        k = plgpu.kernel(kernel, out_type=SDS((128, 64), jnp.float32),
                         scratch_types=[plgpu.SemaphoreType.REGULAR] * 2)
        return jax.jit(jax.shard_map(k, mesh=mesh, in_specs=P("y"), out_specs=P("y"),
                                     check_vma=False))

    x = jnp.arange(256 * 64, dtype=jnp.float32).reshape(256, 64)
    want = np.concatenate([np.asarray(x)[128:], np.asarray(x)[:128]]) + 1.0
    with pl.emulate_device("cuda:sm_90a"):
        by_tuple = swap(lambda a, b: (a, b))(x)
        by_dict = swap(lambda a, b: {"x": a, "y": b})(x)
    np.testing.assert_array_equal(np.asarray(by_tuple), want)
    np.testing.assert_array_equal(np.asarray(by_dict), want)
    try:
        swap(lambda a, b: (a, b, 0))(x)
    except Exception as e:
        assert "device_id has 3 indices for the mesh" in str(e), e
    else:
        raise AssertionError("three coordinates on a mesh of two axes were accepted")
    print("ok coordinates")
''')


def test_a_device_id_tuple_gives_the_mesh_coordinates_of_the_device():
    """On a mesh of several axes, ``device_id=(i, j)`` (``plgpu.remote_ref``, semaphore
    signals) names the device at those mesh coordinates, as ``{"x": i, "y": j}`` does;
    it was refused ("give a dict"). A tuple of the wrong length names the mesh."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, "-c", _COORDINATES], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok coordinates" in proc.stdout, proc.stdout + proc.stderr
