"""GPU interpret mode over several devices: under ``jax.shard_map``, each device's
kernel (its own host callback) shares memory with the others: ``plgpu.remote_ref``
reads and writes another device's buffers (a TMA store through ``plgpu.multicast_ref``
every device's), ``pl.semaphore_signal(device_id=...)``
signals its semaphores, ``multimem_store``/``multimem_load_reduce`` reach every
device along the collective axes; a wait nobody will satisfy is a deadlock error.

The checks run in one subprocess over 4 CPU devices (the device count must be set
before JAX starts)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu

_SCRIPT = textwrap.dedent('''
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    import pallas as pl
    import pallas_mosaic_gpu as plgpu
    from pallas_mosaic_gpu import interpret as gpu_interpret

    P, SDS = jax.sharding.PartitionSpec, jax.ShapeDtypeStruct
    N = 4
    mesh = jax.make_mesh((N,), ("x",))
    IP = plgpu.InterpretParams(detect_races=True)
    x = jax.device_put(jnp.arange(N * 8 * 128, dtype=jnp.float32).reshape(N * 8, 128),
                       jax.sharding.NamedSharding(mesh, P("x")))
    xs = np.asarray(x).reshape(N, 8, 128)

    def run(kernel, out_type, *args, scratch=(), params=IP, **kw):
        k = plgpu.kernel(kernel, out_type=out_type, scratch_types=list(scratch),
                         interpret=params, **kw)
        return jax.jit(jax.shard_map(k, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                     check_vma=False))(*args)

    def ring(x_ref, y_ref, sem):
        """Each device stores its rows into the next device's output (a TMA store
        through remote_ref), then signals that device's semaphore."""
        right = lax.rem(lax.axis_index("x") + 1, N)

        def body(smem):
            smem[...] = x_ref[...] * 10
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(smem, plgpu.remote_ref(y_ref, right))
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(body, plgpu.SMEM((8, 128), jnp.float32))
        pl.semaphore_signal(sem, device_id=right)
        pl.semaphore_wait(sem)
        y_ref[0, 0] = y_ref[0, 0] + 1  # after the wait: the peer's store happened before

    y = run(ring, SDS((8, 128), jnp.float32), x, scratch=[plgpu.SemaphoreType.REGULAR])
    want = np.roll(xs * 10, 1, axis=0)
    want[:, 0, 0] += 1
    np.testing.assert_array_equal(np.asarray(y).reshape(N, 8, 128), want)
    assert not gpu_interpret.get_races().races_found, gpu_interpret.get_races()
    print("ok remote copy", flush=True)

    def ping_pong(o_ref, sem):
        """Devices 2k and 2k+1 bounce a counter 5 times: each reads the peer's output
        through remote_ref after the peer's signal, adds one and writes its own."""
        me = lax.axis_index("x")
        peer = me + 1 - 2 * lax.rem(me, 2)
        o_ref[...] = jnp.zeros((128,), jnp.int32)

        @pl.loop(0, 5)
        def _(i):
            @pl.when(lax.rem(me, 2) == 0)
            def _():
                @pl.when(i > 0)
                def _():
                    pl.semaphore_wait(sem)
                    o_ref[...] = plgpu.remote_ref(o_ref, peer)[...] + 1
                @pl.when(i == 0)
                def _():
                    o_ref[...] = o_ref[...] + 1
                pl.semaphore_signal(sem, device_id=peer)

            @pl.when(lax.rem(me, 2) == 1)
            def _():
                pl.semaphore_wait(sem)
                o_ref[...] = plgpu.remote_ref(o_ref, peer)[...] + 1
                pl.semaphore_signal(sem, device_id={"x": peer})

        @pl.when(lax.rem(me, 2) == 0)
        def _():
            pl.semaphore_wait(sem)  # the last pong

    y = run(ping_pong, SDS((128,), jnp.int32), scratch=[plgpu.SemaphoreType.REGULAR])
    np.testing.assert_array_equal(np.asarray(y).reshape(N, 128)[:, 0], [9, 10, 9, 10])
    assert not gpu_interpret.get_races().races_found, gpu_interpret.get_races()
    print("ok ping pong", flush=True)

    def multimem(x_ref, g_ref, s_ref, m_ref, done):
        """All-gather by multimem stores, then add- and max-reductions over devices."""
        me = lax.axis_index("x")
        plgpu.multimem_store(x_ref[...], g_ref.reshape((N, 8, 128)).at[me], "x")
        plgpu.semaphore_signal_multicast(done, collective_axes="x")
        pl.semaphore_wait(done, N, decrement=False)
        s_ref[...] = plgpu.multimem_load_reduce(x_ref, collective_axes="x",
                                                reduction_op="add")
        m_ref[...] = plgpu.multimem_load_reduce(x_ref, collective_axes="x",
                                                reduction_op="max")

    outs = [SDS((N * 8, 128), jnp.float32), SDS((8, 128), jnp.float32),
            SDS((8, 128), jnp.float32)]
    g, s, m = run(multimem, outs, x, scratch=[plgpu.SemaphoreType.REGULAR])
    np.testing.assert_array_equal(np.asarray(g).reshape(N, N * 8, 128),
                                  np.stack([xs.reshape(N * 8, 128)] * N))
    np.testing.assert_array_equal(np.asarray(s).reshape(N, 8, 128),
                                  np.stack([xs.sum(0)] * N))
    np.testing.assert_array_equal(np.asarray(m).reshape(N, 8, 128), np.stack([xs[-1]] * N))
    print("ok multimem", flush=True)

    def multicast(x_ref, g_ref, done):
        """All-gather by TMA stores through plgpu.multicast_ref: each reaches every
        device's output."""
        me = lax.axis_index("x")

        def body(smem):
            smem[...] = x_ref[...]
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(
                smem, plgpu.multicast_ref(g_ref.at[pl.ds(me * 8, 8)], "x"))
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(body, plgpu.SMEM((8, 128), jnp.float32))
        plgpu.semaphore_signal_multicast(done, collective_axes="x")
        pl.semaphore_wait(done, N)
        g_ref[0, 0] = g_ref[0, 0] + 1  # after the wait: every device's store happened

    g = run(multicast, SDS((N * 8, 128), jnp.float32), x,
            scratch=[plgpu.SemaphoreType.REGULAR])
    want = np.stack([xs.reshape(N * 8, 128)] * N)
    want[:, 0, 0] += 1
    np.testing.assert_array_equal(np.asarray(g).reshape(N, N * 8, 128), want)
    assert not gpu_interpret.get_races().races_found, gpu_interpret.get_races()
    print("ok multicast ref", flush=True)

    def unsignalled(o_ref, sem):
        """Device 0 waits for a signal that no device sends."""
        @pl.when(lax.axis_index("x") == 0)
        def _():
            pl.semaphore_wait(sem)
        pl.semaphore_signal(sem, device_id=lax.axis_index("x"))

    try:
        jax.block_until_ready(run(unsignalled, SDS((128,), jnp.float32),
                                  scratch=[plgpu.SemaphoreType.REGULAR]))
        print("no error")
    except Exception as e:
        assert "the kernel deadlocked" in str(e), e
        assert "thread of device 0 (x=0) waits for semaphore" in str(e), e
        print("ok deadlock", flush=True)

    def racy(o_ref):
        """Every device writes device 0's output, unsynchronised."""
        plgpu.remote_ref(o_ref, 0)[...] = jnp.full((128,), 1.0, jnp.float32)

    jax.block_until_ready(run(racy, SDS((128,), jnp.float32)))
    report = gpu_interpret.get_races()
    assert report.races_found and "of device 1" in str(report), report
    print("ok remote race", flush=True)
''')


def test_remote_refs_semaphores_multimem_and_deadlocks_across_four_devices():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr[-5000:]
    assert proc.returncode == 0, out
    for line in ("ok remote copy", "ok ping pong", "ok multimem", "ok multicast ref",
                 "ok deadlock", "ok remote race"):
        assert line in proc.stdout, out


def test_outside_shard_map_device_zero_is_the_device_itself():
    """Without an enclosing mesh there is one device: ``device_id=0`` names it, other
    ids are an error naming the argument."""

    def kernel(o_ref, sem):
        pl.semaphore_signal(sem, 2, device_id=0)
        pl.semaphore_wait(sem, 2)
        plgpu.remote_ref(o_ref, 0)[...] = jnp.full((128,), 3.0, jnp.float32)

    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                     scratch_types=[plgpu.SemaphoreType.REGULAR],
                     interpret=plgpu.InterpretParams())
    np.testing.assert_array_equal(jax.jit(f)(), np.full((128,), 3.0))

    def bad(o_ref, sem):
        pl.semaphore_signal(sem, device_id=1)

    g = plgpu.kernel(bad, out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                     scratch_types=[plgpu.SemaphoreType.REGULAR],
                     interpret=plgpu.InterpretParams())
    with pytest.raises(Exception, match=r"device_id 1 is out of range for the 1 device"):
        jax.block_until_ready(jax.jit(g)())
