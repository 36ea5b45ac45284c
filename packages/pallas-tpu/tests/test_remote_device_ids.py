"""Remote DMAs in the interpreter: devices addressed by mesh coordinates, including a
joint axis (``device_id={("y", "x"): i}``, row-major over those axes, as
``lax.axis_index(("y", "x"))``); and remote copies and signals under a device-dependent
condition (``pl.when(me == 0)``), where the ``cond`` runs predicated (every device runs
every branch, its writes masked) so the copy's collectives are reached by all devices
(it left the other devices waiting until XLA:CPU aborted the process). Runs on four CPU
devices in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_JOINT = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    from jax.sharding import PartitionSpec as P
    import pallas as pl
    import pallas_tpu as pltpu

    def kernel(x_ref, y_ref):
        def body(ready, send, recv):
            me, n = lax.axis_index(("y", "x")), lax.axis_size(("y", "x"))
            device_id = {("y", "x"): lax.rem(me + 1, n)}
            pl.semaphore_signal(ready, device_id=device_id)
            pl.semaphore_wait(ready)
            copy = pltpu.async_remote_copy(x_ref, y_ref, send, recv, device_id=device_id)
            copy.wait_send()
            copy.wait_recv()

        pl.run_scoped(body, pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.DMA,
                      pltpu.SemaphoreType.DMA)

    x = jnp.arange(3 * 8 * 128).reshape(3 * 8, 128)
    call = lambda x: pl.pallas_call(
        kernel, out_shape=x, in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM))(x)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:3]).reshape(1, 3), ["y", "x"])
    y = jax.jit(jax.shard_map(call, mesh=mesh, in_specs=P("x", None),
                              out_specs=P("x", None), check_vma=False))(x)
    np.testing.assert_array_equal(y, jnp.concatenate([x[-8:], x[:-8]]))
    print("ok joint axis")
''')


_UNDER_A_CONDITION = textwrap.dedent('''
    import contextlib, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    from jax.sharding import PartitionSpec as P
    import pallas as pl
    import pallas_tpu as pltpu

    n = 4
    mesh = jax.make_mesh((n,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jnp.arange(n * 8 * 128, dtype=jnp.float32).reshape(n * 8, 128)
    blocks = np.asarray(x).reshape(n, 8, 128)

    def run(kernel, scratch):
        call = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY), scratch_shapes=scratch)
        f = jax.jit(jax.shard_map(call, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                  check_vma=False))
        return np.asarray(f(x)).reshape(n, 8, 128)

    def only_first_sends(x_ref, o_ref, send, recv, local):
        # Device 0 copies its block to device 1 and to itself; device 1 waits for it;
        # devices 2 and 3 write a marker. Nobody else starts a copy.
        me = lax.axis_index("x")
        remote = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": 1})
        own = pltpu.make_async_copy(x_ref, o_ref, local)

        @pl.when(me == 0)
        def _():
            remote.start()
            own.start()
            own.wait()
            remote.wait_send()

        @pl.when(me == 1)
        def _():
            remote.wait_recv()

        @pl.when(me >= 2)
        def _():
            o_ref[...] = jnp.full((8, 128), -1.0, jnp.float32)

    def signal_then_copy(x_ref, o_ref, send, recv, ready):
        # The odd devices tell their even left neighbour they are ready (a remote
        # signal under a condition); the even ones wait, then send it their block.
        me = lax.axis_index("x")
        odd = lax.rem(me, 2) == 1

        @pl.when(odd)
        def _():
            pl.semaphore_signal(ready, device_id={"x": me - 1})

        def send_block():
            pl.semaphore_wait(ready)
            c = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv,
                                             device_id={"x": me + 1})
            c.start()
            c.wait_send()
            return jnp.int32(1)

        def receive_block():
            c = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv,
                                             device_id={"x": me})
            c.wait_recv()
            return jnp.int32(2)

        # A cond with outputs: each device gets the value of the branch it took.
        took = lax.cond(odd, receive_block, send_block)

        @pl.when(took == 1)
        def _():
            o_ref[...] = jnp.zeros((8, 128), jnp.float32)

    dma = pltpu.SemaphoreType.DMA
    for device in (None, "tpu:v5e"):
        scope = lambda: pl.emulate_device(device) if device else contextlib.nullcontext()
        with scope():
            y = run(only_first_sends, [dma, dma, dma])
        np.testing.assert_array_equal(y[0], blocks[0])
        np.testing.assert_array_equal(y[1], blocks[0])
        np.testing.assert_array_equal(y[2:], -1.0)
        with scope():
            y = run(signal_then_copy, [dma, dma, pltpu.SemaphoreType.REGULAR])
        np.testing.assert_array_equal(y[0::2], 0.0)
        np.testing.assert_array_equal(y[1], blocks[0])
        np.testing.assert_array_equal(y[3], blocks[2])
        print("ok", device)
''')



def _run_on_four_devices(program: str, *lines: str) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for line in lines:
        assert line in proc.stdout, out


def test_a_joint_axis_device_id_reaches_the_neighbour():
    """It was ignored (the tuple key matched no axis) and each device copied to itself."""
    _run_on_four_devices(_JOINT, "ok joint axis")


def test_remote_operations_under_a_device_dependent_condition():
    _run_on_four_devices(_UNDER_A_CONDITION, "ok None", "ok tpu:v5e")
