"""A ring all-gather across devices with remote DMAs, for TPU.

    python examples/tpu_ring_all_gather.py

Each device holds one shard. At step ``s`` every device sends the shard it received at
step ``s - 1`` (its own at step 0) to its right neighbour with
``pltpu.make_async_remote_copy``; after ``n - 1`` steps every device has every shard.
On CPU the script makes 4 host devices and runs the kernel in TPU interpret mode under
``jax.shard_map`` (remote copies move data between the CPU devices); then it lowers the
same program for TPU.
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import pallas as pl  # noqa: E402
import pallas_tpu as pltpu  # noqa: E402

AXIS = "x"


def all_gather_kernel(x_ref, o_ref, send_sem, recv_sem, *, num_devices):
    me = lax.axis_index(AXIS)
    right = lax.rem(me + 1, num_devices)
    # (Upstream kernels first handshake with both neighbours on
    # pltpu.get_barrier_semaphore(); that is not available in pallas-tpu 0.1 yet. The
    # outputs live in HBM, allocated before the kernel starts, so the copies are safe.)
    pltpu.sync_copy(x_ref, o_ref.at[me])  # our own shard first
    for step in range(num_devices - 1):
        slot = lax.rem(me - step + num_devices, num_devices)
        copy = pltpu.make_async_remote_copy(
            o_ref.at[slot], o_ref.at[slot], send_sem, recv_sem,
            device_id=(right,), device_id_type=pl.DeviceIdType.MESH)
        copy.start()
        copy.wait()


def all_gather(x, mesh, *, interpret=False):
    """``x`` (n * rows, cols) sharded along ``AXIS``; returns (n, n, rows, cols): every
    device's gathered copy."""
    n = mesh.shape[AXIS]
    rows, cols = x.shape[0] // n, x.shape[1]

    def per_device(shard):
        out = pl.pallas_call(
            functools.partial(all_gather_kernel, num_devices=n),
            out_shape=jax.ShapeDtypeStruct((n, rows, cols), x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
            compiler_params=pltpu.CompilerParams(has_side_effects=True),
            interpret=interpret,
        )(shard)
        return out[None]

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS),
                                 out_specs=P(AXIS), check_vma=False))(x)


def main():
    from pallas_tpu.inspect import mosaic_modules, op_names

    n = min(4, jax.device_count())
    mesh = jax.make_mesh((n,), (AXIS,))
    x = jnp.arange(n * 8 * 128, dtype=jnp.float32).reshape(n * 8, 128)
    x = jax.device_put(x, jax.NamedSharding(mesh, P(AXIS)))
    got = np.asarray(all_gather(x, mesh, interpret=True))
    want = np.asarray(x).reshape(n, 8, 128)
    for d in range(n):
        np.testing.assert_array_equal(got[d], want)
    lowered = jax.jit(lambda a: all_gather(a, mesh)).trace(x).lower(
        lowering_platforms=("tpu",))
    (module,) = mosaic_modules(lowered)
    ops = sorted(set(op_names(module)) - {"builtin.module"})
    print(f"tpu_ring_all_gather: {n} devices each gathered every shard in interpret mode; "
          f"lowered for TPU with {ops}")


if __name__ == "__main__":
    main()
