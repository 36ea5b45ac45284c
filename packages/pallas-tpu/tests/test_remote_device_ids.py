"""Remote DMAs in the interpreter address devices by mesh coordinates, including a joint
axis (``device_id={("y", "x"): i}``, row-major over those axes, as
``lax.axis_index(("y", "x"))``). Runs on CPU devices in a subprocess."""

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


def test_a_joint_axis_device_id_reaches_the_neighbour():
    """It was ignored (the tuple key matched no axis) and each device copied to itself."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", _JOINT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok joint axis" in proc.stdout, proc.stdout + proc.stderr
